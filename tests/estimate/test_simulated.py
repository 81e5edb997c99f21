"""The `simulate` estimator (tunecost.estimate.simulated): simulator batch size, eq. (2) or cross-GPU throughput."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from tunecost.catalog.gpus import get_gpu
from tunecost.estimate import simulated
from tunecost.estimate.cost import estimate_job
from tunecost.estimate.estimators import EstimateRequest, estimator_names, get_estimator
from tunecost.simulate import max_batch_size
from tunecost.workload.job import FineTuneJob


@pytest.fixture
def fake_simulator(monkeypatch):
    import tunecost.simulate.batch as batch

    calls = []

    def fake(job, gpu, *, behaviour=None):
        calls.append((job.model, job.method, job.seq_len, job.gradient_checkpointing, gpu.name, job.stack))
        return SimpleNamespace(batch_size=6, borderline_batch_size=6, margin_fraction=0.1)

    monkeypatch.setattr(batch, "gpu_max_batch", fake)
    monkeypatch.setattr(simulated, "gpu_max_batch", fake)
    return calls


def test_registered_with_a_description() -> None:
    assert "simulate" in estimator_names()
    assert get_estimator("simulate") is simulated.simulate_estimator


def test_batch_from_the_simulator_on_todays_stack_and_eq2_where_fitted(fake_simulator, make_request) -> None:
    point = simulated.simulate_estimator(make_request())
    assert fake_simulator == [("mixtral-8x7b", "qlora", 512, True, "A40-48GB", "tunecost")]
    assert point.max_batch_size == point.batch_size == 6
    assert "step simulator (tunecost stack, 512 tokens per query" in point.notes[0]
    assert any(n.startswith("eq. (2)") for n in point.notes) and point.queries_per_s > 0
    assert point.queries_per_s_interval is None


def test_other_gpus_take_the_cross_gpu_throughput_model(fake_simulator, make_request) -> None:
    point = simulated.simulate_estimator(make_request(gpu="H100", seq_len=256))
    assert fake_simulator[0][2] == 256
    assert any("cross-GPU model" in n for n in point.notes)
    lo, hi = point.queries_per_s_interval
    assert lo < point.queries_per_s < hi


def test_full_fine_tune_simulates_without_checkpointing(fake_simulator, make_request) -> None:
    simulated.simulate_estimator(make_request(model="blackmamba-2.8b", method="full"))
    assert fake_simulator[0][1:4] == ("full", 512, False)


def test_does_not_fit_is_a_row_not_a_crash(monkeypatch, make_request) -> None:
    import tunecost.simulate.batch as batch

    monkeypatch.setattr(batch, "gpu_max_batch", lambda job, gpu, *, behaviour=None: None)
    monkeypatch.setattr(simulated, "gpu_max_batch", lambda job, gpu, *, behaviour=None: None)
    point = simulated.simulate_estimator(make_request())
    assert point.max_batch_size == 0 and point.queries_per_s is None
    assert "does not fit" in point.notes[-1]


def test_real_simulation_of_a_tiny_model_on_a_small_gpu() -> None:
    """No fakes: the estimator's batch is the simulator's boundary (fits at B, not at B + 1)."""
    gpu = dataclasses.replace(get_gpu("A40"), memory_gib=1.2)
    point = simulated.simulate_estimator(
        EstimateRequest(job=estimate_job("tiny-mixtral", experts_per_token=2, dataset="math_14k", seq_len=128), gpu=gpu)
    )
    job = FineTuneJob(model="tiny-mixtral", method="qlora", experts_per_token=2, seq_len=128)
    result = max_batch_size(job.with_(stack="tunecost"), gpu.usable_memory_bytes)
    assert point.max_batch_size == result.batch_size >= 1
    assert result.need_bytes * (1 + result.margin_fraction) <= gpu.usable_memory_bytes
    nxt = result.next_batch_need_bytes
    assert nxt is None or nxt * (1 + result.margin_fraction) > gpu.usable_memory_bytes
