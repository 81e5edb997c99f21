"""The largest batch that fits a GPU, from simulated steps.

Sources and derivations: docs/memory-model.md, section `tunecost.simulate.batch`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tunecost.catalog.gpus import GPU, resolve_gpu_name
from tunecost.catalog.memory_margin import default_memory_margin
from tunecost.catalog.memory_margin import margin_note as memory_margin_note
from tunecost.errors import DoesNotFit
from tunecost.limits import MAX_BATCH_SIZE
from tunecost.simulate.behaviour import DEFAULT_BEHAVIOUR, StackBehaviour
from tunecost.simulate.overhead import DEFAULT_OVERHEAD, DeviceOverhead
from tunecost.simulate.simulator import StepSimulation, simulate_step
from tunecost.units import format_bytes
from tunecost.workload.job import FineTuneJob


def device_need_bytes(peak_reserved_bytes: int, outside_allocator_bytes: int) -> int:
    """What a step takes from the device: the allocator's reserve plus what it never sees (CUDA context, NCCL)."""
    return peak_reserved_bytes + outside_allocator_bytes


def fits_with_margin(need_bytes: int, gpu_memory_bytes: int, margin_fraction: float) -> bool:
    """A need fits when it stays within the card with the safety margin on top."""
    return need_bytes * (1.0 + margin_fraction) <= gpu_memory_bytes


def fit_verdict(need_bytes: int, gpu_memory_bytes: int, margin_fraction: float) -> str:
    """ "yes" (fits with the margin), "borderline" (fits only inside the margin) or "no"."""
    if fits_with_margin(need_bytes, gpu_memory_bytes, margin_fraction):
        return "yes"
    return "borderline" if need_bytes <= gpu_memory_bytes else "no"


def default_margin_fraction() -> float:
    return default_memory_margin().fraction


@dataclass(frozen=True, kw_only=True)
class MaxBatchResult:
    """The largest batch that fits with the margin at the worst-case length, the largest that fits only inside
    the margin (borderline), and the evidence (every simulated (batch, need))."""

    batch_size: int  # 0: not even one query fits with the margin
    borderline_batch_size: int  # largest batch within the card without the margin (>= batch_size)
    margin_fraction: float
    seq_len: int
    gpu_memory_bytes: int
    peak_bytes: int  # simulated tensor peak at batch_size (at the borderline batch when batch_size is 0)
    peak_reserved_bytes: int
    device_overhead_bytes: int
    next_batch_need_bytes: int | None  # need at batch_size + 1 (does not fit with the margin); None at the cap
    bytes_per_sample: float  # local slope of need(B) at the answer (simulations next to it)
    fixed_bytes: float  # need(0) extrapolated along that slope
    simulations: tuple[tuple[int, int], ...]  # (batch size, need: reserved + overhead)
    seconds_taken: float
    assumptions: tuple[str, ...] = field(default=())

    @property
    def need_bytes(self) -> int:
        return device_need_bytes(self.peak_reserved_bytes, self.device_overhead_bytes)

    @property
    def headroom_bytes(self) -> int:
        return self.gpu_memory_bytes - self.need_bytes

    def to_dict(self) -> dict[str, Any]:
        """The answer and its evidence as plain data (`tunecost memory --json`'s `max_batch`), sizes in bytes."""
        shown = (
            "batch_size",
            "borderline_batch_size",
            "margin_fraction",
            "seq_len",
            "peak_bytes",
            "peak_reserved_bytes",
            "device_overhead_bytes",
            "need_bytes",
            "headroom_bytes",
            "next_batch_need_bytes",
        )
        return {**{name: getattr(self, name) for name in shown}, "simulations": [list(s) for s in self.simulations]}


def _need(sim: StepSimulation) -> int:
    return device_need_bytes(sim.peak_reserved_bytes, sim.device_overhead_bytes)


def max_batch_size(
    job: FineTuneJob,
    gpu_memory_bytes: int,
    *,
    behaviour: StackBehaviour = DEFAULT_BEHAVIOUR,
    overhead: DeviceOverhead = DEFAULT_OVERHEAD,
    margin_fraction: float | None = None,
    num_layers_to_trace: int | None = None,
    max_batch: int = MAX_BATCH_SIZE,
    use_cache: bool = True,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> MaxBatchResult:
    """Largest B whose need fits `gpu_memory_bytes` with the margin (default: `catalog.memory_margin`), and the
    largest within it without; `DoesNotFit` when B=1 does not fit even without the margin."""
    start = time.perf_counter()
    margin = default_margin_fraction() if margin_fraction is None else margin_fraction
    sims: dict[int, StepSimulation] = {}

    def need(b: int) -> int:
        if b not in sims:
            if on_progress:
                on_progress(len(sims), len(sims) + 2, f"simulating batch {b}")
            sims[b] = simulate_step(
                job.with_(batch_size=b),
                num_layers_to_trace=num_layers_to_trace,
                behaviour=behaviour,
                overhead=overhead,
                use_cache=use_cache,
            )
        return _need(sims[b])

    lo, hi = search_with_margin(need, gpu_memory_bytes, margin, first=job.batch_size, max_batch=max_batch)
    if hi == 0:
        s, n1 = sims[1], need(1)
        raise DoesNotFit(
            f"{s.model} ({job.method}, {s.seq_len} tokens per query) does not fit even at batch size 1: needs "
            f"{format_bytes(n1)} ({format_bytes(s.peak_reserved_bytes)} reserved by the allocator + "
            f"{format_bytes(s.device_overhead_bytes)} device overhead) but the GPU has "
            f"{format_bytes(gpu_memory_bytes)}: short by {format_bytes(n1 - gpu_memory_bytes)}"
        )
    at = lo or hi
    best = sims[at]
    above = [b for b in sims if b > at]
    other = min(above) if above else max((b for b in sims if b < at), default=at)
    slope = (need(other) - need(at)) / (other - at) if other != at else 0.0  # local slope at the answer
    return MaxBatchResult(
        batch_size=lo,
        borderline_batch_size=hi,
        margin_fraction=margin,
        seq_len=best.seq_len,
        gpu_memory_bytes=gpu_memory_bytes,
        peak_bytes=best.peak_bytes,
        peak_reserved_bytes=best.peak_reserved_bytes,
        device_overhead_bytes=best.device_overhead_bytes,
        next_batch_need_bytes=need(lo + 1) if (lo + 1) in sims else None,
        bytes_per_sample=slope,
        fixed_bytes=need(at) - slope * at,
        simulations=tuple((b, _need(sims[b])) for b in sorted(sims)),
        seconds_taken=time.perf_counter() - start,
        assumptions=(*best.assumptions, margin_note(margin)),
    )


def margin_note(margin_fraction: float) -> str:
    m = default_memory_margin()
    if margin_fraction == m.fraction:
        return memory_margin_note(m)
    return f"safety margin {100 * margin_fraction:g} % (given)"


def search_with_margin(
    need: Callable[[int], int], budget: int, margin_fraction: float, *, first: int = 1, max_batch: int = MAX_BATCH_SIZE
) -> tuple[int, int]:
    """(largest B that fits with the margin, largest B within `budget` without it): two boundaries of one
    need curve, the second search starting where the first ended (its simulations are shared)."""
    with_margin = int(budget / (1.0 + margin_fraction))
    lo, _ = search_boundary(need, with_margin, first=first, max_batch=max_batch)
    if with_margin >= budget or lo == max_batch:
        return lo, lo
    hi, _ = search_boundary(need, budget, first=max(lo, 1), max_batch=max_batch)
    return lo, max(hi, lo)


def search_boundary(
    need: Callable[[int], int], budget: int, *, first: int = 1, max_batch: int = MAX_BATCH_SIZE
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
    # Near the boundary the need rises in steps, and a line from a far end lands past it again and again. Illinois:
    # when the same end of the bracket moves twice running, the other end's distance from the budget is halved in
    # the line; a fitting batch with the need of the last (a plateau) or three probes that do not halve the bracket
    # are followed by a bisection, so no search walks one batch at a time.
    weights, last_side, widths = {"lo": 1.0, "hi": 1.0}, "", []
    while probe is not None and probe <= max_batch:
        fits = asked(probe) <= budget
        bracketed = hi is not None
        plateau = fits and lo > 0 and asked(lo) == needs[probe]  # a step of the need: the line says nothing
        if fits:
            lo = probe
        else:
            hi = probe
        if hi is not None:
            widths.append(hi - lo)
        slow = len(widths) >= 4 and widths[-1] > widths[-4] // 2
        if hi is not None and hi - lo > 1 and (plateau or slow):
            probe, predicted = (lo + hi) // 2, None
            continue
        if fits and probe == predicted and (hi is None or probe + 1 < hi):
            probe, predicted = probe + 1, None  # the line was right so far: confirm the boundary
            continue
        side = "lo" if fits else "hi"
        weights[side] = 1.0
        if bracketed and side == last_side:
            weights["hi" if fits else "lo"] /= 2
        last_side = side if bracketed else ""
        probe, predicted = _next_probe(asked, sorted(needs), lo, hi, budget, max_batch, weights)
    return lo, needs


def _next_probe(
    need: Callable[[int], int],
    simulated: list[int],
    lo: int,
    hi: int | None,
    mem: int,
    cap: int,
    weights: dict[str, float] | None = None,
) -> tuple[int | None, int | None]:
    """Next batch to simulate, strictly inside the bracket (lo fits, hi does not): where the line through the two
    simulations nearest the boundary reaches `mem` (and that guess when it was not clamped). None when closed.
    `weights` scale each end's distance from `mem` (Illinois, `search_boundary`)."""
    if hi is not None and hi - lo <= 1:
        return None, None
    upper = hi - 1 if hi is not None else min(cap, 8 * lo)  # a flat start must not send the search to the cap
    if lo >= upper:
        return None, None
    if hi is not None and weights and (weights["lo"], weights["hi"]) != (1.0, 1.0):
        below, above = (mem - need(lo)) * weights["lo"], (need(hi) - mem) * weights["hi"]
        guess: int | None = lo + int((hi - lo) * below / (below + above))
    else:
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
    behaviour: StackBehaviour = DEFAULT_BEHAVIOUR,
) -> int:
    """Largest batch of `job` that fits `gpu_memory_bytes` with the margin, 0 when none does (not an error)."""
    try:
        return max_batch_size(job, gpu_memory_bytes, behaviour=behaviour).batch_size
    except DoesNotFit:
        return 0


def gpu_max_batch(job: FineTuneJob, gpu, *, behaviour: StackBehaviour = DEFAULT_BEHAVIOUR) -> MaxBatchResult | None:
    """`max_batch_size` against a catalog GPU (or its name): the memory CUDA reports for it (`usable_memory_bytes`);
    None when not even one query fits inside the card."""
    gpu_obj = gpu if isinstance(gpu, GPU) else resolve_gpu_name(str(gpu)).gpu
    try:
        return max_batch_size(job, gpu_obj.usable_memory_bytes, behaviour=behaviour)
    except DoesNotFit:
        return None


def simulated_max_batch_size(job: FineTuneJob, gpu, *, behaviour: StackBehaviour = DEFAULT_BEHAVIOUR) -> int:
    """Largest batch of `job` that fits `gpu` with the margin, 0 when none does."""
    best = gpu_max_batch(job, gpu, behaviour=behaviour)
    return best.batch_size if best is not None else 0
