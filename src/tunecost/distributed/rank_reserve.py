"""The reserve of one rank of a data-parallel job: PyTorch's caching allocator (`simulate.allocator`) replayed over
the rank's allocations, built from the single-GPU step's traced allocations (`SingleGpuStep.allocations`).

Every rank runs the whole micro-batch, so its activations and temporaries are the single-GPU step's, at the same
op indices. What changes (the same scaling as `rank_memory.rank_segment_bytes`, read per category at the
optimizer segment, so the rank's states are those its allocated peak counts):
- the model states: each parameter, gradient, optimizer state and optimizer temporary keeps its own allocation,
  scaled to the rank's share (per-parameter shards, as FSDP2's DTensors and ZeRO's partitions; FSDP1's one flat
  parameter per wrapped unit is not replayed);
- under FSDP (fsdp2, hsdp, fsdp2-shard-grad-op) each gradient is produced whole on the compute stream and kept
  until its layer's backward ends (the post-backward hook's reduce-scatter); the reduce-scatter output, the
  rank's sharded gradient kept until `zero_grad`, is allocated on the post-backward stream
  (`torch/distributed/fsdp/_runtime_utils.py`: `new_sharded_grad = torch.empty_like(chunks[0])` under the
  post-backward stream);
- with sharded parameters (fsdp2, hsdp, zero3) the all-gather outputs (a decoder layer's unsharded weights, and
  the root's) are allocated on the unshard stream (`_unshard`: `handle.unshard()` under `unshard_stream`): the
  root's from the first forward op to the end of backward, a layer's over its forward and again over its
  backward, each allocated when the layer before it (in that pass's order) starts: the prefetch, which keeps
  two layers in flight; under fsdp2-shard-grad-op a layer's from its forward to the end of its backward;
- DDP's gradient buckets and DeepSpeed's reduce bucket are allocated once, before the first step.
The caching allocator never serves a request from a block cached for another stream, so the unshard and
post-backward streams keep pools of their own beside the compute stream's.

The replay runs at the traced depth; as for the single-GPU step (`simulate.simulator.combine`), the rank's
reserved peak is its full-depth allocated peak plus the replay's excess of reserve over its allocated peak.
"""

from __future__ import annotations

import math

import numpy as np

from tunecost.distributed.plan import ParallelPlan
from tunecost.distributed.rank_memory import PARAM_SHARDED, STORED_SHARDED, rank_segment_bytes
from tunecost.distributed.single_step import SingleGpuStep
from tunecost.simulate.allocator import KIND_STEP, KIND_WEIGHT, NEVER_FREED, steady_state_replay
from tunecost.simulate.records import CATEGORIES, AllocationTrace
from tunecost.workload.job import FineTuneJob

STREAM_COMPUTE, STREAM_UNSHARD, STREAM_POST_BACKWARD = 0, 1, 2
_GRADIENTS = CATEGORIES.index("gradients")
_TEMPORARIES = CATEGORIES.index("temporaries")
ONCE_BUFFERS = ("gradient_buckets", "reduce_bucket")  # allocated at wrap time and kept
RESERVE_ASSUMPTION = (
    "reserved memory per rank: the caching allocator replayed over the rank's allocations at the traced depth "
    "(the single-GPU step's, states scaled to the rank's share per tensor; under FSDP all-gather outputs on the "
    "unshard stream and reduce-scatter outputs on the post-backward stream, each stream with its own cached "
    "blocks), added as its excess over the allocated peak to the full-depth allocated peak; not modelled: "
    "FSDP1's one flat parameter per unit, mixed precision's low-precision shard copies (pre-unshard stream), "
    "record_stream's deferred frees, DeepSpeed's own streams and buffers beyond its reduce bucket"
)


class _Records:
    """Rank allocations under construction: the replay's per-record arrays."""

    def __init__(self) -> None:
        self.columns: dict[str, list[int]] = {k: [] for k in ("nbytes", "t_alloc", "t_free", "kind", "stream")}

    def add(self, nbytes: int, t_alloc: int, t_free: int, kind: int = KIND_STEP, stream: int = STREAM_COMPUTE):
        if nbytes > 0:
            for key, value in zip(self.columns, (nbytes, t_alloc, t_free, kind, stream), strict=True):
                self.columns[key].append(value)

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(v, dtype=np.int64) for k, v in self.columns.items()}


def optimizer_segment_bytes(step: SingleGpuStep, job: FineTuneJob, plan: ParallelPlan) -> dict[str, int]:
    """The rank's bytes by category (and buffer) at the optimizer segment, where every state is alive."""
    return rank_segment_bytes(step.segments["optimizer:opt"], "optimizer", step, job, plan)


def state_ratios(step: SingleGpuStep, rank: dict[str, int]) -> dict[int, float]:
    """Per category code: the rank's bytes `rank` over the single GPU's at the optimizer segment
    (`rank_segment_bytes`: sharding, ZeRO's fp32 states, offload); categories it leaves alone map to 1."""
    single = step.segments["optimizer:opt"]
    return {CATEGORIES.index(c): rank.get(c, 0) / n for c, n in single.items() if n and c in CATEGORIES}


def rank_allocations(step: SingleGpuStep, job: FineTuneJob, plan: ParallelPlan) -> dict[str, np.ndarray]:
    """The rank's allocations at the traced depth: nbytes, t_alloc, t_free, kind and stream per record."""
    trace = AllocationTrace(**step.allocations)
    at_optimizer = optimizer_segment_bytes(step, job, plan)
    ratios = state_ratios(step, at_optimizer)
    out = _Records()
    fsdp = plan.strategy in STORED_SHARDED
    end_backward = trace.t_optimizer - 1
    for i, nbytes in enumerate(trace.nbytes):
        category, t_alloc, t_free, kind = trace.category[i], trace.t_alloc[i], trace.t_free[i], trace.kind[i]
        in_optimizer = t_alloc >= trace.t_optimizer
        scaled = (
            nbytes if category == _TEMPORARIES and not in_optimizer else math.ceil(nbytes * ratios.get(category, 1))
        )
        if not (fsdp and category == _GRADIENTS):
            out.add(scaled, t_alloc, t_free, kind)
            continue
        layer = trace.layer[i]
        reduced = max(t_alloc, trace.backward_ops[layer][1] if layer >= 0 else end_backward, 0)
        out.add(nbytes, t_alloc, min(t_free, reduced), kind)  # the whole gradient, until its reduce-scatter
        if t_free > reduced:
            out.add(scaled, reduced, t_free, kind, STREAM_POST_BACKWARD)
    for name in ONCE_BUFFERS:
        out.add(at_optimizer.get(name, 0), 0, NEVER_FREED, KIND_WEIGHT)
    if plan.strategy in PARAM_SHARDED or plan.strategy == "fsdp2-shard-grad-op":
        _add_all_gathers(out, trace, step, plan, end_backward)
    return out.arrays()


def _add_all_gathers(out: _Records, trace: AllocationTrace, step: SingleGpuStep, plan: ParallelPlan, end: int):
    """All-gather outputs on the unshard stream: the root's for the whole pass, each layer's from the start of
    the layer before it (the prefetch) to the end of its own window."""
    layer_bytes = step.layer_bytes_per_rank(trainable=False, ep=plan.expert_parallel)
    out.add(step.root_weight_bytes, 1, end, stream=STREAM_UNSHARD)
    forward, backward = trace.forward_ops, trace.backward_ops
    last = len(forward) - 1
    for i in range(len(forward)):
        fwd_start, bwd_start = forward[max(0, i - 1)][0], backward[min(last, i + 1)][0]
        if plan.strategy == "fsdp2-shard-grad-op":  # kept unsharded from forward to the end of backward
            windows = [(fwd_start, backward[i][1])]
        else:
            windows = [(fwd_start, forward[i][1]), (bwd_start, backward[i][1])]
        for start, stop in windows:
            if 0 < start <= stop:  # a layer without ops in a pass (-1) gathers nothing there
                out.add(layer_bytes, start, stop, stream=STREAM_UNSHARD)


def rank_reserve_excess_bytes(step: SingleGpuStep, job: FineTuneJob, plan: ParallelPlan) -> int:
    """The replay's peak reserve minus its allocated peak (live requests, 512-byte granules), at the traced
    depth; 0 when the step carries no allocations."""
    if not step.allocations:
        return 0
    a = rank_allocations(step, job, plan)
    trace = AllocationTrace(**step.allocations)
    replay = steady_state_replay(
        a["nbytes"], a["t_alloc"], a["t_free"], a["kind"], trace.t_optimizer, stream=a["stream"]
    )
    return max(0, replay.peak_reserved_bytes - replay.peak_requested_bytes)
