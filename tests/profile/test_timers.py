"""Clocks and step-time helpers (tunecost.profile.timers)."""

from __future__ import annotations

import time

import pytest

from tunecost.profile.timers import PerfCounterClock, StepTimes, make_clock, median_step_index


def test_perf_counter_clock_gives_offsets_from_first_mark():
    clock = PerfCounterClock()
    a = clock.mark()
    time.sleep(0.01)
    b = clock.mark()
    times = clock.resolve()
    assert times[a] == 0.0
    assert times[b] >= 0.009
    clock.reset()
    assert clock.resolve() == []


def test_make_clock_on_cpu_is_perf_counter():
    assert isinstance(make_clock("cpu"), PerfCounterClock)


def _step(f: float, b: float, o: float, s: float) -> StepTimes:
    return StepTimes(forward_seconds=f, backward_seconds=b, optimizer_seconds=o, step_seconds=s)


def test_median_step_index_picks_the_median_total():
    steps = [_step(1, 1, 1, 9.0), _step(1, 1, 1, 3.0), _step(1, 1, 1, 5.0)]
    assert median_step_index(steps) == 2
    assert median_step_index(steps[:2]) == 1  # lower median of an even count
    with pytest.raises(ValueError):
        median_step_index([])


def test_step_times_stage_lookup():
    s = _step(0.5, 1.0, 0.25, 1.8)
    assert s.stage_seconds("backward") == 1.0
    assert s.stages_sum_seconds == pytest.approx(1.75)
