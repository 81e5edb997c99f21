"""`simulate_step`: one fine-tuning step of any catalog model from its config alone, on fake tensors.

Layers repeat, so by default two small depths are traced (one and two repeating units after any irregular
prefix, e.g. DeepSeek's first dense layer; a unit is two layers for BlackMamba) and every figure is scaled
linearly to the full depth: peaks per segment (phase x region, see `trace`), the breakdown at the peak, FLOPs and
bytes. The scaling is exact when the units are identical (tests check it against full traces).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from tunecost.errors import TunecostError
from tunecost.models.families import GATED_DELTA_FAMILIES, MAMBA2_FAMILIES
from tunecost.simulate import cache as _cache
from tunecost.simulate.behaviour import ADAMW_IMPLS, DEFAULT_BEHAVIOUR, StackBehaviour, stack_adamw_impl
from tunecost.simulate.depth import depth_scaled, depth_share, lerp_byte_map, lerp_bytes, peak_segment, scaled_segments
from tunecost.simulate.fp8 import fp8_depth_bytes, fp8_linears
from tunecost.simulate.full_depth import whole_step
from tunecost.simulate.overhead import DEFAULT_OVERHEAD, DeviceOverhead
from tunecost.simulate.pool import prepared_model
from tunecost.simulate.step_types import StepCounts, StepSimulation

if TYPE_CHECKING:
    from tunecost.models.catalog import ModelSpec
    from tunecost.simulate.trace import SegmentPeak, TraceResult
from tunecost.models.catalog import resolve_model
from tunecost.workload.gated_delta import GATED_DELTA_NOTE
from tunecost.workload.job import FineTuneJob
from tunecost.workload.lengths import padded_length
from tunecost.workload.liger import liger_note
from tunecost.workload.ssd import MAMBA2_NOTE, MAMBA2_QLORA_NOTE

FP8_NOTES = {
    "tensorwise": "fp8 tensorwise (torchao float8): bf16 weights and saved inputs kept; the FP8 casts of the largest "
    "linear's backward added as temporaries (docs/fp8.md)",
    "rowwise": "fp8 rowwise (torchao float8): bf16 weights and saved inputs kept; the FP8 casts of the largest "
    "linear's backward added as temporaries (docs/fp8.md)",
    "te-delayed": "fp8 te-delayed (Transformer Engine): FP8 weight copies (row- and column-wise) cached per linear "
    "as buffers, FP8 inputs saved beside the bf16 ones the model code saves (an upper bound), the grad-output's FP8 "
    "copies as temporaries (docs/fp8.md)",
}
FP8_PARAMS_NOTE = (
    "fp8 primary weights (TE fp8_model_init): each linear's weight stored as its FP8 row-wise copy, one byte per "
    "element instead of its compute dtype, with the column-wise copy cached beside it (docs/fp8.md)"
)


def _lerp(a: float, b: float, t: float) -> float:
    return a + (b - a) * t


def _lerp_dict(a: dict, b: dict, t: float) -> dict:
    return {k: max(0.0, _lerp(a.get(k, 0), b.get(k, 0), t)) for k in sorted(set(a) | set(b))}


def _scaled_groups(key: str, sa: SegmentPeak, sb: SegmentPeak, t: float) -> dict[str, float]:
    """A segment's bytes by module group at full depth: linear in the depth, its temporaries the deeper trace's
    (`depth_scaled`)."""
    rest = [{g: v - s.temporaries_by_group.get(g, 0) for g, v in s.by_group.items()} for s in (sa, sb)]
    scaled = depth_scaled(key, rest[0], rest[1], t, fixed=())
    groups = sa.temporaries_by_group.keys() | sb.temporaries_by_group.keys()
    for g, v in depth_scaled(key, sa.temporaries_by_group, sb.temporaries_by_group, t, fixed=groups).items():
        scaled[g] = scaled.get(g, 0) + v
    return scaled


def combine(
    ta: TraceResult,
    tb: TraceResult | None,
    full_units: int,
    full_layers: int,
    deeper: Callable[[], TraceResult | None] | None = None,
) -> dict:
    """Scale two traces (units a < b) to `full_units`; with one trace (already full depth) just unpack it. The
    reserve is replayed over the deeper trace made whole, else over a trace one unit deeper (`deeper`: where the
    first traced unit differs from the others), else it is the deeper trace's excess over its allocated peak."""
    ta_, tb_ = ta, ta if tb is None else tb
    t = 0.0 if tb is None else depth_share(ta.num_units, tb.num_units, full_units)
    scaled = scaled_segments(ta_.segments, tb_.segments, t)
    key, total = peak_segment(scaled)
    by_category = scaled[key]
    by_group = _scaled_groups(key, ta_.segments[key], tb_.segments[key], t)
    whole = whole_step(ta_, tb, full_units, total, deeper)
    excess = tb_.peak_reserved_bytes - max(s.total for s in tb_.segments.values())
    reserved = total + max(0, excess) if whole is None else whole.peak_reserved_bytes
    by_group_flops: dict[str, dict[str, float]] = {}
    for (group, phase), v in _lerp_dict(ta_.flops_by_group, tb_.flops_by_group, t).items():
        by_group_flops.setdefault(group, {})[phase] = v
    counts: dict[str, StepCounts] = {}
    flops = _lerp_dict(ta_.flops, tb_.flops, t)
    nbytes = _lerp_dict(ta_.bytes, tb_.bytes, t)
    for phase in sorted({p for p, _ in flops} | {p for p, _ in nbytes}):
        counts[phase] = StepCounts(
            flops_by_class={c: v for (p, c), v in flops.items() if p == phase},
            bytes_by_class={c: v for (p, c), v in nbytes.items() if p == phase},
        )
    return {
        "peak_bytes": round(total),
        "peak_segment": key,
        "peak_reserved_bytes": round(reserved),
        "breakdown_bytes": {k: round(v) for k, v in by_category.items() if round(v) > 0},
        "module_bytes": {k: round(v) for k, v in by_group.items() if round(v) > 0},
        "weight_bytes": {k: round(v) for k, v in _lerp_dict(ta_.weight_bytes, tb_.weight_bytes, t).items()},
        "counts": counts,
        "flops_by_module": by_group_flops,
        "layers_traced": (ta.num_layers,) if tb is None else (ta.num_layers, tb.num_layers),
        "num_layers": full_layers,
    }


def add_fp8_memory(parts: dict, extra: dict[str, int]) -> None:
    """FP8's bytes (`fp8.fp8_memory_bytes`, scaled to full depth) added to the peak, the reserve and the breakdown
    at the peak: an upper bound where the peak falls after some of them are freed (docs/fp8.md)."""
    total = round(sum(extra.values()))
    parts["peak_bytes"] += total
    parts["peak_reserved_bytes"] += total
    for category, nbytes in extra.items():
        parts["breakdown_bytes"][category] = parts["breakdown_bytes"].get(category, 0) + round(nbytes)


def _lora_dropout_note(job: FineTuneJob) -> list[str]:
    if job.method == "full" or not job.lora.dropout:
        return []
    moe = " and ".join(sorted({"experts", "router"} & set(job.lora.targets)))
    return [
        f"LoRA dropout {job.lora.dropout:g}: a 1-byte mask (CUDA's fused dropout) and the dropped input per adapter"
        + (f"; not simulated on the {moe} adapters" if moe else "")
    ]


def _assumptions(
    job: FineTuneJob, seq_len: int, overhead: DeviceOverhead, behaviour: StackBehaviour, spec: ModelSpec
) -> tuple[str, ...]:
    stack = job.stack
    out = [
        *spec.not_modelled_notes,
        f"worst batch: {job.batch_size} x {seq_len} tokens, every position computed (padding to the longest "
        "query in the batch; some batch holds the longest query)",
        "steady-state step: optimizer states already allocated; gradients set to None after the step",
        "bytes rounded up to 512-byte allocator granules (torch.cuda.max_memory_allocated semantics)",
        "reserved memory: PyTorch's CUDA caching allocator replayed over the weights' load and repeated steps "
        "(one stream; PYTORCH_CUDA_ALLOC_CONF defaults: expandable_segments off, max_split_size unlimited); "
        "when scaled, the full-depth allocated peak plus the reserve's excess over it at the deeper traced depth",
        overhead.describe(),
    ]
    if job.method != "full" and job.stack_spec.torchtune_recipes:
        out.append(f"LoRA factors in {job.compute_dtype}, no autocast (torchtune builds the model in its dtype)")
    elif job.method != "full":
        out.append("LoRA factors stored in fp32 and cast to the compute dtype in forward (PEFT + autocast)")
        if job.fp32_params:
            out.append(f"frozen weights in fp32, each cast to {job.compute_dtype} where used (torch AMP)")
    elif job.fp32_params:
        out.append(
            f"full fine-tune with fp32 parameters, gradients and optimizer states, forward under {job.compute_dtype} "
            "autocast (torch AMP): each weight's cast kept until the forward ends"
        )
    else:
        out.append(
            f"full fine-tune in {job.compute_dtype}: parameters, gradients and optimizer states in "
            f"{job.compute_dtype} (no fp32 master weights)"
        )
    if job.optimizer == "adamw" and not behaviour.adamw_impl:  # else the behaviour names the stack's AdamW
        impl = stack_adamw_impl(stack, behaviour)
        out.append(
            f"AdamW: {ADAMW_IMPLS[impl]}"
            if impl
            else "torch AdamW multi-tensor (foreach) path, as on CUDA: its temporaries span all trainable tensors"
        )
    out += [FP8_NOTES[job.fp8]] if job.fp8 != "none" else []
    out += [FP8_PARAMS_NOTE] if job.fp8_params else []
    out += _lora_dropout_note(job)
    if job.attention in ("flash", "sdpa"):
        out.append("attention memory as a fused kernel: output + fp32 log-sum-exp saved, no L x L scores")
    out += _base_weights_notes(job)
    if job.modules_to_save:
        out.append(
            f"modules_to_save {', '.join(job.modules_to_save)}: frozen original kept, a trained copy in the model "
            "dtype with its gradient and optimizer states (PEFT ModulesToSaveWrapper)"
        )
    # the stack's own checkpointing where the job checkpoints, unless the behaviour names another (its own line,
    # `StackBehaviour.describe`)
    own = job.gradient_checkpointing and behaviour.reentrant_checkpointing is None
    stack_note = job.stack_spec.describe(own_checkpointing=own, moe=spec.is_moe)
    out += [stack_note] if stack_note else []
    out += [liger_note(spec.family)] if job.liger_kernel else []
    out += [GATED_DELTA_NOTE] if spec.family in GATED_DELTA_FAMILIES else []
    if spec.family in MAMBA2_FAMILIES:
        out.append(MAMBA2_QLORA_NOTE if job.method == "qlora" else MAMBA2_NOTE)
    if spec.is_moe and (job.method == "qlora" or job.stack_spec.per_expert_loop):
        out.append(
            "routing is unknown without data: expert loops assume tokens spread evenly over experts "
            "(the memory of grouped or looped expert compute depends on the total routed tokens)"
        )
    return (*out, *behaviour.describe())


def _base_weights_notes(job: FineTuneJob) -> list[str]:
    """How the quantized base weights are held and de-quantized."""
    out: list[str] = []
    if job.base_quant == "gptq":
        out.append(
            f"GPTQ int4 weights in auto-gptq's QuantLinear buffers (group size {job.gptq_group_size}); kernel "
            f"{job.gptq_kernel}: "
            + (
                "each matrix de-quantized to fp16 into a temporary freed after the matmul (forward and backward)"
                if job.gptq_kernel == "triton-v2"
                else "unpacked by torch ops (int32 shift, int8 codes), the fp16 weight kept by autograd for backward"
            )
        )
    elif job.base_quant == "int8":
        out.append(
            "LLM.int8 weights (bitsandbytes Linear8bitLt: int8 codes, one fp32 absmax per row); forward quantizes the "
            "input per row (fp16 copy, |x| >= 6 outlier mask) for an int8 GEMM with an int32 product; backward "
            "de-quantizes each weight into a temporary; the outlier columns' 16-bit matmul is not simulated"
        )
    elif job.method == "qlora":
        out.append(
            "4-bit weights de-quantized per matrix into a temporary that is freed after the matmul "
            "(forward and backward), as bitsandbytes does"
        )
    return out


def simulate_step(
    job: FineTuneJob,
    *,
    num_layers_to_trace: int | None = None,
    behaviour: StackBehaviour = DEFAULT_BEHAVIOUR,
    overhead: DeviceOverhead = DEFAULT_OVERHEAD,
    granule_bytes: int = 512,
    use_cache: bool = True,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> StepSimulation:
    """Simulate one training step of `job` (its batch size at its worst-case padded length) on its stack.

    num_layers_to_trace: None traces one and two repeating units and scales; an integer traces that many layers
    (rounded to whole units) and one unit fewer; at or above the model's depth, the full model once.
    granule_bytes: allocation rounding (512 as CUDA's caching allocator; 1 to compare with CPU measurements).
    behaviour: library behaviours of a real stack to reproduce (`behaviour.StackBehaviour`; default: none).
    """
    if num_layers_to_trace is not None and num_layers_to_trace < 1:
        raise TunecostError(f"layers to trace must be at least 1, got {num_layers_to_trace}")
    spec = resolve_model(job.model)
    spec.check_seq_len(job.worst_case_seq_len)  # before the cache: no stored answer to it
    if job.recompute_layers is not None:  # some layers recomputed: between every layer and none
        share = job.recomputed_share(spec.num_layers)
        every = job.with_(recompute_layers=None)
        run = functools.partial(
            simulate_step,
            num_layers_to_trace=num_layers_to_trace,
            behaviour=behaviour,
            overhead=overhead,
            granule_bytes=granule_bytes,
            use_cache=use_cache,
            on_progress=on_progress,
        )
        on = run(every)
        if share == 1.0:
            return on
        off = run(every.with_(gradient_checkpointing=False))
        return partly_recomputed(off, on, job.recompute_layers, spec.num_layers)
    key = _cache.job_key(job, num_layers_to_trace, overhead, granule_bytes, behaviour)
    if use_cache:
        hit = _cache.load(key)
        if hit is not None:
            return hit
    sim = _simulate_uncached(job, num_layers_to_trace, overhead, granule_bytes, on_progress, behaviour)
    if use_cache:
        _cache.store(key, sim)
    return sim


def partly_recomputed(off: StepSimulation, on: StepSimulation, layers: int, num_layers: int) -> StepSimulation:
    """The step with `layers` of `num_layers` decoder layers recomputed, from the steps with none (`off`) and every
    one (`on`): each checkpointed layer keeps its input instead of its activations, so the bytes at the peak move
    linearly from `off`'s to `on`'s (over by at most one layer's activations: `on`'s peak holds the layer being
    recomputed); the recompute pass runs for that share of the layers."""
    share = layers / num_layers

    def scaled(counts: StepCounts) -> StepCounts:
        return StepCounts(
            flops_by_class={k: v * share for k, v in counts.flops_by_class.items()},
            bytes_by_class={k: v * share for k, v in counts.bytes_by_class.items()},
        )

    counts = {phase: scaled(c) if phase == "recompute" else c for phase, c in on.counts.items()}
    flops_by_module = {
        group: {phase: v * share if phase == "recompute" else v for phase, v in by_phase.items()}
        for group, by_phase in on.flops_by_module.items()
    }
    note = (
        f"{layers} of {num_layers} layers recomputed: the peak, its breakdown and the reserve interpolated between "
        f"the step with every layer recomputed and with none (over by at most one layer's activations)"
    )
    return replace(
        off,
        peak_bytes=lerp_bytes(off.peak_bytes, on.peak_bytes, share),
        breakdown_bytes=lerp_byte_map(off.breakdown_bytes, on.breakdown_bytes, share),
        module_bytes=lerp_byte_map(off.module_bytes, on.module_bytes, share),
        peak_reserved_bytes=lerp_bytes(off.peak_reserved_bytes, on.peak_reserved_bytes, share),
        counts=counts,
        flops_by_module=flops_by_module,
        seconds_taken=off.seconds_taken + on.seconds_taken,
        assumptions=(*on.assumptions, note),
    )


def _simulate_uncached(
    job, num_layers_to_trace, overhead, granule_bytes, on_progress, behaviour=DEFAULT_BEHAVIOUR
) -> StepSimulation:
    from tunecost.models.anatomy import layer_pattern
    from tunecost.simulate.prepare import check_supported
    from tunecost.simulate.trace import trace_step

    start = time.perf_counter()
    spec, stack = resolve_model(job.model), job.stack
    check_supported(job, spec, behaviour)
    prefix, period, full_units = layer_pattern(spec)
    seq_len = job.worst_case_seq_len
    if job.stack_spec.pads_lengths:
        seq_len = padded_length(seq_len)
    if num_layers_to_trace is None:
        units_b = 2
    else:
        units_b = max(1, (num_layers_to_trace - prefix) // period)
    units = [full_units] if units_b >= full_units or full_units <= 2 else [max(1, units_b - 1), units_b]
    traces, linears = [], []
    for i, u in enumerate(units):
        if on_progress:
            on_progress(i, len(units), f"tracing {prefix + u * period} layers")
        prepared = prepared_model(job, u, behaviour)
        traces.append(trace_step(prepared, job.batch_size, seq_len, round_bytes=granule_bytes))
        linears.append(fp8_linears(prepared.model.named_modules(), full=job.method == "full"))
    if on_progress:
        on_progress(len(units), len(units), "done")

    def deeper() -> TraceResult | None:
        units_c = units[-1] + 1
        if units_c > full_units:
            return None
        if on_progress:
            on_progress(len(units), len(units), f"tracing {prefix + units_c * period} layers")
        prepared = prepared_model(job, units_c, behaviour)
        return trace_step(prepared, job.batch_size, seq_len, round_bytes=granule_bytes)

    parts = combine(traces[0], traces[1] if len(traces) > 1 else None, full_units, spec.num_layers, deeper)
    if job.fp8 != "none":
        t = (
            0.0
            if len(traces) == 1
            else (full_units - traces[0].num_units) / (traces[1].num_units - traces[0].num_units)
        )
        add_fp8_memory(parts, fp8_depth_bytes(job, linears, job.batch_size * seq_len, granule_bytes, t))
    return StepSimulation(
        model=spec.name,
        method=job.method,
        stack=stack,
        batch_size=job.batch_size,
        seq_len=seq_len,
        device_overhead_bytes=overhead.overhead_bytes(),
        seconds_taken=time.perf_counter() - start,
        assumptions=_assumptions(job, seq_len, overhead, behaviour, spec),
        **parts,
    )
