"""Measure the peak memory of the same training step on real CPU tensors, independently of the simulator's
recorder: PyTorch's CPU allocator reports every allocation and free to the profiler
(`torch.profiler.profile(profile_memory=True)`); the running sum of those events, plus the bytes alive before
the profiled step (parameters, buffers, optimizer states and the batch, summed over distinct storages), is the
peak. Used by benchmarks/bench_memory.py and the tests; tiny models only (real weights in fp32 on the CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tunecost.simulate.behaviour import DEFAULT_BEHAVIOUR, StackBehaviour
from tunecost.simulate.prepare import build_prepared
from tunecost.simulate.step import make_batch, optimizer_state_tensors, run_step
from tunecost.workload.job import FineTuneJob


@dataclass(frozen=True, kw_only=True)
class MeasuredPeak:
    peak_bytes: int
    static_bytes: int  # alive before the step: weights, states, batch
    step_peak_bytes: int  # highest running total of the profiled step's own allocations
    num_events: int


def _storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        st = t.untyped_storage()
        key = st.data_ptr()
        if key not in seen and st.nbytes():
            seen.add(key)
            total += st.nbytes()
    return total


def allocation_peak_bytes(fn: Callable[[], Any]) -> tuple[int, int]:
    """(highest running total of the CPU allocations `fn()` makes, number of allocator events), from the
    profiler's memory events; whatever `fn` returns is dropped inside the profiled window."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [
        (e.start_ns(), i, e.nbytes())
        for i, e in enumerate(prof.profiler.kineto_results.events())
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    ]
    events.sort()
    running = best = 0
    for _, _, nbytes in events:
        running += nbytes
        best = max(best, running)
    return best, len(events)


def profile_step_peak(prepared, batch: dict) -> MeasuredPeak:
    """Run one step of a real-tensor `prepared` model under the profiler and return its peak."""
    model = prepared.model
    tensors = list(model.parameters()) + list(model.buffers()) + optimizer_state_tensors(prepared.optimizer)
    static = _storage_bytes(tensors + list(batch.values()))
    best, num_events = allocation_peak_bytes(lambda: run_step(prepared, batch))
    return MeasuredPeak(peak_bytes=static + best, static_bytes=static, step_peak_bytes=best, num_events=num_events)


def measure_step_peak(
    job: FineTuneJob, *, behaviour: StackBehaviour = DEFAULT_BEHAVIOUR, seed: int = 0
) -> MeasuredPeak:
    """Build `job`'s model at full depth with real random fp32-or-job-dtype CPU tensors, run one warm-up step,
    then measure the next step's peak."""
    prepared = build_prepared(job, num_units=None, behaviour=behaviour, real=True, seed=seed)
    config: Any = prepared.model.config  # a transformers or BlackMamba config
    vocab = int(config.vocab_size)
    batch = make_batch(vocab, job.batch_size, job.worst_case_seq_len, None, seed)
    run_step(prepared, batch)  # warm-up: lazily created buffers exist before the measured step
    return profile_step_peak(prepared, batch)
