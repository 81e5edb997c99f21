"""Acceptance 1 (fast subset; `benchmarks/bench_memory.py` runs the full table): the simulated peak of a step on
fake tensors equals, within 3 %, the peak of the same step on real CPU tensors as PyTorch's CPU allocator reports
it to the profiler (an independent measurement: allocator events, not our recorder)."""

from __future__ import annotations

import pytest

from tunecost.simulate import simulate_step
from tunecost.simulate.measure import measure_step_peak
from tunecost.workload.job import FineTuneJob, LoraConfig

CASES = [
    ("tiny-mixtral-2l", dict(method="full", gradient_checkpointing=False)),
    ("tiny-olmoe", dict(method="qlora", gradient_checkpointing=True)),
    ("tiny-qwen2-moe", dict(method="lora", gradient_checkpointing=True, experts_per_token=8)),
    ("tiny-qwen2-moe", dict(method="qlora", gradient_checkpointing=False, experts_per_token=8)),
    ("tiny-deepseek-v3", dict(method="lora", gradient_checkpointing=False)),
    ("tiny-glm4-moe", dict(method="full", gradient_checkpointing=True)),
]


@pytest.mark.parametrize(("model", "options"), CASES)
def test_simulated_peak_matches_cpu_allocator(model, options, config_path):
    job = FineTuneJob(
        model=config_path(model), compute_dtype="fp32", batch_size=2, seq_len=16, lora=LoraConfig(rank=8), **options
    )
    simulated = simulate_step(job, num_layers_to_trace=99, granule_bytes=1, use_cache=False)
    measured = measure_step_peak(job)
    assert measured.num_events > 100  # the profiler did see the step's allocations
    assert abs(simulated.peak_bytes - measured.peak_bytes) <= 0.03 * measured.peak_bytes
