"""`tunecost memory` through typer's CliRunner."""

from __future__ import annotations

import pytest


def test_memory_json_with_gpu_memory(cli_json, config_path, write_file):
    lengths = write_file("lengths.txt", "12\n40\n33\n")
    out = cli_json(
        "memory",
        model=config_path("small-mixtral"),
        method="qlora",
        experts_per_token=2,
        batch_size=2,
        dataset_lengths=lengths,
        lora_rank=8,
        gpu_memory_gb=0.56,
    )
    for key in (
        "peak_bytes",
        "breakdown",
        "flops_per_step",
        "max_batch_size",
        "device_overhead_bytes",
        "assumptions",
        "weight_bytes",
    ):
        assert key in out
    assert out["seq_len"] == 40  # the longest query decides
    assert out["breakdown"]["weights_4bit"] > 0
    assert out["max_batch_size"] >= 1
    assert out["max_batch"]["peak_bytes"] + out["max_batch"]["device_overhead_bytes"] <= 0.56e9


def test_memory_table_output(cli_ok, config_path):
    small = config_path("small-mixtral")
    result = cli_ok("memory", model=small, method="lora", seq_len=32, lora_rank=8, gradient_checkpointing=False)
    assert "MiB" in result.stdout and "MB" in result.stdout and "PEAK" in result.stdout


def test_memory_errors_are_one_line(cli_error, config_path):
    line = cli_error(["memory", "--model", config_path("small-mixtral"), "--seq-len", "32", "--gpu-memory-gb", "0.001"])
    assert "does not fit even at batch size 1" in line and "short by" in line
    line = cli_error(["memory", "--model", config_path("tiny-blackmamba"), "--method", "lora"])
    assert "BlackMamba full fine-tuning only" in line
    line = cli_error(["memory", "--model", "llama-3.1-8b", "--method", "lora", "--lora-targets", "experts,router"])
    assert "dense model" in line


@pytest.mark.parametrize(("model", "targets"), [("llama-3.1-8b", "attention,mlp"), ("mixtral-8x7b", "experts,router")])
def test_memory_lora_targets_follow_the_model(cli_json, model: str, targets: str) -> None:
    """Without --lora-targets a dense model gets attention and MLP adapters, an MoE model experts and router:
    the same step as naming them."""
    by_default = cli_json("memory", model=model, method="lora", seq_len=64)
    named = cli_json("memory", model=model, method="lora", seq_len=64, lora_targets=targets)
    by_default.pop("seconds_taken")
    named.pop("seconds_taken")
    assert by_default == named
