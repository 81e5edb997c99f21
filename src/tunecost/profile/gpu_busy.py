"""GPU-busy time of a training step: how long the device actually ran work, beside the step's wall time.

Sources and derivations: docs/profiling.md, section `tunecost.profile.gpu_busy`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tunecost.profile.kernel_breakdown import _quiet_native_stderr

METHOD = "torch.profiler CUDA activity: union of kernel/memcpy/memset intervals, median over profiled steps"


@dataclass(frozen=True, kw_only=True)
class GpuBusy:
    busy_seconds: float  # median over the profiled steps of the union of device activity intervals
    per_step_seconds: tuple[float, ...]
    num_activities: int  # device activities (kernels, copies) in the median step
    method: str = METHOD


def union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by the intervals (start, end), overlaps counted once."""
    total = 0.0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


def device_intervals_seconds(events: Iterable[Any]) -> list[tuple[float, float]]:
    """(start, end) in seconds of every device-side activity among kineto events (`prof.profiler.kineto_results
    .events()`): events whose device type is not CPU, user annotations (range markers, not work) left out."""
    out = []
    for e in events:
        if str(e.device_type()).rsplit(".", 1)[-1] == "CPU":
            continue
        if getattr(e, "is_user_annotation", lambda: False)():
            continue
        start_ns = e.start_ns()
        out.append((start_ns / 1e9, (start_ns + e.duration_ns()) / 1e9))
    return out


def measure_gpu_busy(run_step: Callable[[], Any], device: str, *, steps: int = 3) -> GpuBusy | None:
    """Run `run_step()` `steps` times, each under its own torch.profiler session (CUDA activity only), and return
    the median GPU-busy time; None on a non-CUDA device."""
    if not device.startswith("cuda") or steps < 1:
        return None
    import torch
    from torch.profiler import ProfilerActivity, profile

    per_step: list[tuple[float, int]] = []
    for _ in range(steps):
        torch.cuda.synchronize()
        prof = profile(activities=[ProfilerActivity.CUDA], record_shapes=False, with_stack=False)
        with _quiet_native_stderr():  # kineto prints "profiler_start" lines straight to fd 2
            prof.start()
        try:
            run_step()
            torch.cuda.synchronize()
        finally:
            with _quiet_native_stderr():
                prof.stop()
        results = prof.profiler.kineto_results if prof.profiler is not None else None
        intervals = device_intervals_seconds(results.events() if results is not None else [])
        per_step.append((union_seconds(intervals), len(intervals)))
    busy = [b for b, _ in per_step]
    median = float(statistics.median_low(busy))
    return GpuBusy(
        busy_seconds=median,
        per_step_seconds=tuple(busy),
        num_activities=next(n for b, n in per_step if b == median),
    )
