"""bench_moe_layer and `tunecost bench moe` on shapes small enough for a test (no speed claims here)."""

from __future__ import annotations

import json

import pytest

from tunecost.moe.bench import BENCH_IMPLS, bench_moe_layer

TINY = dict(tokens=32, hidden=32, intermediate=64, experts=4, top_k=2, rank=4, repeats=1, warmup=0)


@pytest.fixture(scope="module")
def rows():
    return bench_moe_layer(**TINY)


def test_every_impl_gets_a_row_with_ratios_against_peft_fused(rows):
    assert [r.impl for r in rows] == list(BENCH_IMPLS)
    by_impl = {r.impl: r for r in rows}
    assert by_impl["peft-fused"].speedup_vs_peft_fused == pytest.approx(1.0)
    for row in rows:
        assert row.ms_forward_backward > 0 and row.ms_forward <= row.ms_forward_backward
        assert row.peak_bytes == row.weight_bytes + row.step_peak_bytes and row.step_peak_bytes > 0
        assert row.tokens == 32 and row.device == "cpu" and row.dtype == "float32"
    assert by_impl["eager"].trainable == "full" and by_impl["fast"].trainable == "lora"
    # 4-bit expert storage shows in the block's own bytes
    assert by_impl["fast-4bit"].weight_bytes < 0.5 * by_impl["fast"].weight_bytes
    assert by_impl["qlora-linear4bit"].weight_bytes < 0.5 * by_impl["peft-fused"].weight_bytes
    assert by_impl["fast"].trainable_params == by_impl["peft-fused"].trainable_params


# `tunecost bench moe` on a layer small enough for a CLI test: 16 tokens, H 32, I 64, 4 experts, one repeat.
_TINY_BENCH = ["bench", "moe", "--tokens", "16", "--hidden", "32", "--intermediate", "64", "--experts", "4"]
_TINY_BENCH += ["--repeats", "1", "--warmup", "0"]


def test_cli_json(cli_runner):
    from tunecost.cli.main import app

    result = cli_runner.invoke(
        app,
        [*_TINY_BENCH, "--impls", "peft-fused,fast", "--json"],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["impl"] for r in rows] == ["peft-fused", "fast"]
    assert {"impl", "ms_forward_backward", "peak_bytes", "speedup_vs_peft_fused"} <= set(rows[0])


def test_cli_table_and_errors(cli_runner, cli_error):
    from tunecost.cli.main import app

    result = cli_runner.invoke(
        app,
        [*_TINY_BENCH, "--impls", "fast", "--no-memory"],
    )
    assert result.exit_code == 0, result.output
    assert "fast" in result.stdout
    assert "Valid choices" in cli_error(["bench", "moe", "--impls", "fastest"])
    assert "top-k" in cli_error(["bench", "moe", "--experts", "4", "--top-k", "5"])
    # 0 is an error, not "the default size"; a device this machine does not have is named, not a traceback
    assert "must be positive" in cli_error(["bench", "moe", "--tokens", "0"])
    assert "must be positive" in cli_error(["bench", "moe", "--hidden", "0"])
    assert "unsupported device 'tpu'" in cli_error(["bench", "moe", "--device", "tpu"])


def test_cuda_without_cuda_is_a_clear_error(cli_error):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert "CUDA is not available" in cli_error(["bench", "moe", "--device", "cuda"])
