"""Throughput targets with a dataset's real lengths (calibrate.throughput_target(lengths=...) and job_for): each
batch padded to its longest query, rounded up to a multiple of 8, cut at seq_len when one is given."""

from __future__ import annotations

import pytest

from tunecost.estimate.calibrated import calibrated_model
from tunecost.estimate.throughput.calibrate import CalibratedModel
from tunecost.estimate.throughput.targets import job_for, throughput_target

SHORT = (24,) * 30 + (120,) * 2  # mostly short queries, two long ones
BATCH = 4


@pytest.fixture(autouse=True)
def no_user_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TUNECOST_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def model() -> CalibratedModel:
    return calibrated_model()  # the bundled measurements (the paper's A40 and A100-40GB points)


def target(**kw):
    return throughput_target(model="mixtral-8x7b", gpu="A40", batch_size=BATCH, **kw)


def test_padded_tokens_by_hand():
    # half 8, half 24 tokens, batch 2: E[max] = 24 (1 - 1/4) + 8 / 4 = 20 tokens, so 40 tokens per step
    job, counts = job_for(throughput_target(model="mixtral-8x7b", gpu="A40", batch_size=2, lengths=(8, 24)))
    assert counts.lengths.tokens_per_step == pytest.approx(40.0)
    assert counts.lengths.mean_len_tokens == pytest.approx(16.0)
    assert job.seq_len == 24  # no seq_len: cut at the longest query


def test_short_lengths_cost_less_than_padding_to_the_longest(model: CalibratedModel):
    real = model.predict(target(lengths=SHORT))
    fixed = model.predict(target(seq_len=max(SHORT)))
    assert real.counts.lengths.tokens_per_step < fixed.counts.lengths.tokens_per_step == BATCH * max(SHORT)
    assert real.queries_per_s > fixed.queries_per_s
    assert "measured lengths" in real.counts.lengths.source


def test_seq_len_is_the_cutoff(model: CalibratedModel):
    # cut at 32: 24 -> 24, 120 -> 32; E[max of 4] = 32 (1 - (30/32)^4) + 24 (30/32)^4
    job, counts = job_for(target(lengths=SHORT, seq_len=32))
    share = (30 / 32) ** BATCH
    assert counts.lengths.tokens_per_step == pytest.approx(BATCH * (32 * (1 - share) + 24 * share))
    assert job.seq_len == 32
    assert counts.lengths.mean_len_tokens == pytest.approx((30 * 24 + 2 * 32) / 32)
    cut = model.predict(target(lengths=SHORT, seq_len=32))
    assert cut.queries_per_s > model.predict(target(lengths=SHORT)).queries_per_s


def test_lengths_with_a_dataset_name_use_the_lengths(model: CalibratedModel):
    named = model.predict(target(lengths=SHORT, dataset="mydata.jsonl"))
    assert named.counts.lengths.source.startswith("mydata.jsonl: measured lengths")
    assert named.queries_per_s == pytest.approx(model.predict(target(lengths=SHORT)).queries_per_s)
