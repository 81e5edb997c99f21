"""One job, one set of options: every job option `memory` takes, `estimate` takes with the same name, type and
default; `max-batch` takes the ones it measures with, the same way."""

from __future__ import annotations

import typer.main

from tunecost.cli.main import app

JOB_OPTIONS = (
    "model",
    "method",
    "experts_per_token",
    "lora_rank",
    "lora_alpha",
    "lora_targets",
    "quant_type",
    "double_quant",
    "dtype",
    "gradient_checkpointing",
    "reentrant",
    "attention",
    "optimizer",
    "seq_len",
    "stack",
    "fp8",
    "chunked_loss",
    "offload_activations",
    "optimizer_in_backward",
    "config",
)
MAX_BATCH_OPTIONS = (
    "method",
    "seq_len",
    "experts_per_token",
    "lora_rank",
    "lora_alpha",
    "gradient_checkpointing",
    "config",
)


def _options(command: str) -> dict[str, tuple]:
    group = typer.main.get_command(app)
    cmd = group.commands[command]  # type: ignore[attr-defined]
    return {p.name: (tuple(p.opts), tuple(p.secondary_opts), _kind(p), p.default) for p in cmd.params}


def _kind(param) -> object:
    descriptor = getattr(param, "type_descriptor", None)  # typer >= 0.22
    return descriptor.annotation if descriptor is not None else param.type.name


def test_estimate_takes_every_job_option_of_memory_alike() -> None:
    memory, estimate = _options("memory"), _options("estimate")
    for name in JOB_OPTIONS:
        assert name in memory and name in estimate, name
        assert memory[name] == estimate[name], name


def test_max_batch_takes_its_job_options_alike() -> None:
    memory, max_batch = _options("memory"), _options("max-batch")
    for name in MAX_BATCH_OPTIONS:
        assert memory[name] == max_batch[name], name


def test_quant_type_without_qlora_is_an_error_not_ignored(cli_error) -> None:
    job = ["--model", "Qwen/Qwen2.5-0.5B", "--gpu", "H100", "--seq-len", "256", "--quant-type", "nf4"]
    for command in (
        ["memory", "--method", "full"],
        ["estimate", "--method", "lora", "--epochs", "1", "--queries", "9"],
    ):
        line = cli_error([*command, *job])
        assert line.startswith("error: --quant-type nf4: the base weights' type of --method qlora; --method ")
    line = cli_error(["plan", "--method", "full,lora", *job, "--epochs", "1", "--queries", "9"])
    assert "--quant-type nf4" in line
    line = cli_error(["memory", "--method", "lora", *job[:-2], "--no-double-quant"])
    assert line.startswith("error: --no-double-quant: the base weights' type of --method qlora")


def test_gptq_options_beside_other_weights_are_errors_not_ignored(cli_error) -> None:
    job = ["memory", "--model", "Qwen/Qwen2.5-0.5B", "--seq-len", "256"]
    line = cli_error([*job, "--method", "qlora", "--gptq-group-size", "64"])
    assert line == (
        "error: --gptq-group-size: GPTQ weights' setting; this job's base weights are nf4 (--quant-type gptq, or a "
        "GPTQ checkpoint)"
    )
    assert "base weights are bf16" in cli_error([*job, "--method", "lora", "--gptq-kernel", "torch"])


def test_experts_impl_in_a_simulated_max_batch_search_is_an_error_not_ignored(cli_error) -> None:
    line = cli_error(
        ["max-batch", "--model", "tiny-mixtral", "--device", "cpu", "--gpu", "A40", "--experts-impl", "fast"]
    )
    assert line.startswith("error: --experts-impl fast: the implementation a measured search (CUDA) runs")


def test_lora_options_with_a_full_fine_tune_are_errors_not_ignored(cli_error) -> None:
    job = ["--model", "Qwen/Qwen2.5-0.5B", "--gpu", "H100", "--seq-len", "256"]
    commands = [["memory"], ["estimate", "--epochs", "1", "--queries", "9"], ["plan", "--queries", "9"]]
    for flag in (["--lora-rank", "64"], ["--lora-dropout", "0.3"], ["--lora-targets", "attention"]):
        for command in commands:
            line = cli_error([*command, "--method", "full", *job, *flag])
            assert line.startswith(f"error: {flag[0]}: an option of the LoRA adapter; --method full"), line
    line = cli_error(["max-batch", "--device", "cpu", "--method", "full", *job, "--lora-rank", "8"])
    assert line.startswith("error: --lora-rank: an option of the LoRA adapter; --method full")
