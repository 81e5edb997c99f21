"""Clocks for timing inside a training step without synchronising the device at every mark.

Sources and derivations: docs/profiling.md, section `tunecost.profile.timers`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class Clock(Protocol):
    def mark(self) -> int: ...

    def resolve(self) -> list[float]: ...

    def reset(self) -> None: ...


class PerfCounterClock:
    """Marks are `time.perf_counter()` readings; `resolve()` gives seconds since the first mark."""

    def __init__(self) -> None:
        self._times: list[float] = []

    def mark(self) -> int:
        self._times.append(time.perf_counter())
        return len(self._times) - 1

    def resolve(self) -> list[float]:
        if not self._times:
            return []
        t0 = self._times[0]
        return [t - t0 for t in self._times]

    def reset(self) -> None:
        self._times.clear()


class CudaEventClock:
    """Marks are CUDA events recorded on the current stream; one synchronisation in `resolve()`."""

    def __init__(self, device: Any = None, pool_size: int = 4096) -> None:
        import torch

        self._torch = torch
        self._device = torch.device(device) if device is not None else torch.device("cuda")
        self._pool: list[Any] = [torch.cuda.Event(enable_timing=True) for _ in range(pool_size)]
        self._used = 0

    def mark(self) -> int:
        if self._used == len(self._pool):  # grow rather than fail; creation is the slow part, so double
            self._pool.extend(self._torch.cuda.Event(enable_timing=True) for _ in range(len(self._pool)))
        event = self._pool[self._used]
        event.record()  # current stream of this thread (autograd's backward thread uses the forward's stream)
        self._used += 1
        return self._used - 1

    def resolve(self) -> list[float]:
        if not self._used:
            return []
        self._torch.cuda.synchronize(self._device)
        first = self._pool[0]
        return [first.elapsed_time(e) / 1e3 if i else 0.0 for i, e in enumerate(self._pool[: self._used])]

    def reset(self) -> None:
        self._used = 0


def make_clock(device: Any) -> Clock:
    """The right clock for a device: CUDA events on a CUDA device, perf_counter elsewhere."""
    return CudaEventClock(device) if str(device).startswith("cuda") else PerfCounterClock()


def synchronize(device: Any) -> None:
    """Wait for the device (a no-op on CPU): used only at the edges of a timed window."""
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize(torch.device(device))


STAGES: tuple[str, ...] = ("forward", "backward", "optimizer")


@dataclass(frozen=True, kw_only=True)
class StepTimes:
    """One training step: forward, backward, optimizer (incl. zero_grad) and the whole step, in seconds."""

    forward_seconds: float
    backward_seconds: float
    optimizer_seconds: float
    step_seconds: float

    def stage_seconds(self, stage: str) -> float:
        return {
            "forward": self.forward_seconds,
            "backward": self.backward_seconds,
            "optimizer": self.optimizer_seconds,
            "step": self.step_seconds,
        }[stage]

    @property
    def stages_sum_seconds(self) -> float:
        return self.forward_seconds + self.backward_seconds + self.optimizer_seconds


def median_step_index(steps: Sequence[StepTimes]) -> int:
    """Index of the step with the median total time (the lower median for an even count).

    Stage breakdowns are reported from this one step, so they add up to its step time, while the step time itself
    is the median over steps (medians of each stage separately need not add up).
    """
    if not steps:
        raise ValueError("no steps")
    order = sorted(range(len(steps)), key=lambda i: steps[i].step_seconds)
    return order[(len(order) - 1) // 2]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")
