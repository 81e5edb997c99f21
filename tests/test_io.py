"""Atomic, resumable result files (tunecost.io)."""

from __future__ import annotations

import json
import os

import pytest

from tunecost.io import append_jsonl, atomic_write_bytes, atomic_write_json, atomic_write_text, read_jsonl


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path) -> None:
    target = tmp_path / "sub" / "result.json"  # parent folders are created
    atomic_write_text(target, "old")
    atomic_write_json(target, {"usd": 32.59, "gpu": "A40-48GB"})
    assert json.loads(target.read_text()) == {"usd": 32.59, "gpu": "A40-48GB"}
    atomic_write_bytes(tmp_path / "sub" / "blob.bin", b"\x00\x01")
    assert (tmp_path / "sub" / "blob.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in target.parent.iterdir()) == ["blob.bin", "result.json"]  # no .tmp left


def test_failed_write_keeps_old_content_and_no_temp(tmp_path, monkeypatch) -> None:
    target = tmp_path / "result.json"
    atomic_write_text(target, "complete")

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)  # fails mid-write, after the temp file has data
    from tunecost.errors import TunecostError

    with pytest.raises(TunecostError, match=r"cannot write '.*result\.json': No space left"):
        atomic_write_text(target, "partial")
    assert target.read_text() == "complete"
    assert os.listdir(tmp_path) == ["result.json"]


def test_jsonl_append_and_torn_last_line(tmp_path) -> None:
    log = tmp_path / "rows.jsonl"
    assert read_jsonl(log) == []  # a missing log is empty (nothing done yet)
    append_jsonl(log, {"batch": 1, "qps": 0.34})
    append_jsonl(log, {"batch": 2, "qps": 0.66})
    with open(log, "a", encoding="utf-8") as fh:
        fh.write('{"batch": 3, "qp')  # a kill mid-write
    assert read_jsonl(log) == [{"batch": 1, "qps": 0.34}, {"batch": 2, "qps": 0.66}]


def test_a_row_appended_after_a_torn_line_is_kept(tmp_path, recwarn) -> None:
    """Resuming after a kill mid-write: the next row must not be glued onto the torn fragment (it would be lost
    and redone on every later resume). The fragment becomes a line of its own, skipped with a warning that
    names it."""
    from tunecost.errors import TunecostWarning

    log = tmp_path / "rows.jsonl"
    append_jsonl(log, {"batch": 1})
    with open(log, "a", encoding="utf-8") as fh:
        fh.write('{"batch": 2, "qp')  # a kill mid-write
    assert read_jsonl(log) == [{"batch": 1}] and not recwarn.list  # a torn tail is expected: silent
    append_jsonl(log, {"batch": 2, "qps": 0.66})  # the resumed point
    with pytest.warns(TunecostWarning, match=r"rows.jsonl:2: skipped a line that is not a JSON record"):
        assert read_jsonl(log) == [{"batch": 1}, {"batch": 2, "qps": 0.66}]


def test_corrupt_middle_lines_are_named(tmp_path) -> None:
    from tunecost.errors import TunecostWarning

    log = tmp_path / "rows.jsonl"
    log.write_text('{"a": 1}\nnot json\n[1, 2]\n{"a": 2}\n', encoding="utf-8")
    with pytest.warns(TunecostWarning) as caught:
        assert read_jsonl(log) == [{"a": 1}, {"a": 2}]
    assert [str(w.message) for w in caught] == [
        f"{log}: skipped 2 lines that are not JSON records (lines 2, 3); results on the other lines are used"
    ]


def test_a_garbage_file_is_one_warning(tmp_path) -> None:
    """Hundreds of bad lines are one warning naming the count and the first lines, not hundreds of warnings."""
    from tunecost.errors import TunecostWarning

    log = tmp_path / "rows.jsonl"
    log.write_text('{"a": 1}\n' + "garbage\n" * 300, encoding="utf-8")
    with pytest.warns(TunecostWarning) as caught:
        assert read_jsonl(log) == [{"a": 1}]
    assert len(caught) == 1
    assert "skipped 300 lines" in str(caught[0].message) and "(lines 2, 3, 4, 5, 6, ...)" in str(caught[0].message)


def test_an_unwritable_output_names_the_users_path(tmp_path, monkeypatch) -> None:
    """A failed atomic write names the file the user gave, not the temporary file beside it."""
    import tempfile

    from tunecost.errors import TunecostError

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / ".out.csv.abc123.tmp"))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(TunecostError) as caught:
        atomic_write_text(tmp_path / "out.csv", "a\n")
    assert str(caught.value) == f"cannot write {str(tmp_path / 'out.csv')!r}: Permission denied"
    assert ".tmp" not in str(caught.value)
    blocker = tmp_path / "a_file"
    blocker.write_text("x", encoding="utf-8")
    with pytest.raises(TunecostError, match="cannot write .*a_file/sub.csv"):
        atomic_write_text(blocker / "sub.csv", "a\n")


def test_cli_prints_tunecost_warnings_as_one_line(tmp_path, cli_runner) -> None:
    from tunecost.cli.main import app

    run = tmp_path / "run"
    run.mkdir()
    (run / "estimate.jsonl").write_text("not json\n", encoding="utf-8")
    result = cli_runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 2, result.output  # nothing readable: no empty page
    assert f"warning: {run / 'estimate.jsonl'}:1: skipped a line" in result.output
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {run}: no readable run records")
    assert "Traceback" not in result.output and "TunecostWarning" not in result.output


def test_atomic_writes_get_the_mode_of_an_ordinary_new_file(tmp_path) -> None:
    umask = os.umask(0o022)
    try:
        path = atomic_write_text(tmp_path / "out.csv", "a,b\n")
    finally:
        os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644
