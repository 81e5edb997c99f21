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
        (["--method", "lora", "--lora-alpha", "0"], "--lora-alpha: must be a positive number"),
        (["--method", "lora", "--lora-alpha", "-1"], "--lora-alpha: must be a positive number"),
        (["--method", "lora", "--lora-alpha", "1e20"], "--lora-alpha: must be a positive number at most 1e+06"),
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


# Input options of `profile` that are wrong or would go unused, and the error each gives.
PROFILE_INPUT_ERRORS = {
    "--template nosuch": "unknown template 'nosuch'",
    "--tokenizer nosuch": "--tokenizer applies to --dataset queries",
    "--dataset-limit 3": "--dataset-limit applies to --dataset queries",
    "--template alpaca": "--template applies to --dataset queries",
    "--max-length 64": "--max-length applies to --dataset queries",
    "--dataset-limit -1": "--dataset-limit must be between 1 and",
}


@pytest.mark.parametrize(("args", "expected"), PROFILE_INPUT_ERRORS.items())
def test_profile_input_options_that_would_go_unused(tmp_path: Path, cli_error, args: str, expected: str) -> None:
    out = tmp_path / "run"
    assert expected in cli_error([*PROFILE, "--out", str(out), *args.split()])
    assert not out.exists()  # refused before any record or model is made


TRAIN = ["trainability", "--model", "tiny-mixtral", "--epochs", "1", "--num-train", "2", "--num-eval", "2"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--dataset", "synthetic-arith", "--lr", "1e20"], "--lr: must be a positive number at most 10"),
        (["--dataset", "synthetic-arith", "--lr", "0"], "--lr: must be a positive number"),
    ],
)
def test_trainability_absurd_lr(tmp_path: Path, cli_error, args: list[str], expected: str) -> None:
    assert expected in cli_error([*TRAIN, "--out", str(tmp_path / "run"), *args])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("cells", [("x", "8", "512"), ("0", "8", "512"), ("16", "inf", "512"), ("16", "8", "1e30")])
def test_validate_skips_rows_with_unusable_numbers(tmp_path: Path, cli_runner, cells: tuple[str, str, str]) -> None:
    """A corpus row whose LoRA alpha, batch or length is not a usable number is skipped with its reason."""
    import json

    from tunecost.cli.main import app

    alpha, batch, seq = cells
    header = (
        "id,source,model,method,lora_rank,lora_alpha,lora_targets,quantization,compute_dtype,batch_size_per_gpu,"
        "seq_len,seq_len_kind,grad_ckpt,attention,optimizer,stack,gpu,num_gpus,quantity,value,unit\n"
    )
    row = (
        f"x-1,src,mixtral-8x7b,lora,16,{alpha},q_proj;v_proj,none,bf16,{batch},{seq},padded,on,sdpa,adamw,"
        "hf-transformers+peft,A100-SXM4-80GB,1,peak_allocated_gib,40,GiB\n"
    )
    path = tmp_path / "corpus.csv"
    path.write_text(header + row, encoding="utf-8")
    result = cli_runner.invoke(app, ["validate", str(path), "--json"])
    assert result.exit_code == 0, result.output
    (out,) = json.loads(result.stdout)
    assert out["status"] != "ok" and out["predicted"] is None
