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
    assert "File exists" in cli_error(["profile", "--model", "tiny-mixtral", "--out", str(taken)])


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
