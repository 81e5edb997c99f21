"""Packed rows: best-fit decreasing by hand, the queries a row holds, and what packing changes in a step's work."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tunecost.errors import TunecostError
from tunecost.estimate.throughput.counts import analytic_step_counts
from tunecost.estimate.throughput.lengths import fixed_lengths
from tunecost.estimate.throughput.packing import (
    job_packed_lengths,
    packed_lengths,
    packed_rows,
    queries_per_row,
)
from tunecost.models.catalog import resolve_model
from tunecost.workload.job import FineTuneJob
from tunecost.workload.run_length import run_length


def test_best_fit_decreasing_by_hand() -> None:
    assert packed_rows([5, 5, 5, 5], 10) == 2
    assert packed_rows([6, 6, 6], 10) == 3  # no two fit together
    # longest first: 7 and 6 open rows; 4 fills the 6's row (room 4) exactly, 3 fills the 7's
    assert packed_rows([3, 7, 4, 6], 10) == 2
    assert packed_rows([15, 2], 10) == 2  # a query longer than the row is cut to it and fills one
    with pytest.raises(TunecostError):
        packed_rows([1], 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=200), st.integers(16, 512))
def test_rows_hold_every_token_and_waste_at_most_half_a_row_each(lengths: list[int], row: int) -> None:
    tokens = sum(min(n, row) for n in lengths)
    rows = packed_rows(lengths, row)
    assert math.ceil(tokens / row) <= rows <= len(lengths)
    assert rows <= 2 * tokens / row + 1  # any-fit: no two rows are both at most half full


def test_a_packed_row_holds_the_queries_and_their_attention() -> None:
    lengths = [100, 300, 200, 400] * 50  # 50,000 tokens: 25 rows of 2000 exactly (400 + 300 + ... fit in pairs)
    per_doc = packed_lengths(lengths, 2000, 4, per_document=True, source="x")
    assert per_doc.queries_per_row == pytest.approx(200 / 25)
    assert per_doc.attention_seqs_per_row == per_doc.queries_per_row
    assert per_doc.tokens_per_step == 4 * 2000
    assert per_doc.mean_sq_len_tokens2 == pytest.approx((100**2 + 300**2 + 200**2 + 400**2) / 4)
    across = packed_lengths(lengths, 2000, 4, per_document=False, source="x")
    assert (across.attention_seqs_per_row, across.mean_sq_len_tokens2) == (1.0, 2000.0**2)
    assert across.queries_per_row == per_doc.queries_per_row
    assert "8.00 queries per row, 100.0% full" in per_doc.source


def _job(**kw) -> FineTuneJob:
    base = {"model": "mistral-7b-v0.1", "method": "lora", "batch_size": 2, "seq_len": 2048, "dataset": "gsm8k-train"}
    return FineTuneJob(**{**base, **kw})


def test_rows_across_documents_cost_what_full_rows_cost_and_carry_more_queries() -> None:
    spec = resolve_model("mistral-7b-v0.1")
    packed = _job(packing="cross-document")
    rows = analytic_step_counts(spec, packed)
    full = analytic_step_counts(spec, _job(), fixed_lengths(2048, 2))
    assert rows.flops_by_class == full.flops_by_class and rows.bytes_by_class == full.bytes_by_class
    assert rows.queries_per_step == pytest.approx(2 * queries_per_row(packed))
    assert queries_per_row(packed) > 9  # gsm8k-train: ~200 tokens a query in 2048-token rows
    per_doc = analytic_step_counts(spec, _job(packing="per-document"))
    assert per_doc.flops_by_class["attention"] < rows.flops_by_class["attention"] / 5
    assert per_doc.flops_by_class["dense_matmul"] == rows.flops_by_class["dense_matmul"]


def test_a_packing_job_needs_its_row_length_and_its_data() -> None:
    with pytest.raises(TunecostError, match="--seq-len"):
        _job(seq_len=None, packing="per-document")
    with pytest.raises(TunecostError, match="--dataset"):
        job_packed_lengths(_job(dataset=None, seq_len=2048, packing="per-document"))
    with pytest.raises(TunecostError, match="packing: dataset alpaca has no token-length statistic.*--packing none"):
        job_packed_lengths(_job(dataset="alpaca", packing="per-document"))
    with pytest.raises(TunecostError, match="unsupported packing"):
        _job(packing="yes")


def test_measured_lengths_are_packed_as_they_are() -> None:
    job = _job(lengths=(1024,) * 10 + (512,) * 4, packing="per-document")
    assert job_packed_lengths(job).queries_per_row == pytest.approx(14 / 6)  # 5 rows of 1024 x 2, 1 of 512 x 4


def test_a_run_in_steps_of_packed_rows_counts_the_queries_the_rows_hold() -> None:
    length = run_length(dataset_queries=None, epochs=None, max_steps=100, global_batch=(8, "8"), queries_per_row=2.5)
    assert length.num_queries == 2000
    assert "x 2.50 queries per packed row" in str(length.note)


def test_the_emptiest_row_counts_by_its_share() -> None:
    """A sample of a larger dataset, or data under one row, is not priced as whole rows it leaves empty."""
    half = packed_lengths([100] * 30, 2000, 1, per_document=True, source="x")  # one full row and half of one
    assert half.queries_per_row == pytest.approx(30 / 1.5)
    assert "100.0% full" in half.source
