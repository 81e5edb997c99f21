"""`--config FILE`: a framework's own config answers as the same job given as flags (byte-identical --json), the
flags override it, and its defaults are named on stderr.

The configs are under configs/FORMAT/JOB/, one folder per job holding the file or the files read together (a
Trainer's arguments beside PEFT's adapter_config.json and a BitsAndBytesConfig; accelerate's YAML beside its DeepSpeed
JSON), each written as the framework's documentation and example folders write them, and three or more jobs per
format that differ in method, LoRA rank/alpha/targets, checkpointing, dtype, optimizer, sequence length, micro-batch
and (distributed formats) the data-parallel layout. Each simulation takes about a second, whatever the model's size;
the models are small ones of the catalog (Qwen2.5-0.5B/1.5B, Qwen3-0.6B/1.7B, SmolLM2-135M, gemma-2b). Not Llama
3.x: simulating one adds rope_theta to the catalog's cached rope_scaling, so the first Llama 3.x simulation of a
process is stored under another cache key than the second, identical command looks up (re-simulated: a different
`seconds_taken`, not byte-identical).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import typer

from tunecost.workload.frameworks.registry import read_configs

CONFIG_DIR = Path(__file__).parent / "configs"
JOBS = sorted(p.relative_to(CONFIG_DIR).as_posix() for p in CONFIG_DIR.glob("*/*") if p.is_dir())

# job: (what its files state, in tunecost's options; one default the files leave out, as named among the assumptions)
EXPECTED: dict[str, tuple[dict[str, object], str]] = {
    "llamafactory/lora_rank8": (
        {"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "lora_rank": 8, "lora_targets": "attention,mlp",
         "dtype": "bf16", "seq_len": 1024, "batch_size": 2, "epochs": 1.0},
        "lora_alpha 16: LLaMA-Factory's default (lora_rank * 2)",
    ),
    "llamafactory/qlora_rank64": (
        {"model": "Qwen/Qwen3-0.6B", "method": "qlora", "quant_type": "nf4", "lora_rank": 64, "lora_alpha": 128,
         "lora_targets": "q_proj,v_proj", "attention": "flash", "optimizer": "adamw-8bit", "seq_len": 512,
         "batch_size": 4},
        "double_quant on: LLaMA-Factory's default",
    ),
    "llamafactory/full_ds_z3_offload": (
        {"model": "Qwen/Qwen2.5-1.5B", "method": "full", "strategy": "zero3", "offload": "params",
         "dtype": "fp16", "gradient_checkpointing": False, "seq_len": 2048, "batch_size": 1, "epochs": 3.0},
        "optimizer adamw: LLaMA-Factory's default (transformers' optim adamw_torch_fused, torch >= 2.8)",
    ),
    "llamafactory_v1/lora_fsdp2": (
        {"model": "Qwen/Qwen3-0.6B", "method": "lora", "lora_rank": 16, "lora_alpha": 32,
         "lora_targets": "attention,mlp", "strategy": "fsdp2", "reentrant": False, "seq_len": 1024, "batch_size": 2,
         "epochs": 1},
        "lora_dropout 0.05: LLaMA-Factory v1's default",
    ),
    "llamafactory_v1/qlora_single_gpu": (
        {"model": "Qwen/Qwen2.5-0.5B", "method": "qlora", "quant_type": "nf4", "lora_rank": 8, "lora_alpha": 16,
         "lora_dropout": 0.0, "lora_targets": "attention", "gradient_checkpointing": False, "seq_len": 512,
         "batch_size": 4, "epochs": 2},
        "double_quant on: LLaMA-Factory v1's default",
    ),
    "llamafactory_v1/full_fsdp2_offload": (
        {"model": "Qwen/Qwen3-0.6B", "method": "full", "strategy": "fsdp2", "offload": "params", "attention": "flash",
         "seq_len": 2048, "batch_size": 1, "epochs": 1},
        "optimizer adamw: LLaMA-Factory v1's default without optim_config (torch.optim.AdamW, multi-tensor)",
    ),
    "axolotl/lora_r16": (
        {"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "lora_rank": 16, "lora_alpha": 32,
         "lora_targets": "attention,mlp", "gradient_checkpointing": True, "seq_len": 1024, "batch_size": 2},
        "reentrant on: axolotl's default with gradient_checkpointing (no gradient_checkpointing_kwargs)",
    ),
    "axolotl/qlora_r32_8bit_adam": (
        {"model": "HuggingFaceTB/SmolLM2-135M", "method": "qlora", "lora_rank": 32, "lora_alpha": 16,
         "lora_targets": "attention,mlp", "optimizer": "adamw-8bit", "attention": "flash", "seq_len": 2048,
         "batch_size": 2},
        "quant_type nf4: axolotl's default for qlora (loaders/model.py)",
    ),
    "axolotl/lora_8bit": (
        {"model": "Qwen/Qwen2.5-0.5B", "method": "qlora", "quant_type": "int8", "lora_rank": 32, "lora_alpha": 16,
         "lora_targets": "attention,mlp", "optimizer": "adamw-8bit", "attention": "flash", "seq_len": 512,
         "batch_size": 2, "epochs": 4},
        "load_in_8bit with adapter lora: LLM.int8 base weights (--quant-type int8)",
    ),
    "axolotl/fft_fsdp2": (
        {"model": "Qwen/Qwen3-0.6B", "method": "full", "strategy": "fsdp2", "gradient_checkpointing": True,
         "reentrant": False, "seq_len": 1024, "batch_size": 1, "epochs": 2},
        "method full: axolotl's default (no adapter)",
    ),
    "torchtune/lora_single_device": (
        {"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "lora_rank": 8, "lora_alpha": 16,
         "lora_targets": "attention,mlp", "gradient_checkpointing": True, "chunked_loss": True, "seq_len": 1024,
         "batch_size": 2},
        "GPUs: torchtune's recipe and `tune run --nproc_per_node` are not in the file (give --gpus)",
    ),
    "torchtune/qlora_single_device": (
        {"model": "google/gemma-2b", "method": "qlora", "lora_rank": 64, "lora_alpha": 128,
         "lora_targets": "mlp,q_proj,v_proj,o_proj", "gradient_checkpointing": False, "seq_len": 2048,
         "batch_size": 4},
        "attention sdpa: torchtune's model calls torch's scaled_dot_product_attention",
    ),
    "torchtune/full_distributed": (
        {"model": "Qwen/Qwen3-0.6B", "method": "full", "optimizer": "adamw-8bit", "optimizer_in_backward": True,
         "strategy": "fsdp2", "num_gpus": 4, "gradient_checkpointing": True, "seq_len": 1024, "batch_size": 4},
        "strategy fsdp2: torchtune's distributed recipes shard with FSDP2",
    ),
    "hf/qlora_r8": (
        {"model": "Qwen/Qwen2.5-0.5B", "method": "qlora", "quant_type": "nf4", "double_quant": True,
         "lora_rank": 8, "lora_alpha": 16, "lora_targets": "attention", "dtype": "bf16", "batch_size": 2},
        "reentrant False (use_reentrant unset): transformers TrainingArguments' default",
    ),
    "hf/lora_all_linear": (
        {"model": "Qwen/Qwen2.5-1.5B", "method": "lora", "lora_rank": 32, "lora_alpha": 64,
         "lora_targets": "attention,mlp", "dtype": "fp16", "reentrant": True, "batch_size": 4, "epochs": 2},
        "attention sdpa (attn_implementation unset): transformers' default",
    ),
    "hf/sft_qlora": (
        {"model": "HuggingFaceTB/SmolLM2-135M", "method": "qlora", "quant_type": "nf4", "double_quant": True,
         "lora_rank": 64, "lora_alpha": 16, "lora_targets": "attention", "optimizer": "adamw-8bit",
         "seq_len": 2048, "batch_size": 1, "gradient_checkpointing": False},
        "loss_type chunked_nll (TRL SFTConfig's default since TRL 1.7; before it nll: set loss_type nll there): the "
        "head and its loss per 256 tokens, checkpointed, no logits",
    ),
    "hf/sft_full": (
        {"model": "Qwen/Qwen3-0.6B", "method": "full", "optimizer": "adamw-8bit", "seq_len": 512,
         "batch_size": 8},
        "gradient_checkpointing on: TRL SFTConfig's default",
    ),
    "accelerate/deepspeed_zero2": (
        {"model": "Qwen/Qwen2.5-0.5B", "strategy": "zero2", "num_gpus": 2, "dtype": "bf16", "batch_size": 2},
        "train_micro_batch_size_per_gpu auto: the Trainer's per_device_train_batch_size",
    ),
    "accelerate/fsdp2_lora": (
        {"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "strategy": "fsdp2", "num_gpus": 4,
         "gradient_checkpointing": True, "reentrant": False, "lora_rank": 16, "lora_targets": "attention,mlp",
         "seq_len": 1024, "batch_size": 4},
        "optimizer adamw (optim adamw_torch_fused with torch >= 2.8): TRL SFTConfig's default",
    ),
    "accelerate/deepspeed_zero3_offload": (
        {"model": "Qwen/Qwen3-1.7B", "method": "full", "strategy": "zero3", "offload": "params",
         "num_gpus": 16, "gpus_per_node": 8, "dtype": "fp16", "seq_len": 2048, "batch_size": 2},
        "mixed_precision no (accelerate's default): accelerate adds none; the script's bf16/fp16, else fp32, decides",
    ),
    "litgpt/lora_r8": (
        {"model": "Qwen/Qwen2.5-0.5B", "method": "lora", "lora_rank": 8, "lora_alpha": 16,
         "lora_targets": "q_proj,v_proj", "num_gpus": 1, "gradient_checkpointing": False, "seq_len": 1024,
         "batch_size": 2},
        "lora_key false, lora_projection false, lora_mlp false, lora_head false: litgpt's defaults",
    ),
    "litgpt/qlora_nf4_dq": (
        {"model": "google/gemma-2b", "method": "qlora", "quant_type": "nf4", "double_quant": True,
         "lora_rank": 32, "lora_alpha": 16, "lora_targets": "mlp,q_proj,v_proj", "dtype": "bf16", "seq_len": 512,
         "batch_size": 2, "epochs": 2},
        "optimizer adamw: litgpt runs bitsandbytes' PagedAdamW under quantize (paging not modelled)",
    ),
    "litgpt/full_fsdp": (
        {"model": "Qwen/Qwen3-0.6B", "method": "full", "num_gpus": 4, "strategy": "fsdp1",
         "gradient_checkpointing": True, "seq_len": 1024, "batch_size": 4},
        "num_nodes 1: litgpt's default",
    ),
    "torchtitan/qwen3_0.6b_fsdp2": (
        {"model": "Qwen/Qwen3-0.6B", "method": "full", "strategy": "fsdp2", "num_gpus": 2,
         "gradient_checkpointing": True, "dtype": "bf16", "seq_len": 1024, "batch_size": 2},
        "optimizer AdamW: torchtitan's default",
    ),
    "torchtitan/qwen3_1.7b_hsdp": (
        {"model": "Qwen/Qwen3-1.7B", "strategy": "hsdp", "num_gpus": 8, "gpus_per_node": 4, "seq_len": 2048,
         "batch_size": 4},
        "training.mixed_precision_param bfloat16: torchtitan's default",
    ),
    "torchtitan/qwen3_0.6b_cpu_offload": (
        {"model": "Qwen/Qwen3-0.6B", "strategy": "fsdp2", "num_gpus": 8, "offload": "params", "dtype": "fp32",
         "gradient_checkpointing": False, "seq_len": 512, "batch_size": 8},
        "training.dtype float32: torchtitan's default",
    ),
}  # fmt: skip

# (job, what): a reader's mis-read of that job, kept as written and marked until the reader is fixed
READER_BUGS: dict[tuple[str, str], str] = {}  # (job, command) -> a reader bug the case shows
# each command's arguments beside the job, the same for the config and the flags. Test time is the simulations' (about
# a second each, cached on disk): max-batch stops at batch 4 (probes 1, 2, 4), and estimate prices the job on the
# per-rank simulator (`--gpus 1` where the job names no GPU count; two simulations, where the single-GPU search of the
# largest batch takes seven)
COMMANDS = {
    "memory": [],
    "estimate": ["--gpu", "RTX-4090", "--queries", "1000"],
    "max-batch": ["--gpu", "RTX-4090", "--device", "cpu", "--limit", "4"],
}
ESTIMATE_UNSTATED = {"epochs": ["--epochs", "1"], "num_gpus": ["--gpus", "1"]}  # estimate's, where the job has none
UNSTATED = {"method": ["--method", "qlora"]}  # every command's, where the files do not say it
# `make test` runs the first job of each format under each command: the three commands read a config through one
# option group, and differ in what they ask of the job. CI runs every pair (`long`).
SAMPLED = {min(j for j in JOBS if j.split("/")[0] == fmt) for fmt in {j.split("/")[0] for j in JOBS}}


def _files(job: str) -> list[str]:
    """The job's files in name order, as a user passes them (`--config A --config B`)."""
    return sorted(str(p) for p in (CONFIG_DIR / job).iterdir() if p.is_file())


def _param(job: str, what: str, *values: str):
    reason = READER_BUGS.get((job, what))
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    marks += [pytest.mark.long] if values and job not in SAMPLED else []
    return pytest.param(*values, job, marks=marks, id="-".join([*values, job]))


def _flags(command: str, options: dict) -> list[str]:
    """The job's options as the command's own flags: each option the command takes, as `--config` sets it."""
    import typer

    from tunecost.cli.main import app

    out: list[str] = []
    for param in typer.main.get_command(app).commands[command].params:
        if param.name not in options or param.name == "config":
            continue
        value, flag = options[param.name], param.opts[0]
        if isinstance(value, bool) and (value or param.secondary_opts):
            out.append(flag if value else param.secondary_opts[0])
        elif isinstance(value, bool):
            assert not param.default, (command, param.name)  # an off switch with no --no- form: off by default
        else:
            out += [flag, str(value)]
    return out


def _json(cli_runner, args: list[str]) -> str:
    from tunecost.cli.main import app

    result = cli_runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_every_job_folder_is_checked_and_each_format_has_three_jobs() -> None:
    assert sorted(EXPECTED) == JOBS
    formats = {job.split("/")[0] for job in JOBS}
    assert formats == {
        "llamafactory",
        "llamafactory_v1",
        "axolotl",
        "torchtune",
        "hf",
        "accelerate",
        "litgpt",
        "torchtitan",
    }
    for fmt in formats:
        clean = [j for j in JOBS if j.startswith(f"{fmt}/") and not any(k[0] == j for k in READER_BUGS)]
        assert len(clean) >= 3, (fmt, clean)


@pytest.mark.parametrize("job", [_param(job, "read") for job in JOBS])
def test_a_job_loads_as_its_files_say(job: str) -> None:
    expected, assumption = EXPECTED[job]
    read = read_configs(_files(job))
    assert {name: read.options.get(name) for name in expected} == expected
    assert assumption in read.assumptions, read.assumptions


@pytest.mark.parametrize(("command", "job"), [_param(job, command, command) for command in COMMANDS for job in JOBS])
def test_a_config_answers_as_its_flags(cli_runner, command: str, job: str) -> None:
    paths = _files(job)
    read = read_configs(paths)
    options = {**read.options, "framework": read.framework}  # estimate takes the config's framework too
    options.pop("max_steps", None)  # steps need the config's global batch (no flag): --epochs 1 replaces them in both
    unstated = {**UNSTATED, **(ESTIMATE_UNSTATED if command == "estimate" else {})}
    extra = [*COMMANDS[command], *(arg for name, args in unstated.items() if name not in options for arg in args)]
    from_config = _json(cli_runner, [command, *[a for p in paths for a in ("--config", p)], *extra])
    # a config states its layout (data parallelism alone unless it names TP/PP/CP): --tp 1 says so on the flags
    stated = ["--tp", "1"] if command == "estimate" and not {"tp", "pp", "cp"} & set(options) else []
    from_flags = _json(cli_runner, [command, *_flags(command, options), *stated, *extra])
    assert from_config == from_flags


def test_the_configs_framework_reaches_estimates_throughput(cli_runner) -> None:
    """A litgpt config runs on the tunecost stack but in litgpt (torchtune's family): its throughput prior is said."""
    from tunecost.cli.main import app
    from tunecost.estimate.throughput.stack_priors import stack_prior

    (path,) = _files("litgpt/lora_r8")
    args = ["estimate", "--config", path, *COMMANDS["estimate"], "--epochs", "1", "--verbose"]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    prior = stack_prior(read_configs([path]).options["stack"], "litgpt")
    assert prior is not None and prior.note in " ".join(result.stdout.split())


def test_an_unknown_framework_is_one_error_line(cli_error) -> None:
    line = cli_error(
        ["estimate", "--model", "qwen2.5-0.5b", *COMMANDS["estimate"], "--epochs", "1", "--framework", "x"]
    )
    assert "framework 'x' is not one of" in line and "torchtune" in line


def test_flags_override_the_config_and_defaults_are_named(cli_runner) -> None:
    from tunecost.cli.main import app

    (path,) = _files("llamafactory/lora_rank8")
    result = cli_runner.invoke(app, ["memory", "--config", path, "--lora-rank", "32", "--json"])
    assert result.exit_code == 0, result.output
    flags = _json(cli_runner, ["memory", *_flags("memory", {**read_configs([path]).options, "lora_rank": 32})])
    assert result.stdout == flags
    assert "assumed: lora_alpha 16: LLaMA-Factory's default" in result.stderr
    assert "not modelled" in result.stderr and "learning_rate" in result.stderr


def test_an_assumption_about_an_option_the_flags_give_is_not_printed(cli_runner) -> None:
    """The config's default for lora_alpha is named unless --lora-alpha replaces it; a flag the command line
    refuses is the only line."""
    from tunecost.cli.main import app

    (path,) = _files("llamafactory/lora_rank8")
    said = cli_runner.invoke(app, ["memory", "--config", path, "--lora-alpha", "8", "--json"])
    assert said.exit_code == 0, said.output
    assert "assumed: lora_alpha" not in said.stderr and "assumed: " in said.stderr
    bad = cli_runner.invoke(app, ["memory", "--config", path, "--seq-len", "0"])
    assert bad.exit_code == 2 and bad.stderr.startswith("error:") and "assumed:" not in bad.stderr


@pytest.mark.parametrize(
    ("text", "suffix", "message"),
    [
        ("model_name_or_path: [unclosed", ".yaml", "not valid YAML"),
        ('{"per_device_train_batch_size": 2,', ".json", "not valid JSON"),
        ("[model\nname = 1", ".toml", "not valid TOML"),
        ("just: a mapping\nof: nothing known\n", ".yaml", "not a config tunecost reads"),
        ("model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nlora_rank: eight\n", ".yaml", "lora_rank"),
        ("model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: dpo\nfinetuning_type: lora\n", ".yaml", "stage"),
        # a key given twice: which value the user meant is not known (YAML and JSON readers keep the last)
        ("stage: sft\nlora_rank: 8\nfinetuning_type: lora\nlora_rank: 16\n", ".yaml", "'lora_rank' is given twice"),
        ('{"per_device_train_batch_size": 2, "per_device_train_batch_size": 4}', ".json", "given twice"),
    ],
)
def test_a_bad_config_is_one_error_line(cli_error, tmp_path: Path, text: str, suffix: str, message: str) -> None:
    path = tmp_path / f"bad{suffix}"
    path.write_text(text, encoding="utf-8")
    line = cli_error(["memory", "--config", str(path)])
    assert str(path) in line and message in line


def test_model_parallel_degrees_a_command_does_not_take_are_named(cli_runner, tmp_path: Path) -> None:
    """A config's layout (strategy, tensor/pipeline degrees) is never dropped silently by a command without
    those options."""
    from tunecost.cli.main import app

    path = tmp_path / "tp.toml"
    path.write_text('[model]\nname = "qwen3"\nflavor = "0.6B"\n[parallelism]\ntensor_parallel_degree = 2\n')
    result = cli_runner.invoke(app, ["memory", "--config", str(path), "--gpu", "no-such-gpu"])
    params = {p.name for p in typer.main.get_command(app).commands["memory"].params}  # type: ignore[attr-defined]
    if "tp" not in params:
        stderr = " ".join(result.stderr.split())
        assert "warning: this command does not take strategy fsdp2, tp 2, sequence_parallel True from" in stderr


def test_a_config_without_a_method_asks_for_it(cli_runner, cli_error) -> None:
    """An accelerate or DeepSpeed file, or a Trainer's arguments, alone do not say full, LoRA or QLoRA (the model
    is wrapped in the user's code): a command that prices one method asks for --method; plan weighs all three."""
    from tunecost.cli.main import app

    path = str(Path(__file__).parent / "configs" / "accelerate" / "deepspeed_zero2" / "accelerate.yaml")
    args = ["estimate", "--config", path, "--model", "Qwen/Qwen2.5-0.5B", *COMMANDS["estimate"]]
    line = cli_error([*args, "--epochs", "1"])
    assert line.startswith("error: --method: ") and "does not say full, LoRA or QLoRA" in line
    assert "give --method full, lora or qlora" in line
    result = cli_runner.invoke(app, [*args, "--epochs", "1", "--method", "full"])
    assert result.exit_code == 0, result.output


@pytest.mark.long  # CI runs it (7-15 s of work no other test shares)
def test_plan_takes_the_data_cut_a_config_makes(cli_runner, tmp_path) -> None:
    """LLaMA-Factory's max_samples sizes the run when its dataset is one tunecost cannot read, as in estimate."""
    path = tmp_path / "lf.yaml"
    path.write_text(
        "model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nfinetuning_type: lora\ndataset: my_set\nmax_samples: 500\n"
        "cutoff_len: 512\nnum_train_epochs: 1\n"
    )
    from tunecost.cli.main import app

    result = cli_runner.invoke(app, ["plan", "--config", str(path), "--gpu", "H100", "--max-gpus", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert "500 queries per epoch: the config cuts the data there" in " ".join(result.stderr.split())


def test_the_configs_framework_reaches_plans_throughput(cli_runner) -> None:
    """plan prices a litgpt config's setups with litgpt's family prior, as estimate does; --framework names another."""
    from tunecost.cli.main import app
    from tunecost.estimate.throughput.stack_priors import stack_prior

    (path,) = _files("litgpt/lora_r8")
    args = ["plan", "--config", path, "--gpu", "RTX-4090", "--max-gpus", "1", "--queries", "1000", "--epochs", "1"]
    result = cli_runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    stack = read_configs([path]).options["stack"]
    prior = stack_prior(stack, "litgpt")
    assert prior is not None and prior.note in _plan_text(result.stdout)
    flagged = cli_runner.invoke(app, [*args, "--framework", "nemo", "--json"])
    nemo = stack_prior(stack, "nemo")
    assert flagged.exit_code == 0 and nemo is not None and nemo.note in _plan_text(flagged.stdout)
    assert prior.note not in _plan_text(flagged.stdout)


def _plan_text(stdout: str) -> str:
    return json.dumps(json.loads(stdout[stdout.index("{") :]), ensure_ascii=False)


def test_an_unknown_framework_is_one_plan_error_line(cli_error) -> None:
    line = cli_error(["plan", "--model", "qwen2.5-0.5b", "--queries", "1000", "--epochs", "1", "--framework", "x"])
    assert "framework 'x' is not one of" in line


def test_several_gpus_search_only_the_strategies_the_configs_framework_runs(cli_runner) -> None:
    """A torchtune config on 2 GPUs is priced as its distributed recipe runs it (FSDP2), the rest named once;
    --strategy weighs others."""
    from tunecost.cli.main import app

    config = str(CONFIG_DIR / "torchtune" / "lora_single_device" / "lora_single_device.yaml")
    args = ["estimate", "--config", config, "--gpu", "H100", "--gpus", "2", "--epochs", "1", "--json"]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert {s["plan"]["strategy"] for s in json.loads(result.stdout)["setups"]} == {"fsdp2"}
    assert "not searched, torchtune's distributed recipes shard with FSDP2" in " ".join(result.stderr.split())
    given = cli_runner.invoke(app, [*args, "--strategy", "ddp,fsdp2"])
    assert {s["plan"]["strategy"] for s in json.loads(given.stdout)["setups"]} == {"ddp", "fsdp2"}


def test_plan_weighs_only_the_strategies_the_configs_framework_runs(cli_runner) -> None:
    """A torchtune config's plan on up to 2 GPUs: one GPU or FSDP2, as torchtune's recipes run; the rest noted."""
    from tunecost.cli.main import app

    config = str(CONFIG_DIR / "torchtune" / "lora_single_device" / "lora_single_device.yaml")
    args = ["plan", "--config", config, "--gpu", "H100", "--max-gpus", "2", "--queries", "1000", "--epochs", "1"]
    result = cli_runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout[result.stdout.index("{") :])["plan"]
    assert {o["setup"]["plan"]["strategy"] for o in plan["front"]} == {"single", "fsdp2"}
    said = [n for n in plan["notes"] if "not searched, torchtune's distributed recipes shard with FSDP2" in n]
    assert len(said) == 1 and said[0].startswith("ddp, fsdp1, fsdp2-shard-grad-op, hsdp, zero1")


@pytest.mark.long  # a cold LoRA step of Qwen2.5-0.5B no other test shares (25 s): CI runs it
def test_a_trl_split_is_counted_in_the_split_the_catalog_counts(cli_runner, tmp_path) -> None:
    """A slice of ultrachat_200k's train_sft (the split its catalog row counts) takes its share of the rows; a split
    the catalog has no count of (train_gen) leaves the row's own count, said with the way to give the queries; a
    mixture of counted slices is priced at their sum, less its test_split_size."""
    from tunecost.cli.main import app

    text = "model_name_or_path: Qwen/Qwen2.5-0.5B\nuse_peft: true\nper_device_train_batch_size: 2\n"
    text += "datasets:\n  - path: HuggingFaceH4/ultrachat_200k\n    split: {}\n"
    answers = []
    for split in ("train_sft[:10%]", "train_gen"):
        path = tmp_path / "sft.yaml"
        path.write_text(text.format(split), encoding="utf-8")
        result = cli_runner.invoke(app, ["estimate", "--gpu", "H100", "--json", "--config", str(path)])
        assert result.exit_code == 0, result.output
        answers.append((json.loads(result.stdout)[0]["num_queries"], " ".join(result.stderr.split())))
    (sliced, said), (whole, unsliced) = answers
    assert sliced == round(0.1 * whole) and f"the config's split train_sft[:10%] of {whole}" in said
    assert f"{whole} queries per epoch: the train_sft split's, not the config's split train_gen (give --queries)" in (
        unsliced
    )
    mixed = text.format("train_sft[:10%]\n  - path: HuggingFaceH4/ultrachat_200k\n    split: train_sft[-5%:]")
    path.write_text(mixed + "test_split_size: 0.1\n", encoding="utf-8")
    result = cli_runner.invoke(app, ["estimate", "--gpu", "H100", "--json", "--config", str(path)])
    assert result.exit_code == 0, result.output
    total = round(0.1 * whole) + round(0.05 * whole)  # TRL's get_dataset: both slices, then train_test_split
    assert json.loads(result.stdout)[0]["num_queries"] == total - math.ceil(0.1 * total)
    assert f"datasets: {total} queries per epoch" in " ".join(result.stderr.split())
    result = cli_runner.invoke(
        app, ["estimate", "--gpu", "H100", "--json", "--config", str(path), "--dataset", "ultrachat-200k"]
    )
    assert result.exit_code == 0, result.output  # the command line's data: its queries, less the config's test split
    assert json.loads(result.stdout)[0]["num_queries"] == whole - math.ceil(0.1 * whole)


def test_a_torchtune_split_slice_sets_the_queries_per_epoch(cli_runner, cli_error, tmp_path) -> None:
    """`dataset.split: train[:95%]` loads 95 % of the train split (datasets' slicing, rounded to the closest row):
    the run's queries, said among the assumptions; a spec datasets cannot read is one error line naming the key."""
    from tunecost.cli.main import app

    (path,) = _files("torchtune/lora_single_device")
    text = Path(path).read_text(encoding="utf-8")
    sliced, bad = tmp_path / "sliced.yaml", tmp_path / "bad.yaml"
    sliced.write_text(text.replace("  packed: False\n", "  packed: False\n  split: train[:95%]\n"), encoding="utf-8")
    bad.write_text(text.replace("  packed: False\n", "  packed: False\n  split: train[:x]\n"), encoding="utf-8")
    args = ["estimate", "--gpu", "H100", "--json"]
    whole = json.loads(cli_runner.invoke(app, [*args, "--config", path]).stdout)[0]["num_queries"]
    result = cli_runner.invoke(app, [*args, "--config", str(sliced)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["num_queries"] == round(0.95 * whole)
    said = f"assumed: {round(0.95 * whole)} queries per epoch: the config's split train[:95%] of {whole}"
    assert said in " ".join(result.stderr.split())
    assert "dataset.split: train[:x]: not a Hugging Face split spec" in cli_error(["estimate", "--config", str(bad)])
