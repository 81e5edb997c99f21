"""The single-GPU simulated step at full depth, as the per-rank models of a data-parallel job read it: bytes by
category at every segment's peak (phase x region, `simulate.trace`), the stored weights split into the root unit
and the decoder layers, and the step's allocations made whole (for the rank's caching-allocator replay,
`rank_reserve`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tunecost.distributed import expert_parallel
from tunecost.errors import TunecostError
from tunecost.io import atomic_write_json
from tunecost.models.anatomy import layer_pattern
from tunecost.models.catalog import ModelSpec, resolve_model
from tunecost.simulate import cache
from tunecost.simulate.behaviour import DEFAULT_BEHAVIOUR
from tunecost.simulate.checkpointing import reentrant_checkpointing
from tunecost.simulate.depth import depth_share, peak_segment, scaled_segments
from tunecost.simulate.fp8 import LinearShape, fp8_depth_bytes, fp8_linears
from tunecost.simulate.full_depth import whole_step
from tunecost.simulate.overhead import DEFAULT_OVERHEAD
from tunecost.simulate.pool import prepared_model
from tunecost.simulate.prepare import check_supported
from tunecost.simulate.step_types import WEIGHT_CATEGORIES
from tunecost.workload.job import FineTuneJob

if TYPE_CHECKING:
    from tunecost.simulate.trace import TraceResult

ROOT_GROUPS = ("embedding", "lm_head/loss", "other")  # outside the decoder layers: FSDP2's root unit
LAYOUT_VERSION = "7"  # of the cached `SingleGpuStep` (3: reentrant_checkpointing; 4: temporaries; 5, 6: whole; 7: fp32)


@dataclass(frozen=True, kw_only=True)
class SingleGpuStep:
    """The single-GPU simulated step at full depth: bytes by category at every segment's peak, and the model's
    stored weights split into the root unit and the decoder layers."""

    model: str
    method: str
    batch_size: int
    seq_len: int
    num_layers: int
    segments: dict[str, dict[str, int]]  # segment ("backward:unit_last", ...) -> category -> bytes
    root_weight_bytes: int  # embedding, LM head and buffers: FSDP2's root unit
    layer_weight_bytes: int  # every stored weight of one decoder layer (frozen, 4-bit and trainable)
    trainable_bytes: int  # trainable parameters (their gradients have the same size)
    layer_trainable_bytes: int  # trainable parameters of one decoder layer
    trainable_bytes_per_param: int  # 4 for LoRA factors (fp32), the parameters' size for a full fine-tune
    flops_by_phase: dict[str, float]
    weight_bytes_by_key: dict[str, int]  # "group/category" -> bytes of the whole model's stored weights
    num_experts: int  # routed experts per MoE layer (1: dense)
    experts_per_token: int
    hidden_size: int
    activation_bytes_per_element: int
    recompute: bool  # activation checkpointing: backward re-runs each layer's forward
    allocations: dict  # the step's `simulate.step_types.AllocationTrace` made whole, as plain data ({}: none)
    reentrant_checkpointing: bool = False  # layers recomputed by re-entrant torch.utils.checkpoint (`fsdp1`)
    fp8_bytes: dict[str, int] = field(default_factory=dict)  # FP8's bytes by category at full depth (`simulate.fp8`)
    # the bytes a rank gathers for "one layer" over the average layer's: 1 for identical layers; a repeating unit's
    # over the average where layers differ (DeepSeek's dense prefix, BlackMamba's Mamba + MoE pairs)
    layer_scale: float = 1.0

    @property
    def weight_bytes(self) -> int:
        return self.root_weight_bytes + self.num_layers * self.layer_weight_bytes

    @property
    def root_trainable_bytes(self) -> int:
        return self.trainable_bytes - self.num_layers * self.layer_trainable_bytes

    def expert_share(self, category: str) -> float:
        """Share of a category's bytes that belongs to the routed experts: of the stored weights of that
        category, or for gradients, optimizer states and optimizer temporaries of the trainable parameters."""
        if category not in WEIGHT_CATEGORIES:
            category = "trainable_params"
        total = sum(v for k, v in self.weight_bytes_by_key.items() if k.rsplit("/", 1)[1] == category)
        return expert_parallel.expert_bytes(self.weight_bytes_by_key, category) / total if total else 0.0

    def layer_expert_bytes(self, *, trainable: bool) -> int:
        """One decoder layer's routed-expert bytes: all its stored weights, or its trainable parameters."""
        keys = ("trainable_params",) if trainable else WEIGHT_CATEGORIES
        experts = sum(expert_parallel.expert_bytes(self.weight_bytes_by_key, c) for c in keys)
        return experts // self.num_layers if self.num_layers else 0  # a pipeline stage of the norm and head alone

    def layer_bytes_per_rank(self, *, trainable: bool, ep: int) -> int:
        """One decoder layer's stored (or trainable) bytes with 1/ep of its routed experts."""
        layer = self.layer_trainable_bytes if trainable else self.layer_weight_bytes
        experts = self.layer_expert_bytes(trainable=trainable)
        return round((layer - experts + experts // ep) * self.layer_scale)

    @property
    def expert_trainable_bytes(self) -> int:
        return expert_parallel.expert_bytes(self.weight_bytes_by_key, "trainable_params")

    def trainable_bytes_per_rank(self, ep: int) -> int:
        """Trainable bytes of a rank holding 1/ep of the routed experts."""
        return self.trainable_bytes - self.expert_trainable_bytes + self.expert_trainable_bytes // ep

    @property
    def dispatch_bytes(self) -> int:
        """Bytes of one dispatch all-to-all of a MoE layer (`expert_parallel.dispatch_bytes`)."""
        return expert_parallel.dispatch_bytes(
            num_tokens=self.batch_size * self.seq_len,
            experts_per_token=self.experts_per_token,
            hidden_size=self.hidden_size,
            bytes_per_element=self.activation_bytes_per_element,
        )


def _fields(record: Any) -> dict[str, Any]:
    """A dataclass of plain data as a dict, its lists copied one level deep (`dataclasses.asdict` deep-copies
    every element: seconds for a trace's allocations)."""
    return {
        f.name: list(v) if isinstance(v := getattr(record, f.name), list) else v for f in dataclasses.fields(record)
    }


def _lerp(a: float, b: float, t: float) -> float:
    return max(0.0, a + (b - a) * t)


def single_gpu_step(
    job: FineTuneJob, *, granule_bytes: int = 512, use_cache: bool = True, behaviour=None
) -> SingleGpuStep:
    """Trace `job` at one and two repeating units (or at full depth when it is short) and scale every segment
    to the full depth, as `simulate.simulate_step` does for its peak (exact for identical units). Cached on disk
    beside the simulator's results (`simulate.cache`: the key hashes the job, the config and the versions).
    `behaviour`: library behaviours of the job's stack (`simulate.behaviour.StackBehaviour`; None: the default)."""
    key = f"rank-{LAYOUT_VERSION}-" + cache.job_key(job, None, DEFAULT_OVERHEAD, granule_bytes, behaviour)
    return cached_step(key, lambda: trace_single_gpu_step(job, granule_bytes, behaviour), use_cache=use_cache)


def cached_step(key: str, trace: Callable[[], SingleGpuStep], *, use_cache: bool = True) -> SingleGpuStep:
    """The `SingleGpuStep` cached on disk under `key`, or `trace()` (then stored)."""
    import json

    path = cache.cache_dir() / f"{key}.json"
    if use_cache:
        try:
            return SingleGpuStep(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):  # no entry, or one from another layout: trace again
            pass
    step = trace()
    if use_cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, _fields(step))
        except (OSError, TunecostError):  # a cache that cannot be written is no error
            pass
    return step


def trace_single_gpu_step(
    job: FineTuneJob, granule_bytes: int, behaviour=None, *, full_depth: bool = False
) -> SingleGpuStep:
    """The step traced at one and two units and scaled, or (`full_depth`, slow: for benchmarks) at full depth."""
    from tunecost.simulate.trace import trace_step

    spec = resolve_model(job.model)
    check_supported(job, spec)
    behaviour = behaviour or DEFAULT_BEHAVIOUR
    linears: list[list[LinearShape]] = []

    def trace(units: int) -> TraceResult:
        prepared = prepared_model(job, units, behaviour)
        linears.append(fp8_linears(prepared.model.named_modules(), full=job.method == "full"))
        return trace_step(prepared, job.batch_size, job.worst_case_seq_len, round_bytes=granule_bytes)

    units = traced_units(spec, full_depth=full_depth)
    traces = [trace(u) for u in units]
    full_units = layer_pattern(spec)[2]
    reentrant = reentrant_checkpointing(job, behaviour=behaviour)
    return scaled_step(
        job,
        spec,
        traces,
        reentrant=reentrant,
        linears=linears[: len(traces)],
        granule_bytes=granule_bytes,
        deeper=lambda: trace(units[-1] + 1) if units[-1] < full_units else None,
    )


def traced_units(spec: ModelSpec, *, full_depth: bool = False) -> list[int]:
    """The depths (repeating units) to trace: one and two, or the full depth when it is short or asked for."""
    prefix, _, full_units = layer_pattern(spec)
    if prefix == spec.num_layers:
        raise TunecostError(f"{spec.name}: per-rank memory needs repeating decoder layers (these are irregular)")
    return [full_units] if full_units <= 2 or full_depth else [1, 2]


def _layer_scale(spec: ModelSpec, traces: list, layer_weight_bytes: int) -> float:
    """`SingleGpuStep.layer_scale`: a repeating unit's stored bytes (the two traces' difference per unit) over the
    average layer's, where the layers differ; 1 where they are identical or only one depth was traced."""
    prefix, period, _ = layer_pattern(spec)
    if (not prefix and period == 1) or len(traces) < 2 or layer_weight_bytes <= 0:
        return 1.0
    ta, tb = traces[0], traces[-1]
    unit = (sum(tb.weight_bytes.values()) - sum(ta.weight_bytes.values())) / (tb.num_units - ta.num_units)
    return max(1.0, unit / layer_weight_bytes)


def _whole_allocations(traces: list, full_units: int, peak_bytes: float, deeper) -> dict:
    """The step's allocations made whole (`simulate.full_depth.whole_step`), else as traced ({}: none)."""
    tb = traces[-1]
    if tb.allocations is None:
        return {}
    whole = whole_step(traces[0], tb, full_units, peak_bytes, deeper)  # one trace: already whole (None)
    return _fields(whole.allocations if whole else tb.allocations)


def scaled_step(
    job: FineTuneJob,
    spec: ModelSpec,
    traces: list,
    *,
    reentrant: bool,
    linears: list[list[LinearShape]] | None = None,
    granule_bytes: int = 512,
    deeper: Callable[[], TraceResult | None] | None = None,
) -> SingleGpuStep:
    """The `SingleGpuStep` at full depth from traces at one and two units (`simulate.trace.TraceResult`s; one
    trace: already at full depth), with FP8's bytes from each traced depth's `linears`; `deeper` traces one unit
    more where the first traced unit differs from the others (`simulate.full_depth.whole_step`)."""
    full_units = layer_pattern(spec)[2]
    ta, tb = traces[0], traces[-1]
    t = 0.0 if len(traces) == 1 else depth_share(ta.num_units, tb.num_units, full_units)
    scaled = scaled_segments(ta.segments, tb.segments, t)
    segments = {key: {c: max(0, round(v)) for c, v in by_category.items()} for key, by_category in scaled.items()}
    peak = peak_segment(scaled)[1]
    weights = {k: round(_lerp(ta.weight_bytes.get(k, 0), tb.weight_bytes.get(k, 0), t)) for k in tb.weight_bytes}
    root = sum(v for k, v in weights.items() if k.rsplit("/", 1)[0] in ROOT_GROUPS)
    trainable = sum(v for k, v in weights.items() if k.endswith("/trainable_params"))
    root_trainable = sum(
        v for k, v in weights.items() if k.endswith("/trainable_params") and k.rsplit("/", 1)[0] in ROOT_GROUPS
    )
    flops: dict[str, float] = {}
    for (phase, _cls), v in tb.flops.items():
        flops[phase] = flops.get(phase, 0.0) + _lerp(ta.flops.get((phase, _cls), 0.0), v, t)
    layer_weight_bytes = (sum(weights.values()) - root) // spec.num_layers
    return SingleGpuStep(
        model=spec.name,
        method=job.method,
        batch_size=job.batch_size,
        seq_len=job.worst_case_seq_len,
        num_layers=spec.num_layers,
        segments=segments,
        root_weight_bytes=root,
        layer_weight_bytes=layer_weight_bytes,
        trainable_bytes=trainable,
        layer_trainable_bytes=(trainable - root_trainable) // spec.num_layers,
        trainable_bytes_per_param=4 if job.method != "full" else job.param_bytes_per_element,
        flops_by_phase=flops,
        weight_bytes_by_key=weights,
        num_experts=spec.num_experts,
        experts_per_token=spec.top_k(job.experts_per_token),
        hidden_size=spec.hidden_size,
        activation_bytes_per_element=job.compute_bytes_per_element,
        recompute=job.gradient_checkpointing,
        allocations=_whole_allocations(traces, full_units, peak, deeper),
        reentrant_checkpointing=reentrant,
        fp8_bytes=fp8_depth_bytes(job, linears or [], job.batch_size * job.worst_case_seq_len, granule_bytes, t),
        layer_scale=_layer_scale(spec, traces, layer_weight_bytes),
    )
