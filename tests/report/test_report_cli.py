"""`tunecost report RUN_DIR [--out FILE] [--json]` through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

from tunecost.cli.main import app


def _unwrapped(text: str) -> str:
    """Rich wraps long lines at its console width (long paths even mid-word): compare without whitespace."""
    return "".join(text.split())


def test_json_says_what_was_written(tmp_path: Path, make_run, cli_runner) -> None:
    run = make_run(tmp_path / "run", kinds=("trainability", "throughput"))
    result = cli_runner.invoke(app, ["report", str(run), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert Path(out["html_path"]) == run / "report.html"
    assert out["sections_shown"] == ["trainability", "throughput"]
    assert out["sections_omitted"]["stages"] == "no `stages.jsonl` records in this run"
    assert sorted(Path(p).name for p in out["figure_paths"]) == [
        "throughput.png",
        "throughput.svg",
        "trainability.png",
        "trainability.svg",
    ]
    assert (run / "report.html").is_file()


def test_plain_output_names_the_page_and_each_omitted_section(tmp_path: Path, make_run, cli_runner) -> None:
    run = make_run(tmp_path / "run", kinds=("trainability",))
    out_file = tmp_path / "out" / "page.html"
    result = cli_runner.invoke(app, ["report", str(run), "--out", str(out_file)])
    assert result.exit_code == 0, result.output
    out = _unwrapped(result.stdout)
    assert _unwrapped("section stages omitted: no `stages.jsonl` records in this run") in out
    assert _unwrapped(f"report: {out_file.resolve()} (1 sections, 2 figure files") in out
    assert out_file.is_file()


def test_older_format_records_still_give_a_report(tmp_path: Path, make_run, cli_runner) -> None:
    run = make_run(tmp_path / "run", kinds=("trainability", "stages"), schema_version={"stages": 0})
    result = cli_runner.invoke(app, ["report", str(run), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["sections_shown"] == ["trainability"]
    assert "stages.jsonl: records in format version" in (run / "report.html").read_text(encoding="utf-8")


def test_missing_column_is_a_line_not_a_traceback(tmp_path: Path, make_run, cli_runner) -> None:
    run = make_run(tmp_path / "run", kinds=("fit",), drop_columns={"fit": ("rmse",)})
    result = cli_runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert _unwrapped("section fit omitted: `fit.jsonl` lacks rmse (written by an older or partial run)") in _unwrapped(
        result.stdout
    )


def test_empty_run_dir_is_exit_2_with_one_line(tmp_path: Path, cli_error) -> None:
    line = cli_error(["report", str(tmp_path)])
    assert line.startswith(f"error: {tmp_path} holds no run records (*.jsonl); run `tunecost demo`")


def test_missing_run_dir_is_exit_2_with_one_line(tmp_path: Path, cli_error) -> None:
    line = cli_error(["report", str(tmp_path / "nope"), "--json"])
    assert line == f"error: run directory not found: {tmp_path / 'nope'}"


def test_records_lacking_a_column_are_left_out_with_one_warning(tmp_path: Path, make_run, cli_runner) -> None:
    """Valid JSON lines without `model` do not drop the whole throughput figure: they are left out, once named."""
    run = make_run(tmp_path / "run", kinds=("throughput",))
    path = run / "throughput.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    for row in rows[:2]:
        del row["model"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    result = cli_runner.invoke(app, ["report", str(run), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["sections_shown"] == ["throughput"]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: {path}: 2 record(s) lack model; left out of the figures, the other records are drawn"
    ]
    assert "throughput.jsonl: 2 record(s) lack model" in (run / "report.html").read_text(encoding="utf-8")


def test_a_garbage_records_file_is_one_warning(tmp_path: Path, make_run, cli_runner) -> None:
    run = make_run(tmp_path / "run", kinds=("throughput",))
    (run / "stages.jsonl").write_text("garbage\n" * 50, encoding="utf-8")
    result = cli_runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: {run / 'stages.jsonl'}: skipped 50 lines that are not JSON records (lines 1, 2, 3, 4, 5, ...); "
        "results on the other lines are used"
    ]


def test_rows_left_out_are_one_warning_each_and_in_the_json(tmp_path: Path, make_run, cli_runner) -> None:
    run = make_run(tmp_path / "run", kinds=("throughput", "stages"), schema_version={"stages": 0})
    with open(run / "throughput.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"schema_version": 1, "kind": "stages", "stage": "forward"}) + "\n")
    result = cli_runner.invoke(app, ["report", str(run), "--json"])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert [w.split(":")[1].strip() for w in warnings] == ["stages.jsonl", "throughput.jsonl"]
    assert json.loads(result.stdout)["records_skipped"] == [w.removeprefix("warning: ") for w in warnings]
