"""`tunecost predict` through typer's CliRunner: CSV in, CSV out (atomic), JSON, one-line errors."""

from __future__ import annotations

import csv
import json

import pytest

from tunecost.cli.main import app

TARGETS = (
    "model,dataset,gpu,experts_per_token,batch_size\n"
    "mixtral-8x7b,math_14k,A40,2,4\n"
    "mixtral-8x7b,math_14k,H100,2,17\n"
    "blackmamba-2.8b,commonsense_15k,A100-80GB,8,4\n"
)


def test_predict_writes_the_output_csv(cli_runner, write_file, tmp_path) -> None:
    out = tmp_path / "pred.csv"
    result = cli_runner.invoke(app, ["predict", "--input", str(write_file("t.csv", TARGETS)), "--output", str(out)])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(out.open()))
    assert [r["gpu"] for r in rows] == ["A40-48GB", "H100-80GB-SXM", "A100-80GB-SXM"]
    for r in rows:
        assert r["estimator"] == "calibrated"
        assert float(r["queries_per_s_low"]) < float(r["queries_per_s"]) < float(r["queries_per_s_high"])
    assert [r["extrapolation"] for r in rows] == ["false", "true", "true"]
    assert "cross-GPU" in rows[1]["extrapolation_reasons"] and "far outside" in rows[1]["extrapolation_reasons"]
    assert [r["method"] for r in rows] == ["qlora", "qlora", "full"]


def test_predict_splits_the_step_into_gpu_and_host_time(cli_runner, write_file) -> None:
    """gpu_s + host_s is the step; the paper's eager MoE loop keeps its host time on a faster GPU (on the same
    host), which takes less GPU time, so the host share of the step grows from the A40 to the H100. The H100's
    default host (its DGX system's CPU) is faster than the A40's, and its host time shorter by that speed."""
    path = str(write_file("t.csv", TARGETS))
    result = cli_runner.invoke(app, ["predict", "--input", path, "--json", "--host-cpu", "Xeon Platinum 8380"])
    assert result.exit_code == 0, result.output
    a40, h100, _ = json.loads(result.stdout)["predictions"]
    for row in (a40, h100):
        assert row["gpu_s"] > 0 and row["host_s"] > 0 and row["host_cpu"] == "Xeon Platinum 8380"
        assert row["gpu_s"] + row["host_s"] == pytest.approx(row["step_s"], abs=2e-6)
    assert h100["host_s"] == pytest.approx(a40["host_s"], rel=1e-6)  # same stack, model and host: same host time
    assert h100["host_s"] / h100["step_s"] > a40["host_s"] / a40["step_s"]
    default = cli_runner.invoke(app, ["predict", "--input", path, "--json"])
    _, dgx, _ = json.loads(default.stdout)["predictions"]
    assert dgx["host_cpu"] == "Xeon Platinum 8480C" and dgx["host_s"] == pytest.approx(h100["host_s"] / 1.33, rel=1e-3)
    assert dgx["queries_per_s"] > h100["queries_per_s"]


def test_host_cpu_option_and_column_errors_name_the_option_or_row(cli_error, write_file) -> None:
    targets = write_file("t.csv", TARGETS)
    line = cli_error(["predict", "--input", str(targets), "--host-cpu", "Z80"])
    assert line.startswith("error: --host-cpu: unknown host CPU 'Z80'; known:")
    bad = write_file(
        "h.csv", "model,dataset,gpu,experts_per_token,batch_size,host_cpu\nmixtral-8x7b,math_14k,A40,2,1,Z80\n"
    )
    assert "h.csv: row 1: unknown host CPU 'Z80'" in cli_error(["predict", "--input", str(bad)])
    est = ["estimate", "--model", "mixtral-8x7b", "--gpu", "H100", "--epochs", "1", "--dataset", "math_14k"]
    assert "--host-cpu: unknown host CPU 'Z80'" in cli_error([*est, "--host-cpu", "Z80"])
    assert "--host-cpu needs --estimator calibrated or simulate" in cli_error(
        [*est, "--host-cpu", "8480C", "--estimator", "paper"]
    )


def test_predict_json_with_seq_len_and_run_length(cli_runner, write_file) -> None:
    path = write_file("t.csv", "model,dataset,gpu,experts_per_token,batch_size,seq_len\nmixtral-8x7b,,A40,2,2,128\n")
    result = cli_runner.invoke(app, ["predict", "--input", str(path), "--run-queries", "1000", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    (row,) = payload["predictions"]
    assert row["seq_len"] == 128 and row["run_queries"] == 1000
    assert payload["calibration"]["num_points"] == 54 + 4  # bundled: the A40 and A100-40GB points
    assert payload["calibration"]["in_sample_mape"] <= 0.08


def test_unknown_gpu_or_model_names_the_row(cli_error, write_file) -> None:
    bad_gpu = write_file("g.csv", TARGETS + "mixtral-8x7b,math_14k,H900,2,4\n")
    line = cli_error(["predict", "--input", str(bad_gpu)])
    assert "row 4: unknown GPU 'H900'" in line and "Valid choices" in line
    bad_model = write_file("m.csv", "model,dataset,gpu,experts_per_token,batch_size\nmixtrl-8x7b,math_14k,A40,2,1\n")
    assert "row 1: unknown model 'mixtrl-8x7b'. Did you mean 'mixtral-8x7b'?" in cli_error(
        ["predict", "--input", str(bad_model)]
    )


def test_bad_calibration_and_targets_files(cli_error, write_file) -> None:
    targets = write_file("t.csv", TARGETS)
    single = write_file(
        "one.csv",
        "model,dataset,gpu,experts_per_token,batch_size,queries_per_s\nmixtral-8x7b,math_14k,A40-48GB,2,1,0.33\n",
    )
    assert "at least 7 measurements" in cli_error(["predict", "--input", str(targets), "--calibrate", str(single)])
    missing = write_file("x.csv", "model,gpu,batch_size\nmixtral-8x7b,A40,1\n")
    assert "missing column(s) dataset, experts_per_token" in cli_error(["predict", "--input", str(missing)])
    no_len = write_file("n.csv", "model,dataset,gpu,experts_per_token,batch_size\nmixtral-8x7b,,A40,2,1\n")
    assert "row 1: " in cli_error(["predict", "--input", str(no_len)])
    bad_batch = write_file("b.csv", "model,dataset,gpu,experts_per_token,batch_size\nmixtral-8x7b,math_14k,A40,2,x\n")
    assert "row 1: column 'batch_size' must be a whole number" in cli_error(["predict", "--input", str(bad_batch)])


def test_estimate_with_the_calibrated_estimator(cli_json, monkeypatch) -> None:
    from tunecost.errors import TunecostError
    from tunecost.estimate import calibrated

    monkeypatch.setattr(
        calibrated, "_simulated_sizing", lambda req: (_ for _ in ()).throw(TunecostError("no step simulator here"))
    )
    rows = cli_json(
        "estimate",
        model="mixtral-8x7b",
        gpu="A40,H100",
        epochs=10,
        dataset="math_14k",
        experts_per_token=2,
        estimator="calibrated",
    )
    assert {r["estimator"] for r in rows} == {"calibrated"}
    assert all(r["queries_per_s_low"] < r["queries_per_s"] < r["queries_per_s_high"] for r in rows)


@pytest.mark.parametrize(
    ("column", "header"),
    [
        ("experts_per_token", "model,dataset,gpu,experts_per_token,batch_size"),
        ("seq_len", "model,dataset,gpu,experts_per_token,batch_size,seq_len"),
    ],
)
def test_zero_is_not_the_default(cli_error, write_file, column, header) -> None:
    """An empty cell means the default; 0 is an error naming the row (it used to predict top-2 / the default)."""
    row = "mixtral-8x7b,math_14k,A40,0,2" if column == "experts_per_token" else "mixtral-8x7b,,A40,2,2,0"
    line = cli_error(["predict", "--input", str(write_file("t.csv", f"{header}\n{row}\n"))])
    assert "row 1:" in line and ">= 1, got 0" in line


def test_calibration_errors_name_the_file_and_row(cli_error, write_file, paper_a40_csv) -> None:
    """A bad GPU or top-k in a calibration file (found only when the point is modelled) names its row."""
    lines = paper_a40_csv.read_text(encoding="utf-8").splitlines()
    lines[3] = lines[3].replace("A40-48GB", "NOPEGPU")  # data row 3
    bad = write_file("cal.csv", "\n".join(lines) + "\n")
    line = cli_error(["predict", "--input", str(write_file("t.csv", TARGETS)), "--calibrate", str(bad)])
    assert f"{bad}: row 3: unknown GPU 'NOPEGPU'" in line


def test_predict_defaults_to_the_calibrations_run_length(cli_runner, write_file) -> None:
    path = write_file("t.csv", "model,dataset,gpu,experts_per_token,batch_size\nmixtral-8x7b,math_14k,H100,2,17\n")
    rows = {}
    for flag in ([], ["--steady-state"], ["--run-queries", "1000"]):
        result = cli_runner.invoke(app, ["predict", "--input", str(path), "--json", *flag])
        assert result.exit_code == 0, result.output
        (rows[" ".join(flag)],) = json.loads(result.stdout)["predictions"]
    assert rows[""]["run_queries"] == 1000  # the paper's points are 1000-query runs: predicted like for like
    assert rows[""]["queries_per_s"] == rows["--run-queries 1000"]["queries_per_s"]
    assert rows["--steady-state"]["run_queries"] == ""
    assert rows["--steady-state"]["queries_per_s"] > rows[""]["queries_per_s"]  # no start-up per run
    both = cli_runner.invoke(app, ["predict", "--input", str(path), "--steady-state", "--run-queries", "5"])
    assert both.exit_code == 2 and "not both" in both.output


@pytest.mark.parametrize(
    ("column", "cells"), [("experts_per_token", "x,2,"), ("seq_len", "2,2,x"), ("batch_size", "2,x,")]
)
def test_a_row_error_names_file_and_row_once(cli_error, write_file, column, cells) -> None:
    """A bad whole number in a targets row: `FILE: row N:` once, not twice."""
    path = write_file("t.csv", f"model,dataset,gpu,experts_per_token,batch_size,seq_len\nmixtral-8x7b,,A40,{cells}\n")
    line = cli_error(["predict", "--input", str(path)])
    assert line == f"error: {path}: row 1: column {column!r} must be a whole number, got 'x'"


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("inf", "column 'num_queries' must be a whole number, got inf"),
        ("1e30", "column 'num_queries' must be between 1 and 1000000000000"),
        ("-5", "column 'num_queries' must be between 1 and 1000000000000, got -5"),
        ("x", "column 'num_queries' is not a number: 'x'"),
    ],
)
def test_calibration_num_queries_is_range_checked(cli_error, write_file, paper_a40_csv, cell, expected) -> None:
    """A calibration row's num_queries is a bounded whole number (inf was a traceback, -5 a failed fit)."""
    header, *rows = paper_a40_csv.read_text(encoding="utf-8").splitlines()
    bad = write_file("cal.csv", "\n".join([header + ",num_queries", *(r + f",{cell}" for r in rows)]) + "\n")
    line = cli_error(["predict", "--input", str(write_file("t.csv", TARGETS)), "--calibrate", str(bad)])
    assert line.startswith(f"error: {bad}: row 1: {expected}"), line
