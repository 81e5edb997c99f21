"""Run records: the row builders, the writer that refuses to repeat a record without `force`, and
`tunecost fit --out` / `tunecost estimate --out` records drawn by `tunecost report`."""

from __future__ import annotations

import json

import pytest

from tunecost.cli.main import app
from tunecost.errors import TunecostError
from tunecost.io import read_jsonl
from tunecost.results.meta import run_metadata
from tunecost.results.records import (
    ESTIMATE_KEY,
    SCHEMA_VERSION,
    add_records,
    read_records,
    record,
)


def test_record_leads_with_version_and_kind() -> None:
    fields = {"model": "m", "dataset": "d", "gpu": "A40", "form": "log", "coefficients": {}, "rmse": 0.1}
    row = record("fit", **fields, mape=0.01, num_points=4)
    assert list(row)[:2] == ["schema_version", "kind"]
    assert row == {"schema_version": SCHEMA_VERSION, "kind": "fit", **fields, "mape": 0.01, "num_points": 4}
    assert run_metadata(command="x", measured_on_device=False)["schema_version"] == SCHEMA_VERSION


def test_add_records_keeps_others_and_refuses_repeats(tmp_path) -> None:
    path = tmp_path / "estimate.jsonl"
    job = {"method": "qlora", "experts_per_token": 2, "dataset": None, "provider": None, "estimator": "calibrated"}
    a = record("estimate", model="a", gpu="A40", usd=1.0, **job)
    b = record("estimate", model="b", gpu="A40", usd=2.0, **job)
    add_records(path, [a], key=ESTIMATE_KEY)
    add_records(path, [b], key=ESTIMATE_KEY)
    assert [r["model"] for r in read_records(path)] == ["a", "b"]
    with pytest.raises(TunecostError, match="--force"):
        add_records(path, [{**a, "usd": 3.0}], key=ESTIMATE_KEY)
    assert [r["usd"] for r in read_records(path)] == [1.0, 2.0]  # nothing written on refusal
    add_records(path, [{**a, "usd": 3.0}], key=ESTIMATE_KEY, force=True)
    assert sorted((r["model"], r["usd"]) for r in read_records(path)) == [("a", 3.0), ("b", 2.0)]


def test_read_records_rejects_another_version(tmp_path) -> None:
    path = tmp_path / "fit.jsonl"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1, "kind": "fit"}) + "\n")
    with pytest.raises(TunecostError, match="format version"):
        read_records(path)


@pytest.mark.long  # CI runs it (7-15 s of work no other test shares)
def test_fit_and_estimate_out_are_drawn_by_report(cli_runner, paper_a40_csv, tmp_path) -> None:
    run = tmp_path / "run"
    fit = cli_runner.invoke(app, ["fit", str(paper_a40_csv), "--out", str(run)])
    assert fit.exit_code == 0, fit.output
    args = ["estimate", "--model", "mixtral-8x7b", "--gpu", "A40,H100", "--epochs", "10", "--dataset", "math_14k"]
    est = cli_runner.invoke(app, [*args, "--out", str(run)])
    assert est.exit_code == 0, est.output
    fit_rows = read_jsonl(run / "fit.jsonl")
    est_rows = read_jsonl(run / "estimate.jsonl")
    num_points = sum(1 for line in paper_a40_csv.read_text().splitlines()[1:] if line.strip())
    assert sum(r["kind"] == "fit_point" for r in fit_rows) == num_points
    assert sum(r["kind"] == "fit" for r in fit_rows) == 4  # the four (model, dataset) groups on the A40
    assert est_rows and all(r["kind"] == "estimate" and r["method"] == "qlora" for r in est_rows)
    assert {r["experts_per_token"] for r in est_rows} == {2}  # Mixtral's default top-k
    meta = json.loads((run / "meta.json").read_text())
    assert meta["device"] is None and meta["schema_version"] == SCHEMA_VERSION

    again = cli_runner.invoke(app, [*args, "--out", str(run)])
    assert again.exit_code == 2 and "--force" in again.output and "Traceback" not in again.output
    assert read_jsonl(run / "estimate.jsonl") == est_rows
    forced = cli_runner.invoke(app, [*args, "--out", str(run), "--force"])
    assert forced.exit_code == 0, forced.output
    assert len(read_jsonl(run / "estimate.jsonl")) == len(est_rows)

    rep = cli_runner.invoke(app, ["report", str(run)])
    assert rep.exit_code == 0, rep.output
    html = (run / "report.html").read_text()
    assert "Fig. 14" in html and "Table IV" in html
    usd = sorted(r["usd"] for r in est_rows if r["usd"] is not None and r["gpu"] == "A40-48GB")[0]
    assert f"{usd:.2f}" in html  # the cheapest A40 row of the cost table
