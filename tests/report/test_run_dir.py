"""Loading a run directory (tunecost.report.run_dir): every kind read, bad or old files listed, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunecost.errors import TunecostError
from tunecost.io import append_jsonl
from tunecost.report.run_dir import load_run


def test_every_kind_is_read_with_its_rows(full_run: Path, rows) -> None:
    records = load_run(full_run)
    expected = (
        "throughput",
        "stages",
        "layers",
        "kernels",
        "expert_load",
        "trainability",
        "lengths",
        "max_batch",
        "counters",
        "fit",
        "estimate",
        "validation",
        "multi_gpu",
        "ranks",
        "plan",
    )
    assert set(records.tables) == set(expected)
    for kind in expected:
        assert len(records.get(kind)) == len(rows(full_run, kind)), kind
    assert records.skipped == []
    assert records.meta["meta"]["schema_version"] == 1


def test_missing_run_dir_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TunecostError, match="run directory not found"):
        load_run(tmp_path / "nope")


def test_a_file_is_not_a_run_dir(tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    path.write_text("<html></html>", encoding="utf-8")
    with pytest.raises(TunecostError, match="report.html: a file; give the run directory that holds the records"):
        load_run(path)


def test_run_dir_without_records_says_what_to_run(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text("{}", encoding="utf-8")
    with pytest.raises(TunecostError, match=r"holds no run records \(\*\.jsonl\); run `tunecost demo`") as info:
        load_run(tmp_path)
    assert "\n" not in str(info.value)


def test_older_format_file_is_listed_and_the_rest_read(tmp_path: Path, make_run) -> None:
    run = make_run(tmp_path / "run", kinds=("throughput", "stages"), schema_version={"stages": 0})
    records = load_run(run)
    assert records.get("stages") is None
    assert records.get("throughput") is not None
    assert len(records.skipped) == 1
    assert records.skipped[0].startswith("stages.jsonl: records in format version ['0']")
    assert "reads version 1" in records.skipped[0]


def test_rows_without_a_version_are_an_older_format(tmp_path: Path) -> None:
    append_jsonl(tmp_path / "throughput.jsonl", {"kind": "throughput", "queries_per_s": 1.0})
    records = load_run(tmp_path)
    assert records.tables == {}
    assert "format version ['None']" in records.skipped[0]


def test_empty_and_non_object_files_are_listed(tmp_path: Path) -> None:
    (tmp_path / "kernels.jsonl").write_text("", encoding="utf-8")
    (tmp_path / "layers.jsonl").write_text("[1, 2]\n[3, 4]\n", encoding="utf-8")
    append_jsonl(tmp_path / "throughput.jsonl", {"schema_version": 1, "kind": "throughput", "queries_per_s": 2.0})
    records = load_run(tmp_path)
    assert set(records.tables) == {"throughput"}
    assert sorted(records.skipped) == ["kernels.jsonl: empty", "layers.jsonl: holds lines that are not JSON objects"]


def test_rows_of_a_kind_another_file_holds_are_listed_and_left_out(tmp_path: Path) -> None:
    append_jsonl(tmp_path / "throughput.jsonl", {"schema_version": 1, "kind": "throughput", "queries_per_s": 2.0})
    append_jsonl(tmp_path / "throughput.jsonl", {"schema_version": 1, "kind": "stages", "stage": "forward"})
    append_jsonl(tmp_path / "throughput.jsonl", {"schema_version": 1, "kind": "nonsense"})
    append_jsonl(tmp_path / "stages.jsonl", {"schema_version": 1, "queries_per_s": 1.0})  # no kind at all
    records = load_run(tmp_path)
    assert records.get("throughput")["queries_per_s"].tolist() == [2.0]
    assert "stages" not in records.tables
    assert records.skipped == [
        "stages.jsonl: 1 record(s) of kind None, not a kind stages.jsonl holds (docs/dev/records.md); left out",
        "throughput.jsonl: 2 record(s) of kind nonsense, stages, not a kind throughput.jsonl holds "
        "(docs/dev/records.md); left out",
    ]


def test_torn_last_line_is_ignored(tmp_path: Path) -> None:
    for q in (1.0, 2.0):
        append_jsonl(tmp_path / "throughput.jsonl", {"schema_version": 1, "kind": "throughput", "queries_per_s": q})
    with open(tmp_path / "throughput.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"schema_version": 1, "kind": "throughput", "queries_')  # killed mid-write
    assert load_run(tmp_path).get("throughput")["queries_per_s"].tolist() == [1.0, 2.0]


def test_sub_runs_are_read_with_their_source_and_meta(tmp_path: Path, make_run) -> None:
    make_run(tmp_path / "profile-tiny-mixtral", kinds=("throughput",))
    append_jsonl(tmp_path / "throughput.jsonl", {"schema_version": 1, "kind": "throughput", "queries_per_s": 9.0})
    records = load_run(tmp_path)
    df = records.get("throughput")
    assert sorted(df["_source"].unique()) == [".", "profile-tiny-mixtral"]
    assert records.meta["profile-tiny-mixtral/meta"]["tool"] == "tunecost"


def test_broken_meta_json_is_reported_not_raised(tmp_path: Path, make_run) -> None:
    run = make_run(tmp_path / "run", kinds=("throughput",))
    (run / "meta.json").write_text("{not json", encoding="utf-8")
    assert load_run(run).meta["meta"] == {"error": "meta.json is not valid JSON"}
    json.loads((run / "throughput.jsonl").read_text(encoding="utf-8").splitlines()[0])  # records untouched
