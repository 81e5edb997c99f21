"""The largest batch that fits a GPU, from simulated steps.

Padding to the longest query in a batch makes every batch B x L_max(batch) tokens, and some batch holds the
dataset's longest query, so the batch that decides whether a run fits is B x (longest query): simulate at that
length (`FineTuneJob.worst_case_seq_len`). Peak memory is close to affine in the batch size (fixed weights and
states, per-sample activations), so two simulations give a first guess, and simulations at the guess and one above
it confirm the answer (more when the peak's slope changes, e.g. a steeper phase takes over at large batches).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tunecost.errors import DoesNotFit
from tunecost.simulate.behaviour import DEFAULT_BEHAVIOUR, StackBehaviour
from tunecost.simulate.overhead import DEFAULT_OVERHEAD, DeviceOverhead
from tunecost.simulate.simulator import StepSimulation, simulate_step
from tunecost.units import format_bytes
from tunecost.workload.job import DEFAULT_STACK, FineTuneJob

MAX_BATCH = 65536


@dataclass(frozen=True, kw_only=True)
class MaxBatchResult:
    """The largest fitting batch at the worst-case length, and the evidence (every simulated (batch, need))."""

    batch_size: int
    seq_len: int
    gpu_memory_bytes: int
    peak_bytes: int  # simulated tensor peak at batch_size
    device_overhead_bytes: int
    next_batch_need_bytes: int | None  # peak + overhead at batch_size + 1 (does not fit); None at the cap
    bytes_per_sample: float  # local slope of need(B) at the answer (simulations next to it)
    fixed_bytes: float  # need(0) extrapolated along that slope
    simulations: tuple[tuple[int, int], ...]  # (batch size, peak + overhead)
    seconds_taken: float
    assumptions: tuple[str, ...] = field(default=())

    @property
    def headroom_bytes(self) -> int:
        return self.gpu_memory_bytes - self.peak_bytes - self.device_overhead_bytes

    def to_dict(self) -> dict[str, Any]:
        """The answer and its evidence as plain data (`tunecost memory --json`'s `max_batch`), sizes in bytes."""
        shown = (
            "batch_size",
            "seq_len",
            "peak_bytes",
            "device_overhead_bytes",
            "headroom_bytes",
            "next_batch_need_bytes",
        )
        return {**{name: getattr(self, name) for name in shown}, "simulations": [list(s) for s in self.simulations]}


def _need(sim: StepSimulation) -> int:
    return sim.peak_bytes + sim.device_overhead_bytes


def max_batch_size(
    job: FineTuneJob,
    gpu_memory_bytes: int,
    *,
    stack: str = DEFAULT_STACK,
    behaviour: StackBehaviour = DEFAULT_BEHAVIOUR,
    overhead: DeviceOverhead = DEFAULT_OVERHEAD,
    num_layers_to_trace: int | None = None,
    max_batch: int = MAX_BATCH,
    use_cache: bool = True,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> MaxBatchResult:
    """Largest B with simulated peak(B) + device overhead <= gpu_memory_bytes; `DoesNotFit` when B=1 does not fit."""
    start = time.perf_counter()
    sims: dict[int, StepSimulation] = {}

    def need(b: int) -> int:
        if b not in sims:
            if on_progress:
                on_progress(len(sims), len(sims) + 2, f"simulating batch {b}")
            sims[b] = simulate_step(
                job.with_(batch_size=b),
                num_layers_to_trace=num_layers_to_trace,
                stack=stack,
                behaviour=behaviour,
                overhead=overhead,
                use_cache=use_cache,
            )
        return _need(sims[b])

    lo, _ = search_boundary(need, gpu_memory_bytes, first=job.batch_size, max_batch=max_batch)
    if lo == 0:
        s, n1 = sims[1], need(1)
        raise DoesNotFit(
            f"{s.model} ({job.method}, {s.seq_len} tokens per query) does not fit even at batch size 1: needs "
            f"{format_bytes(n1)} ({format_bytes(s.peak_bytes)} simulated peak + "
            f"{format_bytes(s.device_overhead_bytes)} device overhead) but the GPU has "
            f"{format_bytes(gpu_memory_bytes)}: short by {format_bytes(n1 - gpu_memory_bytes)}"
        )
    best = sims[lo]
    above = [b for b in sims if b > lo]
    other = min(above) if above else max((b for b in sims if b < lo), default=lo)
    slope = (need(other) - need(lo)) / (other - lo) if other != lo else 0.0  # local slope at the answer
    return MaxBatchResult(
        batch_size=lo,
        seq_len=best.seq_len,
        gpu_memory_bytes=gpu_memory_bytes,
        peak_bytes=best.peak_bytes,
        device_overhead_bytes=best.device_overhead_bytes,
        next_batch_need_bytes=need(lo + 1) if (lo + 1) in sims else None,
        bytes_per_sample=slope,
        fixed_bytes=need(lo) - slope * lo,
        simulations=tuple((b, _need(sims[b])) for b in sorted(sims)),
        seconds_taken=time.perf_counter() - start,
        assumptions=best.assumptions,
    )


def search_boundary(
    need: Callable[[int], int], budget: int, *, first: int = 1, max_batch: int = MAX_BATCH
) -> tuple[int, dict[int, int]]:
    """Largest batch size B <= max_batch with need(B) <= budget (0 when B = 1 does not fit), and every need asked.

    Assumes need(B) grows with B. Starts at `first` (clamped to 1..max_batch), then simulates where the line
    through the two simulations nearest the boundary reaches the budget, and confirms the boundary (B fits,
    B + 1 does not) unless B is `max_batch`.
    """
    needs: dict[int, int] = {}

    def asked(b: int) -> int:
        if b not in needs:
            needs[b] = need(b)
        return needs[b]

    lo, hi = 0, None  # lo fits; hi (when known) does not
    first = min(max_batch, max(1, first))  # the job's own batch: usually simulated already (cached)
    if first > 1:
        if asked(first) <= budget:
            lo = first
        else:
            hi = first
    if lo == 0:
        if asked(1) > budget:
            return 0, needs
        lo = 1
    if hi is not None:
        probe, predicted = _next_probe(asked, sorted(needs), lo, hi, budget, max_batch)
    else:
        probe, predicted = min(max_batch, 2 * lo), None
    while probe is not None and probe <= max_batch:
        fits = asked(probe) <= budget
        if fits:
            lo = probe
        else:
            hi = probe
        if fits and probe == predicted and (hi is None or probe + 1 < hi):
            probe, predicted = probe + 1, None  # the line was right so far: confirm the boundary
            continue
        probe, predicted = _next_probe(asked, sorted(needs), lo, hi, budget, max_batch)
    return lo, needs


def _next_probe(
    need: Callable[[int], int], simulated: list[int], lo: int, hi: int | None, mem: int, cap: int
) -> tuple[int | None, int | None]:
    """Next batch to simulate, strictly inside the bracket (lo fits, hi does not): where the line through the two
    simulations nearest the boundary reaches `mem` (and that guess when it was not clamped). None when closed."""
    if hi is not None and hi - lo <= 1:
        return None, None
    upper = hi - 1 if hi is not None else min(cap, 8 * lo)  # a flat start must not send the search to the cap
    if lo >= upper:
        return None, None
    guess = _line_guess(need, simulated, lo, hi, mem)
    if guess is None:  # flat so far: grow geometrically
        return min(2 * lo, upper), None
    probe = min(max(guess, lo + 1), upper)
    return probe, (guess if probe == guess else None)


def _line_guess(need: Callable[[int], int], simulated, lo: int, hi: int | None, mem: int) -> int | None:
    """Largest batch under `mem` on the line through lo and the nearest other simulated batch (None: flat)."""
    b1 = hi if hi is not None else max(b for b in simulated if b < lo)
    slope = (need(b1) - need(lo)) / (b1 - lo)
    return lo + int((mem - need(lo)) // slope) if slope > 0 else None


def fitting_batch_size(
    job: FineTuneJob,
    gpu_memory_bytes: int,
    *,
    stack: str = DEFAULT_STACK,
    behaviour: StackBehaviour = DEFAULT_BEHAVIOUR,
) -> int:
    """Largest batch of `job` that fits `gpu_memory_bytes`, 0 when not even one query fits (not an error)."""
    try:
        return max_batch_size(job, gpu_memory_bytes, stack=stack, behaviour=behaviour).batch_size
    except DoesNotFit:
        return 0


def simulated_max_batch_size(
    job: FineTuneJob, gpu, *, stack: str = DEFAULT_STACK, behaviour: StackBehaviour = DEFAULT_BEHAVIOUR
) -> int:
    """Largest batch of `job` that fits `gpu` (a catalog GPU or its name), 0 when not even one query fits.
    The GPU's memory is the catalog's `usable_memory_bytes` (the total CUDA reports, where the catalog has it)."""
    from tunecost.catalog.gpus import GPU, resolve_gpu_name

    gpu_obj = gpu if isinstance(gpu, GPU) else resolve_gpu_name(str(gpu)).gpu
    return fitting_batch_size(job, gpu_obj.usable_memory_bytes, stack=stack, behaviour=behaviour)
