"""More bad inputs, each one `error:` line naming the option or file, exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_cost_names_an_unknown_gpu_beside_usd_per_hour(cli_error) -> None:
    args = ["cost", "--queries", "1", "--epochs", "1", "--throughput", "1", "--usd-per-hour", "1", "--gpu", "nosuch"]
    assert "unknown GPU 'nosuch'" in cli_error(args)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"\xff\xfe\x00", "is not UTF-8 text"),
        (b"[1e999]", "entry 1 is inf"),
        (b"[" * 100_000 + b"]" * 100_000, "expected token lengths"),
        (b"[100000000000000000000]", "a token length must be between 1 and"),
        (b"12\n0\n", "entry 2: a token length must be between 1 and"),
        (b'{"lengths": "12"}', "expected token lengths"),
        (b"", "no lengths"),
    ],
)
def test_memory_dataset_lengths_file(tmp_path: Path, cli_error, content: bytes, expected: str) -> None:
    path = tmp_path / "lengths.json"
    path.write_bytes(content)
    line = cli_error(["memory", "--model", "tiny-mixtral", "--dataset-lengths", str(path)])
    assert expected in line and len(line) < 400


def test_memory_dataset_lengths_folder(tmp_path: Path, cli_error) -> None:
    assert "is a folder, not a file" in cli_error(
        ["memory", "--model", "tiny-mixtral", "--dataset-lengths", str(tmp_path)]
    )
