"""--fp8 on the job commands (docs/fp8.md): one error line for a recipe that does not exist, a GPU without FP8
tensor cores, or QLoRA."""

from __future__ import annotations

import pytest

ESTIMATE = ["estimate", "--model", "llama-3.2-1b", "--epochs", "1", "--queries", "100", "--seq-len", "256"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--method", "lora", "--gpu", "A100-80GB", "--fp8", "tensorwise"], "--fp8: A100-80GB-SXM has no FP8"),
        (["--method", "qlora", "--gpu", "H100", "--fp8", "tensorwise"], "--fp8: FP8 training does not apply to QLoRA"),
        (["--method", "lora", "--gpu", "H100", "--fp8", "e4m3"], "unsupported FP8 recipe (--fp8) 'e4m3'"),
        (
            ["--method", "lora", "--gpu", "H100", "--fp8", "tensorwise", "--estimator", "paper"],
            "--fp8: the paper's eq. (1) and (2)",
        ),
    ],
)
def test_fp8_errors_are_one_line(cli_error, args: list[str], message: str) -> None:
    assert message in cli_error([*ESTIMATE, *args])


def test_memory_refuses_fp8_on_a_gpu_without_it(cli_error) -> None:
    line = cli_error(["memory", "--model", "llama-3.2-1b", "--method", "lora", "--gpu", "A40", "--fp8", "te-delayed"])
    assert "--fp8: A40-48GB has no FP8 tensor cores" in line


def test_multi_gpu_refuses_fp8_on_a_gpu_without_it(cli_error) -> None:
    line = cli_error([*ESTIMATE, "--method", "lora", "--gpu", "A100-80GB", "--gpus", "2", "--fp8", "tensorwise"])
    assert "--fp8: A100-80GB-SXM has no FP8 tensor cores" in line
