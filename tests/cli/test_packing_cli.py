"""`--packing` end to end: a packed row carries its queries through one GPU and several, and bad input is one line."""

from __future__ import annotations

import pytest

from tunecost.estimate.throughput.packing import queries_per_row
from tunecost.workload.job import FineTuneJob

JOB = {"model": "qwen2.5-0.5b", "method": "lora", "gpu": "A100-80GB", "dataset": "gsm8k-train", "seq_len": 1024}


def _per_row() -> float:
    job = FineTuneJob(
        model="qwen2.5-0.5b", method="lora", seq_len=1024, dataset="gsm8k-train", packing="cross-document"
    )
    return queries_per_row(job)


PADDED = {**{k: v for k, v in JOB.items() if k != "dataset"}, "queries": 7473}  # every query 1024 tokens


@pytest.mark.long
def test_packed_rows_across_documents_are_full_rows_holding_more_queries(cli_json) -> None:
    """A packed row across documents costs what one query padded to seq_len costs, and holds more queries."""
    packed = cli_json("estimate", **JOB, epochs=1, batch_size=4, packing="cross-document")[0]
    padded = cli_json("estimate", **PADDED, epochs=1, batch_size=4)[0]
    assert packed["queries_per_s"] == pytest.approx(padded["queries_per_s"] * _per_row())
    assert packed["max_batch_size"] == padded["max_batch_size"]  # a row is seq_len tokens
    cut = cli_json("estimate", **JOB, epochs=1, batch_size=4)[0]  # the data's lengths, cut at seq_len
    assert padded["queries_per_s"] < cut["queries_per_s"] < packed["queries_per_s"]


def test_several_gpus_carry_the_rows_queries_too(cli_json) -> None:
    setup = {"epochs": 1, "gpus": 2, "strategy": "ddp", "batch_size": 4}
    packed = cli_json("estimate", **JOB, **setup, packing="cross-document")["setups"][0]["queries_per_s"]
    padded = cli_json("estimate", **PADDED, **setup)["setups"][0]["queries_per_s"]
    assert packed == pytest.approx(padded * _per_row())


def test_a_run_in_steps_counts_the_queries_in_its_rows(cli_ok) -> None:
    err = cli_ok("estimate", **JOB, max_steps=10, batch_size=4, packing="per-document").stderr
    said = f"x {_per_row():.2f} queries per packed row = {round(10 * 4 * _per_row())} queries"
    assert said in " ".join(err.split())


def test_packing_without_a_row_length_is_one_error(cli_error) -> None:
    line = cli_error(["estimate", "--model", "qwen2.5-0.5b", "--gpu", "A100-80GB", "--dataset", "gsm8k-train",
                      "--epochs", "1", "--packing", "per-document"])  # fmt: skip
    assert "--seq-len" in line


def test_packing_without_data_is_one_error_not_the_default_datasets_lengths(cli_error) -> None:
    line = cli_error(["estimate", "--model", "qwen2.5-0.5b", "--gpu", "A100-80GB", "--queries", "1000",
                      "--epochs", "1", "--seq-len", "1024", "--packing", "per-document"])  # fmt: skip
    assert "--dataset" in line and "packed row" in line
    assert "--max-steps" in line  # a run in steps needs no lengths


@pytest.mark.long
def test_packing_without_data_in_steps_prices_full_rows(cli_ok, cli_json) -> None:
    """A run counted in steps needs no lengths: each row full, one query, attention over the whole row (the most
    per-document attention can cost): what a query padded to seq_len costs."""
    job = {k: v for k, v in JOB.items() if k != "dataset"}
    err = cli_ok("estimate", **job, max_steps=10, batch_size=4, packing="per-document").stderr
    assert "assumed: packing without the data's lengths: each row 1024 tokens full" in " ".join(err.split())
    rows = cli_json("estimate", **job, max_steps=10, batch_size=4, packing="per-document")[0]
    padded = cli_json("estimate", **job, queries=40, epochs=1, batch_size=4)[0]
    assert rows["num_queries"] == 40 and rows["queries_per_s"] == pytest.approx(padded["queries_per_s"])
