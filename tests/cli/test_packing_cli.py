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


def test_packed_rows_across_documents_are_full_rows_holding_more_queries(cli_json) -> None:
    rows = {p: cli_json("estimate", **JOB, epochs=1, batch_size=4, packing=p)[0] for p in ("none", "cross-document")}
    assert rows["cross-document"]["queries_per_s"] == pytest.approx(rows["none"]["queries_per_s"] * _per_row())
    assert rows["cross-document"]["max_batch_size"] == rows["none"]["max_batch_size"]  # a row is seq_len tokens


def test_several_gpus_carry_the_rows_queries_too(cli_json) -> None:
    qps = {
        p: cli_json("estimate", **JOB, epochs=1, gpus=2, strategy="ddp", batch_size=4, packing=p)["setups"][0][
            "queries_per_s"
        ]
        for p in ("none", "cross-document")
    }
    assert qps["cross-document"] == pytest.approx(qps["none"] * _per_row())


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
