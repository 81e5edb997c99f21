"""`tunecost memory` through typer's CliRunner."""

from __future__ import annotations

import json

from tunecost.cli.main import app


def test_memory_json_with_gpu_memory(cli_runner, config_path, write_file):
    lengths = write_file("lengths.txt", "12\n40\n33\n")
    result = cli_runner.invoke(
        app,
        [
            "memory",
            "--model",
            config_path("small-mixtral"),
            "--method",
            "qlora",
            "--experts-per-token",
            "2",
            "--batch-size",
            "2",
            "--dataset-lengths",
            str(lengths),
            "--lora-rank",
            "8",
            "--gpu-memory-gb",
            "0.56",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
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


def test_memory_table_output(cli_runner, config_path):
    result = cli_runner.invoke(
        app,
        [
            "memory",
            "--model",
            config_path("small-mixtral"),
            "--method",
            "lora",
            "--seq-len",
            "32",
            "--lora-rank",
            "8",
            "--no-gradient-checkpointing",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "MiB" in result.stdout and "MB" in result.stdout and "PEAK" in result.stdout


def test_memory_errors_are_one_line(cli_error, config_path):
    line = cli_error(["memory", "--model", config_path("small-mixtral"), "--seq-len", "32", "--gpu-memory-gb", "0.001"])
    assert "does not fit even at batch size 1" in line and "short by" in line
    line = cli_error(["memory", "--model", config_path("tiny-blackmamba"), "--method", "lora"])
    assert "BlackMamba full fine-tuning only" in line
    line = cli_error(["memory", "--model", "llama-3.1-8b", "--method", "lora"])
    assert "dense model" in line
