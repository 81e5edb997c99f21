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


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--gpu-memory-gb", "1e20"], "--gpu-memory-gb is larger than any GPU holds (at most 10000 GB)"),
        (["--gpu-memory-gib", "1e308"], "--gpu-memory-gib is larger than any GPU holds"),
        (["--method", "lora", "--lora-alpha", "0"], "LoRA alpha must be a positive number"),
        (["--method", "lora", "--lora-alpha", "-1"], "LoRA alpha must be a positive number"),
        (["--method", "lora", "--lora-alpha", "1e20"], "LoRA alpha must be a positive number at most 1e+06"),
    ],
)
def test_memory_sizes_past_any_gpu(cli_error, args: list[str], expected: str) -> None:
    assert expected in cli_error(["memory", "--model", "tiny-mixtral", *args])


def test_max_batch_memory_past_any_gpu(cli_error) -> None:
    args = ["max-batch", "--model", "tiny-mixtral", "--random-weights", "--seq-len", "16", "--gpu-memory-gb", "1e20"]
    assert "--gpu-memory-gb is larger than any GPU holds" in cli_error(args)


PROFILE = [
    "profile",
    "--model",
    "tiny-mixtral",
    "--random-weights",
    "--device",
    "cpu",
    "--steps",
    "1",
    "--seq-len",
    "16",
]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--template", "nosuch"], "unknown template 'nosuch'"),
        (["--tokenizer", "nosuch"], "--tokenizer applies to --dataset queries"),
        (["--dataset-limit", "3"], "--dataset-limit applies to --dataset queries"),
        (["--dataset-limit", "-1"], "--dataset-limit must be between 1 and"),
        (["--dataset", ""], "--dataset is empty"),
    ],
)
def test_profile_input_options_that_would_go_unused(tmp_path: Path, cli_error, args: list[str], expected: str) -> None:
    out = tmp_path / "run"
    assert expected in cli_error([*PROFILE, "--out", str(out), *args])
    assert not out.exists()  # refused before any record or model is made


@pytest.mark.parametrize(
    "args",
    [
        ["memory", "--model", "tiny-mixtral", "--gpu", ""],
        ["max-batch", "--model", "tiny-mixtral", "--random-weights", "--seq-len", "16", "--gpu", " "],
    ],
)
def test_an_empty_gpu_name_is_an_error(cli_error, args: list[str]) -> None:
    assert "GPU name is empty; known GPUs: A40-48GB" in cli_error(args)


def test_max_batch_empty_dataset(cli_error) -> None:
    assert "--dataset is empty" in cli_error(["max-batch", "--model", "tiny-mixtral", "--dataset", ""])


TRAIN = ["trainability", "--model", "tiny-mixtral", "--epochs", "1", "--num-train", "2", "--num-eval", "2"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--dataset", "synthetic-arith", "--eval-dataset", ""], "--eval-dataset is empty"),
        (["--dataset", " "], "--dataset is empty"),
        (["--dataset", "synthetic-arith", "--lr", "1e20"], "--lr must be a positive number at most 10"),
        (["--dataset", "synthetic-arith", "--lr", "0"], "--lr must be a positive number"),
    ],
)
def test_trainability_empty_dataset_and_absurd_lr(tmp_path: Path, cli_error, args: list[str], expected: str) -> None:
    assert expected in cli_error([*TRAIN, "--out", str(tmp_path / "run"), *args])
    assert not (tmp_path / "run").exists()
