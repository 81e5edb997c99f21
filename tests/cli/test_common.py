"""The CLI's shared plumbing (tunecost.cli.common): bad files and bad numbers are one `error:` line, exit 2."""

from __future__ import annotations

import json

import pytest


def test_binary_file_is_one_line(tmp_path, cli_error) -> None:
    binary = tmp_path / "m.csv"
    binary.write_bytes(bytes(range(128, 256)) * 3)
    assert "not UTF-8 text" in cli_error(["fit", str(binary)])


def test_folder_where_a_file_belongs_and_file_where_a_folder_belongs(tmp_path, cli_error) -> None:
    folder = tmp_path / "adir"
    folder.mkdir()
    assert "is a folder, not a file" in cli_error(["prices", "--prices", str(folder)])
    taken = tmp_path / "taken.csv"
    taken.write_text("x\n", encoding="utf-8")
    assert f"--out {str(taken)!r} is a file; give a folder" in cli_error(
        ["profile", "--model", "tiny-mixtral", "--out", str(taken)]
    )


@pytest.mark.parametrize("command", [["profile", "--model", "tiny-mixtral"], ["max-batch", "--model", "tiny-mixtral"]])
def test_an_out_under_a_file_is_refused_before_any_work(tmp_path, cli_error, monkeypatch, command) -> None:
    """`--out FILE/sub` names the file in the way, before any measurement starts (max-batch used to search first)."""
    import tunecost.profile.threads

    def no_work(*args, **kwargs):
        raise AssertionError("started work before checking --out")

    # the command modules first: one imported after the patch would keep `no_work` as its own
    monkeypatch.setattr("tunecost.cli.commands.profile.prepare_cpu_threads", no_work)
    monkeypatch.setattr("tunecost.cli.commands.max_batch.prepare_cpu_threads", no_work)
    monkeypatch.setattr(tunecost.profile.threads, "prepare_cpu_threads", no_work)
    blocker = tmp_path / "some_file"
    blocker.write_text("x\n", encoding="utf-8")
    line = cli_error([*command, "--out", str(blocker / "sub")])
    assert line == f"error: --out {str(blocker / 'sub')!r}: {str(blocker)!r} is a file, not a folder"


def test_control_characters_in_names_are_shown_escaped(tmp_path, cli_error) -> None:
    """A name holding a NUL byte or an escape sequence is printed visibly, never as raw control bytes."""
    assert "'no\\x00such\\x1b[31mmodel'" in cli_error(["memory", "--model", "no\x00such\x1b[31mmodel"])
    line = cli_error(["data", "stats", str(tmp_path / "a\x00b\x1b[31m.jsonl")])  # the path is not quoted there
    assert line == f"error: dataset file not found: {tmp_path}/a\\x00b\\x1b[31m.jsonl"


def test_visible_escapes_only_control_characters() -> None:
    from tunecost.cli.common import visible

    assert visible("GPU A40\tx\ny\x00 \u00e9\u2014ok") == "GPU A40\\tx\\ny\\x00 \u00e9\u2014ok"
    assert visible("\nleading and trailing\n") == "leading and trailing"


def test_no_blank_line_before_error_after_a_progress_bar(cli_runner) -> None:
    """A command that shows a progress bar and then fails prints `error:` as the first thing on stderr."""
    from tunecost.cli.main import app

    args = ["memory", "--model", "mixtral-8x7b", "--gpu-memory-gb", "0.001"]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: "), repr(result.stderr[:80])
    assert result.stderr.count("\n") == 1


def test_corrupt_parquet_dataset(tmp_path, cli_error) -> None:
    bad = tmp_path / "d.parquet"
    bad.write_bytes(b"not parquet at all")
    assert "cannot read it as parquet" in cli_error(["data", "stats", str(bad)])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("nan", "a finite number, got nan"),
        ("inf", "a finite number, got inf"),
        ("-1", "a positive number"),
        ("0", "a positive number"),
    ],
)
def test_gpu_memory_must_be_a_positive_number(cli_error, value, expected) -> None:
    assert f"--gpu-memory-gb must be {expected}" in cli_error(
        ["max-batch", "--model", "tiny-mixtral", "--device", "cpu", "--gpu-memory-gb", value]
    )


def test_negative_size_in_a_local_config(tmp_path, cli_error) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mixtral", "hidden_size": -5}))
    assert "sizes must be positive integers: hidden_size=-5" in cli_error(["memory", "--model", str(tmp_path)])


def test_a_misspelt_device_is_not_auto(cli_error) -> None:
    assert "unsupported device 'gpu0'" in cli_error(
        ["max-batch", "--model", "tiny-mixtral", "--gpu", "A40", "--device", "gpu0"]
    )
