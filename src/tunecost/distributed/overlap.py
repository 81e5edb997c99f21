"""How much communication a data-parallel step hides under compute.

Sources and derivations: docs/multi-gpu.md, section `tunecost.distributed.overlap`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tunecost.errors import TunecostError


@dataclass(frozen=True, kw_only=True)
class StepTime:
    compute_seconds: float  # forward + backward + optimizer compute, no communication
    step_seconds: float
    bubble_seconds: float = 0.0  # a pipeline's idle time (fill and drain)

    @property
    def exposed_comm_seconds(self) -> float:
        return self.step_seconds - self.compute_seconds - self.bubble_seconds

    @property
    def exposed_comm_share(self) -> float:
        return self.exposed_comm_seconds / self.step_seconds if self.step_seconds else 0.0


def _check(*lists: Sequence[float]) -> int:
    n = len(lists[0])
    if n == 0 or any(len(x) != n for x in lists):
        raise TunecostError("per-unit times must be non-empty lists of the same length")
    if any(v < 0 for x in lists for v in x):
        raise TunecostError("times must be non-negative")
    return n


def fsdp_step_seconds(
    forward_seconds: Sequence[float],
    backward_seconds: Sequence[float],
    all_gather_seconds: Sequence[float],
    reduce_scatter_seconds: Sequence[float],
    optimizer_seconds: float,
    *,
    reshard_after_forward: bool = True,
) -> StepTime:
    """One FSDP2 step from per-unit times in forward order (see docs/multi-gpu.md)."""
    n = _check(forward_seconds, backward_seconds, all_gather_seconds, reduce_scatter_seconds)
    fwd, bwd, ag, rs = forward_seconds, backward_seconds, all_gather_seconds, reduce_scatter_seconds
    # forward: AG_0 exposed, then unit i's compute overlaps AG_{i+1}
    forward = ag[0] + sum(max(fwd[i], ag[i + 1] if i + 1 < n else 0.0) for i in range(n))
    # backward, units n-1 .. 0; with resharding, AG_{n-1} is exposed and AG_{j-1} is prefetched under unit j
    backward = ag[n - 1] if reshard_after_forward else 0.0
    for j in range(n - 1, -1, -1):
        prefetch = ag[j - 1] if reshard_after_forward and j > 0 else 0.0
        previous_rs = rs[j + 1] if j + 1 < n else 0.0
        backward += max(bwd[j], prefetch + previous_rs)
    backward += rs[0]  # the last reduce-scatter: nothing left to hide it
    compute = sum(fwd) + sum(bwd) + optimizer_seconds
    return StepTime(compute_seconds=compute, step_seconds=forward + backward + optimizer_seconds)


def ddp_step_seconds(
    forward_seconds: float,
    backward_seconds: float,
    bucket_all_reduce_seconds: Sequence[float],
    optimizer_seconds: float,
) -> StepTime:
    """One DDP step: buckets but the last all-reduce under backward, the last one after it."""
    if forward_seconds < 0 or backward_seconds < 0 or optimizer_seconds < 0:
        raise TunecostError("times must be non-negative")
    buckets = list(bucket_all_reduce_seconds)
    if any(b < 0 for b in buckets):
        raise TunecostError("times must be non-negative")
    hidden = sum(buckets[:-1])
    last = buckets[-1] if buckets else 0.0
    step = forward_seconds + max(backward_seconds, hidden) + last + optimizer_seconds
    return StepTime(compute_seconds=forward_seconds + backward_seconds + optimizer_seconds, step_seconds=step)
