"""The reserve of one rank of a data-parallel job: PyTorch's caching allocator (`simulate.allocator`) replayed over
the rank's allocations, built from the single-GPU step's allocations at full depth (`SingleGpuStep.allocations`).

Sources and derivations: docs/multi-gpu.md, section `tunecost.distributed.rank_reserve`.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict

import numpy as np

from tunecost.distributed.rank_memory import PARAM_SHARDED, STORED_SHARDED, rank_segment_bytes, reduce_bucket_bytes
from tunecost.distributed.single_step import SingleGpuStep
from tunecost.simulate.allocator import KIND_STEP, KIND_WEIGHT, NEVER_FREED, steady_state_replay
from tunecost.simulate.step_types import CATEGORIES, AllocationTrace
from tunecost.workload.job import FineTuneJob
from tunecost.workload.parallel import ParallelPlan

STREAM_COMPUTE, STREAM_UNSHARD, STREAM_POST_BACKWARD = 0, 1, 2
_REPLAYS: OrderedDict[bytes, tuple[dict[int, int], dict[int, int]]] = OrderedDict()  # digest -> `_replay`
_REPLAYS_KEPT = 1 << 16  # a cold plan replays ~60,000 rank allocations, ~19,000 of them distinct
_COLUMNS = ("nbytes", "t_alloc", "t_free", "kind", "stream")
_GRADIENTS = CATEGORIES.index("gradients")
_TEMPORARIES = CATEGORIES.index("temporaries")
ONCE_BUFFERS = ("gradient_buckets",)  # allocated at wrap time and kept
RESERVE_ASSUMPTION = (
    "reserved memory per rank: PyTorch's caching allocator replayed over the rank's allocations (the single-GPU "
    "step's, states scaled to the rank's share per tensor; under FSDP all-gather outputs on the unshard stream "
    "and reduce-scatter outputs on the post-backward stream, each stream with its own cached blocks): the "
    "compute stream's full-depth allocated peak plus its reserve excess over the step made whole, plus the side "
    "streams' reserves at full depth; not modelled: FSDP1's one flat parameter (and gradient) per wrapped unit, "
    "FSDP1's held layer inputs in the replay (counted in the compute stream's peak only), "
    "the copy-out of FSDP2's unsharded parameters on the compute stream, mixed precision's low-precision shard "
    "copies (pre-unshard stream), record_stream's deferred frees, DeepSpeed's own streams (zero3's gathers "
    "replayed as FSDP's) and buffers beyond its reduce bucket, expert-parallel all-to-all buffers"
)


class _Records:
    """Rank allocations under construction: the replay's per-record arrays."""

    def __init__(self) -> None:
        self.nbytes: list[int] = []
        self.t_alloc: list[int] = []
        self.t_free: list[int] = []
        self.kind: list[int] = []
        self.stream: list[int] = []

    def add(self, nbytes: int, t_alloc: int, t_free: int, kind: int = KIND_STEP, stream: int = STREAM_COMPUTE):
        if nbytes > 0:
            self.nbytes.append(nbytes)
            self.t_alloc.append(t_alloc)
            self.t_free.append(t_free)
            self.kind.append(kind)
            self.stream.append(stream)

    def arrays(self, before: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """The records as int64 arrays, after `before`'s where given."""
        out = {k: np.asarray(getattr(self, k), dtype=np.int64) for k in _COLUMNS}
        return out if before is None else {k: np.concatenate((before[k], out[k])) for k in _COLUMNS}


def optimizer_segment_bytes(step: SingleGpuStep, job: FineTuneJob, plan: ParallelPlan) -> dict[str, int]:
    """The rank's bytes by category (and buffer) at the optimizer segment, where every state is alive."""
    return rank_segment_bytes(step.segments.get("optimizer:opt", {}), "optimizer:opt", step, job, plan)


def state_ratios(step: SingleGpuStep, rank: dict[str, int]) -> dict[int, float]:
    """Per category code: the rank's bytes `rank` over the single GPU's at the optimizer segment
    (`rank_segment_bytes`: sharding, ZeRO's fp32 states, offload); categories it leaves alone map to 1."""
    single = step.segments.get("optimizer:opt", {})
    return {CATEGORIES.index(c): rank.get(c, 0) / n for c, n in single.items() if n and c in CATEGORIES}


def _gathers(plan: ParallelPlan) -> bool:
    return plan.strategy in PARAM_SHARDED or plan.strategy == "fsdp2-shard-grad-op"


def side_stream_keys(plan: ParallelPlan) -> dict[str, int]:
    """Keys of `rank_segment_bytes` that live on a side stream, and the stream: the sharded gradients under
    FSDP (post-backward), the unsharded parameters and all-gather outputs when parameters are gathered
    (unshard: FSDP1's all-gather output is the unsharded flat parameter)."""
    keys = {"gradients": STREAM_POST_BACKWARD} if plan.strategy in STORED_SHARDED else {}
    if _gathers(plan):
        keys |= {"unsharded_params": STREAM_UNSHARD, "all_gather_buffers": STREAM_UNSHARD}
    return keys


def rank_allocations(step: SingleGpuStep, job: FineTuneJob, plan: ParallelPlan) -> dict[str, np.ndarray]:
    """The rank's allocations at the traced depth: nbytes, t_alloc, t_free, kind and stream per record."""
    trace = AllocationTrace(**step.allocations)
    at_optimizer = optimizer_segment_bytes(step, job, plan)
    end_backward = trace.t_optimizer - 1
    traced = _traced_records(trace, state_ratios(step, at_optimizer), plan.strategy in STORED_SHARDED)
    out = _Records()
    for name in ONCE_BUFFERS:
        out.add(at_optimizer.get(name, 0), 0, NEVER_FREED, KIND_WEIGHT)
    buckets = reduce_bucket_bytes(step, plan)  # ZeRO-1/2: allocated by each backward(), released at its end
    starts = [first for first, _last in trace.backward_ops if first >= 0]
    for _ in range(plan.num_reduce_buckets if buckets and starts else 0):
        out.add(buckets // plan.num_reduce_buckets, min(starts), end_backward)
    if _gathers(plan):
        _add_all_gathers(out, trace.forward_ops, trace.backward_ops, end_backward, step, plan)
    return out.arrays(before=traced)


def _traced_records(trace: AllocationTrace, ratios: dict[int, float], fsdp: bool) -> dict[str, np.ndarray]:
    """The traced records on the rank, in trace order: each scaled to the rank's share of its category (a
    temporary before the optimizer kept whole); under FSDP a gradient whole until its layer's reduce-scatter,
    then its shard on the post-backward stream. Records of no bytes are left out."""
    nbytes, t_alloc, t_free, kind, category, layer = (
        np.asarray(v, dtype=np.int64)
        for v in (trace.nbytes, trace.t_alloc, trace.t_free, trace.kind, trace.category, trace.layer)
    )
    ratio = np.ones(len(CATEGORIES))
    for code, value in ratios.items():
        ratio[code] = value
    whole = (category == _TEMPORARIES) & (t_alloc < trace.t_optimizer)
    scaled = np.where(whole, nbytes, np.ceil(nbytes * ratio[category]).astype(np.int64))
    grad = (category == _GRADIENTS) if fsdp else np.zeros(len(nbytes), dtype=bool)
    backward_last = np.array([last for _first, last in trace.backward_ops] + [trace.t_optimizer - 1], dtype=np.int64)
    reduced = np.maximum(np.maximum(t_alloc, backward_last[layer]), 0)  # layer -1: the end of backward
    columns = {  # two slots per record: the record (a gradient until its reduce-scatter), then a gradient's shard
        "nbytes": (np.where(grad, nbytes, scaled), scaled),
        "t_alloc": (t_alloc, reduced),
        "t_free": (np.where(grad, np.minimum(t_free, reduced), t_free), t_free),
        "kind": (kind, kind),
        "stream": (np.full(len(nbytes), STREAM_COMPUTE), np.full(len(nbytes), STREAM_POST_BACKWARD)),
    }
    pairs = {k: np.stack(v, axis=1).astype(np.int64) for k, v in columns.items()}
    keep = pairs["nbytes"] > 0
    keep[:, 1] &= grad & (t_free > reduced)
    return {k: v[keep] for k, v in pairs.items()}


def full_depth_side_allocations(step: SingleGpuStep, job: FineTuneJob, plan: ParallelPlan) -> dict[str, np.ndarray]:
    """The side streams' allocations of the whole model, on a timeline of two ops per layer and pass (forward
    0..L-1, backward L-1..0, then the optimizer): each layer's all-gather outputs, and each layer's sharded
    gradients (the traced layer 0's, repeated) with the root's, from their reduce-scatter to `zero_grad`."""
    trace = AllocationTrace(**step.allocations)
    num_layers = step.num_layers
    forward = [[2 * i + 1, 2 * i + 2] for i in range(num_layers)]
    backward = [[4 * num_layers - 2 * i - 1, 4 * num_layers - 2 * i] for i in range(num_layers)]
    end_backward, zero_grad = 4 * num_layers + 1, 4 * num_layers + 3
    out = _Records()
    if plan.strategy in STORED_SHARDED:
        ratio = state_ratios(step, optimizer_segment_bytes(step, job, plan)).get(_GRADIENTS, 1)
        grads = [(n, g) for n, c, g in zip(trace.nbytes, trace.category, trace.layer, strict=True) if c == _GRADIENTS]
        for layer in range(num_layers - 1, -2, -1):  # backward order, the root's (-1) last
            reduced = backward[layer][1] if layer >= 0 else end_backward
            template = 0 if layer >= 0 else -1  # a decoder layer's gradients are the traced layer 0's
            for nbytes in (n for n, g in grads if g == template):
                out.add(math.ceil(nbytes * ratio), reduced, zero_grad, stream=STREAM_POST_BACKWARD)
    if _gathers(plan):
        _add_all_gathers(out, forward, backward, end_backward, step, plan)
    return out.arrays()


def _add_all_gathers(out: _Records, forward, backward, end: int, step: SingleGpuStep, plan: ParallelPlan) -> None:
    """All-gather outputs on the unshard stream: the root's for the whole pass, each layer's from the start of
    the layer before it (the prefetch) to the end of its own window (`forward`, `backward`: per layer, its
    first and last op index in that pass)."""
    layer_bytes = step.layer_bytes_per_rank(trainable=False, ep=plan.expert_parallel)
    out.add(step.root_weight_bytes, 1, end, stream=STREAM_UNSHARD)
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


def _replay(a: dict[str, np.ndarray], t_optimizer: int) -> tuple[dict[int, int], dict[int, int]]:
    """Per stream, the reserve and the peak requests of a steady-state replay of `a`; replays of the same
    allocations (other GPUs, strategies that allocate alike) are answered from memory."""
    digest = hashlib.blake2b(str(t_optimizer).encode(), digest_size=20)
    for name in ("nbytes", "t_alloc", "t_free", "kind", "stream"):
        column = np.ascontiguousarray(a[name], dtype=np.int64)
        digest.update(len(column).to_bytes(8, "little"))
        digest.update(column.tobytes())
    key = digest.digest()
    hit = _REPLAYS.get(key)
    if hit is None:
        alloc = steady_state_replay(a["nbytes"], a["t_alloc"], a["t_free"], a["kind"], t_optimizer, stream=a["stream"])
        hit = _REPLAYS[key] = (alloc.stream_reserved_bytes, alloc.stream_peak_requested_bytes)
        if len(_REPLAYS) > _REPLAYS_KEPT:
            _REPLAYS.popitem(last=False)
    else:
        _REPLAYS.move_to_end(key)
    return hit


def stream_peak_bytes(step: SingleGpuStep, job: FineTuneJob, plan: ParallelPlan) -> dict[int, int]:
    """Per stream, the most bytes the rank's full-depth segments (`rank_segment_bytes`) hold on it at once."""
    side = side_stream_keys(plan)
    out: dict[int, int] = {}
    for key, categories in step.segments.items():
        per_stream: dict[int, int] = {}
        for name, nbytes in rank_segment_bytes(categories, key, step, job, plan).items():
            stream = side.get(name, STREAM_COMPUTE)
            per_stream[stream] = per_stream.get(stream, 0) + nbytes
        for stream, nbytes in per_stream.items():
            out[stream] = max(out.get(stream, 0), nbytes)
    return out


def rank_reserved_bytes(step: SingleGpuStep, job: FineTuneJob, plan: ParallelPlan, peak_bytes: int) -> int:
    """The rank's peak reserve at full depth. Each stream's cached blocks serve that stream alone and the
    reserve never shrinks (no cache release below the device's capacity), so the peak is the sum of the
    streams' own reserves: the compute stream's full-depth allocated peak plus its excess of reserve over its
    peak requests in the replay of the step made whole; a side stream's reserve replayed at
    full depth, and at least the most bytes the rank's segments hold on that stream. At least `peak_bytes`,
    the rank's allocated peak; `peak_bytes` itself when the step carries no allocations."""
    if not step.allocations:
        return peak_bytes
    reserved, requested = _replay(rank_allocations(step, job, plan), AllocationTrace(**step.allocations).t_optimizer)
    excess = reserved.get(STREAM_COMPUTE, 0) - requested.get(STREAM_COMPUTE, 0)
    live = stream_peak_bytes(step, job, plan)
    side = full_depth_side_allocations(step, job, plan)
    replayed = _replay(side, 4 * step.num_layers + 2)[0] if len(side["nbytes"]) else {}
    side_bytes = sum(max(replayed.get(s, 0), live.get(s, 0)) for s in (STREAM_UNSHARD, STREAM_POST_BACKWARD))
    return max(peak_bytes, live.get(STREAM_COMPUTE, 0) + max(0, excess) + side_bytes)
