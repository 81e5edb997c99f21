"""max_batch_size: the search (against synthetic peaks), a real simulated answer checked independently, and the
shortfall error when even one query does not fit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tunecost.errors import DoesNotFit
from tunecost.simulate import batch as batch_mod
from tunecost.simulate import max_batch_size, simulate_step, simulated_max_batch_size
from tunecost.workload.job import FineTuneJob, LoraConfig

GB = 10**9


class _FakeSim:
    def __init__(self, peak: int) -> None:
        self.peak_bytes, self.device_overhead_bytes, self.seq_len, self.model = peak, 0, 128, "m"
        self.peak_reserved_bytes = peak
        self.assumptions = ()


def _patch(monkeypatch, need):
    calls = []

    def fake_simulate(job, **_kw):
        calls.append(job.batch_size)
        return _FakeSim(need(job.batch_size))

    monkeypatch.setattr(batch_mod, "simulate_step", fake_simulate)
    monkeypatch.setattr(batch_mod, "default_margin_fraction", lambda: 0.0)  # the search alone
    return calls


@pytest.mark.parametrize("answer", [1, 7, 47, 300])
def test_affine_memory_needs_few_simulations(monkeypatch, answer):
    calls = _patch(monkeypatch, lambda b: 20 * GB + b * GB // 4)
    mem = 20 * GB + answer * GB // 4 + GB // 8  # fits `answer`, not answer + 1
    result = max_batch_size(FineTuneJob(model="mixtral-8x7b"), mem)
    assert result.batch_size == answer
    assert len(calls) <= 6


def test_flat_start_and_convex_memory(monkeypatch):
    # flat until 16 (a phase that does not depend on the batch), then steeper and steeper
    need = lambda b: 30 * GB + max(0, b - 16) * GB // 2 + max(0, b - 40) ** 2 * GB // 10  # noqa: E731
    calls = _patch(monkeypatch, need)
    mem = 44 * GB
    result = max_batch_size(FineTuneJob(model="mixtral-8x7b"), mem)
    assert need(result.batch_size) <= mem < need(result.batch_size + 1)
    assert len(calls) <= 10


def _stepped(fixed: int, per_batch: int, step: int):
    """An affine need rounded up to `step` bytes, as the allocator's blocks make it near a boundary."""
    return lambda b: -(-(fixed + b * per_batch) // step) * step


@settings(max_examples=200, deadline=None)
@given(
    fixed=st.integers(1, 10**10),
    per_batch=st.integers(10**4, 10**9),  # bytes per query: 10 kB (a tiny model, a few tokens) and up
    step=st.sampled_from([1, 2**21, 20 * 2**20]),  # the caching allocator's rounding: none, 2 MiB, 20 MiB
    budget=st.integers(1, 10**11),
    first=st.integers(1, 64),
)
def test_the_search_finds_the_boundary_of_a_stepped_need(fixed, per_batch, step, budget, first):
    need = _stepped(fixed, per_batch, step)
    found, asked = batch_mod.search_boundary(need, budget, first=first, max_batch=10**6)
    lo, hi = 0, 10**6  # need is monotone: the largest batch within the budget, by bisection
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if need(mid) <= budget else (lo, mid - 1)
    assert found == lo
    # doubling to the bracket (up to 20 needs here), then the line, bisecting where it stalls on the steps
    assert len(asked) <= 60


def test_shortfall_when_batch_one_does_not_fit(monkeypatch):
    _patch(monkeypatch, lambda b: 50 * GB + b)
    with pytest.raises(DoesNotFit, match=r"does not fit even at batch size 1.*short by 2\.00 GB"):
        max_batch_size(FineTuneJob(model="mixtral-8x7b"), 48 * GB)
    _patch(monkeypatch, lambda b: 60 * GB + b)  # above the A40's catalog memory (48 GiB)
    assert simulated_max_batch_size(FineTuneJob(model="mixtral-8x7b"), "a40") == 0


def test_simulated_answer_is_the_boundary(config_path):
    job = FineTuneJob(
        model=config_path("tiny-mixtral-2l"), method="qlora", batch_size=1, seq_len=64, lora=LoraConfig(rank=8)
    )
    one = simulate_step(job)
    margin = 0.25
    mem = int((one.peak_reserved_bytes + one.device_overhead_bytes + 8 * 2**20) * (1 + margin))
    result = max_batch_size(job, mem, margin_fraction=margin)
    b = result.batch_size
    at, above = simulate_step(job.with_(batch_size=b)), simulate_step(job.with_(batch_size=b + 1))

    def need(sim) -> int:
        return sim.peak_reserved_bytes + sim.device_overhead_bytes

    assert need(at) * (1 + margin) <= mem < need(above) * (1 + margin)
    assert b >= 1 and result.borderline_batch_size >= b
    border = simulate_step(job.with_(batch_size=result.borderline_batch_size + 1))
    assert need(border) > mem  # the borderline batch is the last within the card without the margin


def test_a_gpu_is_sized_against_the_memory_cuda_reports(monkeypatch):
    """A need between what CUDA reports and the datasheet's figure does not fit: the driver's reserve (and ECC's
    share) is not the process's to allocate."""
    import dataclasses

    from tunecost.catalog.gpus import get_gpu

    a100 = dataclasses.replace(get_gpu("A100-80GB"), cuda_memory_gib=79.0)  # datasheet 80
    _patch(monkeypatch, lambda b: int(79.5 * 2**30) + b)
    assert simulated_max_batch_size(FineTuneJob(model="mixtral-8x7b"), a100) == 0
    assert simulated_max_batch_size(FineTuneJob(model="mixtral-8x7b"), dataclasses.replace(a100, cuda_memory_gib=None))


def test_the_routing_note_is_for_moe_models_only(config_path) -> None:
    """QLoRA's note that routing is assumed applies to a model with experts, never to a dense one."""
    note = "routing is unknown without data"
    moe = simulate_step(FineTuneJob(model=config_path("tiny-mixtral-2l"), method="qlora", batch_size=1, seq_len=32))
    lora = LoraConfig(targets=("attention", "mlp"))
    dense = simulate_step(FineTuneJob(model="smollm2-135m", method="qlora", batch_size=1, seq_len=32, lora=lora))
    assert any(note in a for a in moe.assumptions)
    assert not any(note in a for a in dense.assumptions)
