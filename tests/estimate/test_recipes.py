"""Launch recipes load in the frameworks they name: accelerate's config parser and launcher, transformers' and PEFT's
argument classes, DeepSpeed's config class, torchtune's config loader, LLaMA-Factory's argument parser and SkyPilot's
Task.from_yaml. The last four are optional (importorskip); the structure checks beside them always run."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.errors import TunecostError
from tunecost.estimate import recipes
from tunecost.estimate.recipes import TARGETS, LaunchJob, common, skypilot, torchtune_config, write_recipe
from tunecost.estimate.recipes import torchtune as tt_recipe
from tunecost.workload.frameworks.registry import read_config, read_configs

KEYS_DIR = Path(recipes.__file__).parents[2] / "workload" / "frameworks" / "keys"
BASE = {"seq_len": 2048, "micro_batch": 2, "grad_accum": 4}
JOBS = {  # name -> a planned setup; one per layout the targets render differently
    "single-qlora": dict(model="meta-llama/Llama-2-7b-hf", method="qlora", gpu="RTX4090-24GB", attention="flash"),
    "ddp-lora": dict(model="mistralai/Mistral-7B-v0.1", method="lora", gpu="A100-80GB-SXM", num_gpus=4, strategy="ddp"),
    "ddp-lora-8bit": dict(model="mistralai/Mistral-7B-v0.1", method="qlora", quant_type="int8", gpu="L40S-48GB",
                          num_gpus=2, strategy="ddp"),
    "fsdp1-lora-offload": dict(
        model="meta-llama/Meta-Llama-3-8B", method="lora", gpu="A100-80GB-SXM", num_gpus=8, strategy="fsdp1",
        offload="params", dtype="fp16", lora_targets=("attention",),
    ),
    "fsdp2-qlora-2nodes": dict(
        model="meta-llama/Llama-2-70b-hf", method="qlora", gpu="H100-80GB-SXM", num_gpus=16, strategy="fsdp2",
        clouds=(("aws", "us-east-1"), ("runpod-secure", ""), ("runpod-community", ""), ("modal", "")),
    ),
    "shard-grad-op-full": dict(model="Qwen/Qwen2.5-7B", method="full", gpu="H200-141GB", num_gpus=4,
                               strategy="fsdp2-shard-grad-op", optimizer="adamw-8bit"),
    "hsdp-full": dict(model="meta-llama/Llama-3.1-70B", method="full", gpu="H100-80GB-SXM", num_gpus=16,
                      strategy="hsdp"),
    "zero1-8bit": dict(model="Qwen/Qwen2-7B", method="full", gpu="L40S-48GB", num_gpus=4, strategy="zero1",
                       optimizer="adamw-8bit"),
    "zero2-offload": dict(model="google/gemma-7b", method="lora", gpu="A10G-24GB", num_gpus=8, strategy="zero2",
                          offload="optimizer", clouds=(("aws", ""),)),
    "zero3-params-2nodes-sgd": dict(
        model="meta-llama/Meta-Llama-3-70B", method="full", gpu="A100-80GB-SXM", num_gpus=16, strategy="zero3",
        offload="params", optimizer="sgd", dtype="fp32", lora_targets=(),
    ),
    "moe-qlora-zero3": dict(model="mistralai/Mixtral-8x7B-v0.1", method="qlora", gpu="H100-80GB-SXM", num_gpus=8,
                            strategy="zero3", lora_targets=("attention", "experts", "router"), lora_alpha=24.5),
}  # fmt: skip


def make_job(name: str, **changes: Any) -> LaunchJob:
    return LaunchJob(**(BASE | JOBS[name] | changes))


def launch_words(path: Path) -> list[str]:
    """The command of a launch.sh as words, each ${VAR:-default} read as its default."""
    command = path.read_text().split('cd "$(dirname "$0")"\n', 1)[1].replace("\\\n", " ")
    return shlex.split(re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", command))


def known_keys(*names: str) -> set[str]:
    """Keys a framework accepts: the key lists tunecost's config readers check against (each names its source)."""
    lines = [line.strip() for n in names for line in (KEYS_DIR / f"{n}.txt").read_text().splitlines()]
    return {line for line in lines if line and not line.startswith("#")}


def dotted(tree: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted key paths, as the key lists write them (DeepSpeed's `optimizer` is one key: its params are free)."""
    out = set()
    for key, value in tree.items():
        out |= dotted(value, f"{prefix}{key}.") if isinstance(value, dict) and key != "optimizer" else {prefix + key}
    return out


# --- accelerate -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(JOBS))
def test_accelerate_config_loads_in_accelerate(name: str, tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    job = make_job(name)
    write_recipe(job, "accelerate", tmp_path)
    config = load_config_from_file(str(tmp_path / "accelerate_config.yaml"))
    expected = {"single": "NO", "ddp": "MULTI_GPU", "zero1": "DEEPSPEED", "zero2": "DEEPSPEED", "zero3": "DEEPSPEED"}
    assert config.distributed_type.value == expected.get(job.strategy, "FSDP")
    assert (config.num_processes, config.num_machines) == (job.num_gpus, job.num_nodes)
    if job.strategy.startswith("zero"):  # precision is the DeepSpeed JSON's; accelerate refuses a second one
        assert config.mixed_precision is None
        assert config.deepspeed_config["deepspeed_config_file"] == "ds_config.json"
        assert (tmp_path / "ds_config.json").exists()
    else:
        assert config.mixed_precision == {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[job.dtype]
    if config.distributed_type.value == "FSDP":
        fsdp = config.fsdp_config
        assert fsdp["fsdp_version"] == (1 if job.strategy == "fsdp1" else 2)
        assert fsdp["fsdp_offload_params"] == (job.offload == "params")
        assert fsdp["fsdp_activation_checkpointing"] == job.gradient_checkpointing
    written = dotted(yaml.safe_load((tmp_path / "accelerate_config.yaml").read_text()))
    assert written <= known_keys("accelerate")
    read = read_config(tmp_path / "accelerate_config.yaml").options  # tunecost's reader gets the layout back
    in_file = job.strategy != "single" and not job.strategy.startswith("zero")  # ZeRO: the stage is ds_config's
    assert read.get("strategy") == (job.strategy if in_file else None)
    assert read["num_gpus"] == job.num_gpus and read.get("gpus_per_node", job.gpus_on_node) == job.gpus_on_node


@pytest.mark.parametrize("name", [n for n in sorted(JOBS) if JOBS[n].get("num_gpus", 1) > 1])
def test_accelerate_launch_prepares_the_planned_layout(name: str, tmp_path: Path, monkeypatch) -> None:
    """launch.sh's own words through `accelerate launch`'s parser and checks, the environment it gives the ranks,
    and the FSDP / DeepSpeed plugin each rank builds from that environment."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    job = make_job(name)
    write_recipe(job, "accelerate", tmp_path)
    words = launch_words(tmp_path / "launch.sh")
    assert words[:2] == ["accelerate", "launch"] and words[-2:] == ["train.py", "train_args.json"]
    monkeypatch.chdir(tmp_path)
    args, defaults, mixed_precision_from_config = _validate_launch_command(
        launch_command_parser().parse_args(words[2:])
    )
    assert (args.num_processes, args.num_machines) == (job.num_gpus, job.num_nodes)
    if job.strategy.startswith("zero"):
        fields = [*defaults.deepspeed_config, *(["mixed_precision"] if mixed_precision_from_config else [])]
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if args.use_fsdp:
        from accelerate.utils import FullyShardedDataParallelPlugin

        if job.strategy == "fsdp1":  # FSDP1's broadcast from rank 0 needs a CUDA device to build: checked, then off
            assert env["FSDP_SYNC_MODULE_STATES"] == env["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true"
            monkeypatch.setenv("FSDP_SYNC_MODULE_STATES", "false")
            monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")
        plugin = FullyShardedDataParallelPlugin()
        assert plugin.fsdp_version == (1 if job.strategy == "fsdp1" else 2)
        if job.strategy == "fsdp1":
            assert plugin.sharding_strategy.name == "FULL_SHARD"
        else:
            assert plugin.reshard_after_forward == (job.strategy != "fsdp2-shard-grad-op")
        offload = plugin.cpu_offload  # FSDP1: CPUOffload(offload_params); FSDP2: CPUOffloadPolicy or a no-op policy
        offloads = offload.offload_params if job.strategy == "fsdp1" else type(offload).__name__ == "CPUOffloadPolicy"
        assert offloads == (job.offload == "params")
        assert plugin.activation_checkpointing == job.gradient_checkpointing
    if job.strategy == "hsdp":
        from accelerate.parallelism_config import ParallelismConfig

        parallel = ParallelismConfig()
        assert (parallel.dp_replicate_size, parallel.dp_shard_size) == (job.num_nodes, job.gpus_on_node)
    if args.use_deepspeed:
        pytest.importorskip("deepspeed")
        from accelerate.utils import DeepSpeedPlugin

        plugin = DeepSpeedPlugin()  # runs accelerate's check that the JSON alone sets precision and ZeRO
        assert plugin.zero_stage == common.ZERO_STAGES[job.strategy]


@pytest.mark.parametrize("name", sorted(JOBS))
def test_train_args_build_the_hf_objects(name: str, tmp_path: Path) -> None:
    from peft import LoraConfig
    from transformers import BitsAndBytesConfig, HfArgumentParser, TrainingArguments

    job = make_job(name)
    write_recipe(job, "accelerate", tmp_path)
    args = json.loads((tmp_path / "train_args.json").read_text())
    # use_cpu: TrainingArguments refuses bf16 on a machine without a GPU
    (training,) = HfArgumentParser(TrainingArguments).parse_dict(args["training_args"] | {"use_cpu": True})
    assert (
        training.per_device_train_batch_size * training.gradient_accumulation_steps == job.micro_batch * job.grad_accum
    )
    assert (training.bf16, training.fp16) == (job.dtype == "bf16", job.dtype == "fp16")
    assert training.optim.value == common.HF_OPTIM[job.optimizer]
    fsdp_checkpoints = job.strategy in common.FSDP_STRATEGIES and job.gradient_checkpointing
    assert training.gradient_checkpointing == (job.gradient_checkpointing and not fsdp_checkpoints)
    assert args["model"]["attn_implementation"] in ("flash_attention_2", "sdpa", "eager")
    assert ("lora_config" in args) == (job.method != "full") and ("quantization_config" in args) == (
        job.method == "qlora"
    )
    if job.method != "full":
        lora = LoraConfig(**args["lora_config"])
        assert (lora.r, lora.lora_alpha) == (job.rank, job.alpha)
        if "experts" in job.targets:
            assert "mlp.experts.gate_up_proj" in lora.target_parameters
    if job.method == "qlora":
        bnb = BitsAndBytesConfig(**args["quantization_config"])
        if job.quant_type == "int8":
            assert bnb.load_in_8bit and not bnb.load_in_4bit and bnb.llm_int8_threshold == 6.0
            return
        assert bnb.load_in_4bit and bnb.bnb_4bit_quant_type == job.quant_type
        sharded = job.strategy in common.FSDP_STRATEGIES or job.strategy == "zero3"
        assert ("bnb_4bit_quant_storage" in args["quantization_config"]) == sharded


def test_launch_sh_says_train_py_is_the_users_and_is_executable(tmp_path: Path) -> None:
    write_recipe(make_job("single-qlora"), "accelerate", tmp_path)
    script = tmp_path / "launch.sh"
    assert os.access(script, os.X_OK)
    assert "train.py is your own training script" in script.read_text()
    assert launch_words(script) == [
        "accelerate", "launch", "--config_file", "accelerate_config.yaml", "train.py", "train_args.json"
    ]  # fmt: skip


# --- DeepSpeed ----------------------------------------------------------------------------------------------------

ZERO_JOBS = [n for n in sorted(JOBS) if JOBS[n].get("strategy", "").startswith("zero")]


@pytest.mark.parametrize("name", ZERO_JOBS)
def test_deepspeed_json_structure(name: str, tmp_path: Path) -> None:
    job = make_job(name)
    write_recipe(job, "accelerate", tmp_path)
    ds = json.loads((tmp_path / "ds_config.json").read_text())
    assert dotted(ds) <= known_keys("deepspeed")
    world = job.num_gpus
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * world
    assert ds["train_batch_size"] == job.micro_batch * job.grad_accum * job.num_gpus
    zero = ds["zero_optimization"]
    assert zero["stage"] == common.ZERO_STAGES[job.strategy]
    assert zero.get("offload_optimizer", {}).get("device") == ("cpu" if job.offload != "none" else None)
    assert zero.get("offload_param", {}).get("device") == ("cpu" if job.offload == "params" else None)
    assert (ds["bf16"]["enabled"], ds["fp16"]["enabled"]) == (job.dtype == "bf16", job.dtype == "fp16")
    assert ds["gradient_clipping"] == json.loads((tmp_path / "train_args.json").read_text())["training_args"][
        "max_grad_norm"]  # fmt: skip


@pytest.mark.parametrize("name", ZERO_JOBS)
def test_deepspeed_config_class_loads_the_json(name: str, tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("deepspeed")
    import deepspeed.comm
    from deepspeed.runtime.config import DeepSpeedConfig

    job = make_job(name)
    write_recipe(job, "accelerate", tmp_path)
    monkeypatch.setattr(deepspeed.comm, "get_rank", lambda *a, **k: 0)  # as on rank 0 of the planned world
    monkeypatch.setattr(deepspeed.comm, "get_world_size", lambda *a, **k: job.num_gpus)
    config = DeepSpeedConfig(str(tmp_path / "ds_config.json"))  # asserts batch = micro x accum x world size
    assert (config.world_size, config.train_batch_size) == (job.num_gpus, job.global_batch)
    assert config.zero_optimization_stage == common.ZERO_STAGES[job.strategy]
    assert config.bfloat16_config.enabled == (job.dtype == "bf16")
    if job.offload != "none":
        assert config.zero_config.offload_optimizer.device == "cpu"


@pytest.mark.parametrize("name", ZERO_JOBS)
def test_deepspeed_json_agrees_with_the_trainer_args(name: str, tmp_path: Path) -> None:
    """The HF Trainer's DeepSpeed integration fills "auto" values and lists every concrete one that disagrees with
    TrainingArguments (batch sizes, clipping, precision): none may."""
    pytest.importorskip("deepspeed")
    from transformers import HfArgumentParser, TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    job = make_job(name)
    write_recipe(job, "accelerate", tmp_path)
    args = json.loads((tmp_path / "train_args.json").read_text())["training_args"]
    (training,) = HfArgumentParser(TrainingArguments).parse_dict(args | {"use_cpu": True})
    hf = HfTrainerDeepSpeedConfig(json.loads((tmp_path / "ds_config.json").read_text()))
    hf.trainer_config_process(SimpleNamespace(**vars(training), world_size=job.num_gpus))
    assert hf.mismatches == []


# --- torchtune ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "method", "distributed", "config"),
    [
        ("meta-llama/Llama-2-70b-hf", "qlora", True, "llama2/70B_qlora"),
        ("meta-llama/Llama-2-7b-chat-hf", "full", False, "llama2/7B_full_low_memory"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "full", False, "llama3_1/8B_full_single_device"),
        ("meta-llama/Llama-3.2-1B", "qlora", False, "llama3_2/1B_qlora_single_device"),
        ("google/gemma-2-9b", "lora", True, "gemma2/9B_lora"),
        ("Qwen/Qwen2.5-0.5B", "lora", False, "qwen2_5/0.5B_lora_single_device"),
        ("microsoft/Phi-3-mini-4k-instruct", "lora", True, "phi3/mini_lora"),
        ("Qwen/Qwen2.5-7B", "qlora", True, None),  # torchtune ships no QLoRA config for it
        ("mistralai/Mixtral-8x7B-v0.1", "lora", False, None),
    ],
)
def test_torchtune_config_names(model: str, method: str, distributed: bool, config: str | None) -> None:
    assert torchtune_config(model, method, distributed=distributed) == config


TORCHTUNE_JOBS = ["single-qlora", "fsdp2-qlora-2nodes", "shard-grad-op-full"]


@pytest.mark.parametrize("name", TORCHTUNE_JOBS)
def test_torchtune_command_and_overrides(name: str, tmp_path: Path) -> None:
    job = make_job(name)
    write_recipe(job, "torchtune", tmp_path)
    words = launch_words(tmp_path / "launch.sh")
    overrides = yaml.safe_load((tmp_path / "torchtune_overrides.yaml").read_text())
    recipe = words[words.index("--config") - 1]
    assert recipe == ("full" if job.method == "full" else "lora") + (
        "_finetune_single_device" if job.strategy == "single" else "_finetune_distributed"
    )
    assert ("--nproc_per_node" in words) == (job.num_gpus > 1) and ("--nnodes" in words) == (job.num_nodes > 1)
    cli = dict(w.split("=", 1) for w in words[words.index("--config") + 2 :] if not w.startswith("~"))
    assert cli["batch_size"] == str(overrides["batch_size"]) == str(job.micro_batch)
    assert cli["gradient_accumulation_steps"] == str(job.grad_accum) and cli["epochs"] == "1"
    assert cli["tokenizer.max_seq_len"] == str(job.seq_len) and overrides["tokenizer"]["max_seq_len"] == job.seq_len
    assert overrides["enable_activation_checkpointing"] == job.gradient_checkpointing and cli["dtype"] == job.dtype
    assert set(overrides) <= known_keys("torchtune")
    if job.method != "full":
        assert overrides["model"]["lora_rank"] == job.rank and cli["model.lora_alpha"] == str(job.alpha)
    if job.strategy == "fsdp2-shard-grad-op":
        assert overrides["fsdp_reshard_after_forward"] is False
    if job.optimizer == "adamw-8bit":
        assert overrides["optimizer"]["_component_"] == "bitsandbytes.optim.PagedAdamW8bit"


@pytest.mark.parametrize("name", TORCHTUNE_JOBS)
def test_torchtune_loads_the_config_with_the_overrides(name: str, tmp_path: Path) -> None:
    """`tune run`'s parser on launch.sh's words, then torchtune's own YAML + command-line merge on the named config."""
    pytest.importorskip("torchtune")
    from torchtune._cli.run import ROOT, Run
    from torchtune._recipe_registry import get_all_recipes
    from torchtune.config._parse import TuneRecipeArgumentParser
    from torchtune.config._utils import _merge_yaml_and_cli_args

    job = make_job(name)
    write_recipe(job, "torchtune", tmp_path)
    words = launch_words(tmp_path / "launch.sh")
    tune = argparse.ArgumentParser(prog="tune")
    Run.create(tune.add_subparsers())  # `tune run`'s parser: torchrun's arguments, the recipe, its arguments
    args = tune.parse_args(words[1:])
    config_name = args.recipe_args[args.recipe_args.index("--config") + 1]
    recipe = next(r for r in get_all_recipes() if r.name == args.recipe)
    config_file = next(c.file_path for c in recipe.configs if c.name == config_name)
    yaml_args, _ = TuneRecipeArgumentParser().parse_known_args(
        ["--config", str(ROOT / "recipes" / "configs" / config_file)]
    )
    cfg = _merge_yaml_and_cli_args(yaml_args, args.recipe_args[2:])
    assert (cfg.batch_size, cfg.gradient_accumulation_steps, cfg.epochs) == (job.micro_batch, job.grad_accum, 1)
    assert cfg.tokenizer.max_seq_len == job.seq_len and cfg.dtype == job.dtype
    if job.method != "full":
        assert (cfg.model.lora_rank, cfg.model.lora_alpha) == (job.rank, job.alpha)
        assert list(cfg.model.lora_attn_modules) == tt_recipe.TORCHTUNE_ATTENTION
    if job.optimizer == "adamw-8bit":
        assert cfg.optimizer._component_ == "bitsandbytes.optim.PagedAdamW8bit" and "fused" not in cfg.optimizer
    if job.num_gpus > 1:
        assert args.nproc_per_node == str(job.gpus_on_node)
    if job.num_nodes > 1:
        assert args.nnodes == str(job.num_nodes)


def test_torchtune_config_table_matches_the_registry() -> None:
    """Every config in the table is one torchtune ships, and `fused` is in its optimizer exactly where we say."""
    pytest.importorskip("torchtune")
    from torchtune._cli.run import ROOT
    from torchtune._recipe_registry import get_all_recipes

    shipped = {c.name: c.file_path for r in get_all_recipes() if r.name.endswith(("single_device", "distributed"))
               for c in r.configs}  # fmt: skip
    assert not tt_recipe.TORCHTUNE_CONFIGS - set(shipped)
    for name in tt_recipe.TORCHTUNE_CONFIGS:
        optimizer = yaml.safe_load((ROOT / "recipes" / "configs" / shipped[name]).read_text())["optimizer"]
        assert ("fused" in optimizer) == tt_recipe._torchtune_fused(name), name


# --- LLaMA-Factory ------------------------------------------------------------------------------------------------

LLAMAFACTORY_JOBS = [
    "single-qlora",
    "ddp-lora",
    "ddp-lora-8bit",
    "fsdp1-lora-offload",
    "fsdp2-qlora-2nodes",
    "zero2-offload",
]


@pytest.mark.parametrize("name", LLAMAFACTORY_JOBS)
def test_llamafactory_yaml_keys_and_launch(name: str, tmp_path: Path) -> None:
    job = make_job(name)
    paths = {p.name for p in write_recipe(job, "llamafactory", tmp_path)}
    config = yaml.safe_load((tmp_path / "llamafactory.yaml").read_text())
    assert set(config) <= known_keys("llamafactory", "hf_training_args", "hf_seq2seq_args", "hf_training_args_older")
    assert (config["per_device_train_batch_size"], config["gradient_accumulation_steps"]) == (2, 4)
    assert config["cutoff_len"] == job.seq_len and config["disable_gradient_checkpointing"] is False
    assert ("quantization_bit" in config) == (job.method == "qlora")
    assert config.get("quantization_bit") in (None, 8 if job.quant_type == "int8" else 4)
    assert ("deepspeed" in config) == ("ds_config.json" in paths) == job.strategy.startswith("zero")
    words = launch_words(tmp_path / "launch.sh")
    if job.strategy.startswith("fsdp"):
        assert "accelerate_config.yaml" in paths and words[-3:] == ["-m", "llamafactory.launcher", "llamafactory.yaml"]
    else:  # llamafactory-cli runs torchrun itself for several GPUs; one GPU is made the only visible one
        env = (
            ["FORCE_TORCHRUN=1", f"NPROC_PER_NODE={job.gpus_on_node}"]
            if job.num_gpus > 1
            else ["CUDA_VISIBLE_DEVICES=0"]
        )
        assert set(env) <= set(words) and words[-3:] == ["llamafactory-cli", "train", "llamafactory.yaml"]


def test_a_llamafactory_recipe_starts_from_the_users_config(tmp_path: Path) -> None:
    """The user's own LLaMA-Factory YAML keeps every key the plan does not decide (data, template, schedule,
    output) and takes the plan's for the rest: a DeepSpeed file the single-GPU plan does not use is dropped, the
    planned batch replaces the user's, and the fused AdamW the plan priced is named."""
    mine = {"model_name_or_path": "x", "stage": "sft", "dataset": "identity,alpaca_en_demo", "template": "llama3",
            "max_samples": 1000, "learning_rate": 1e-4, "output_dir": "saves/mine", "deepspeed": "ds_z3.json",
            "per_device_train_batch_size": 1, "gradient_accumulation_steps": 8}  # fmt: skip
    job = make_job("single-qlora", base=mine, base_path="mine.yaml", fused_adamw=True)
    write_recipe(job, "llamafactory", tmp_path)
    text = (tmp_path / "llamafactory.yaml").read_text()
    config = yaml.safe_load(text)
    kept = ("dataset", "template", "max_samples", "learning_rate", "output_dir")
    assert {k: config[k] for k in kept} == {k: mine[k] for k in kept}
    assert "deepspeed" not in config and config["model_name_or_path"] == job.model
    assert (config["per_device_train_batch_size"], config["gradient_accumulation_steps"]) == (2, 4)
    assert config["optim"] == "adamw_torch_fused" and "# from mine.yaml: its keys, the plan's in place of" in text


@pytest.mark.parametrize("name", LLAMAFACTORY_JOBS)
def test_llamafactory_parser_reads_the_yaml(name: str, tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("llamafactory")
    monkeypatch.setenv("DISABLE_VERSION_CHECK", "1")  # the arguments are checked here, not the installed versions
    from llamafactory.hparams import get_train_args

    job = make_job(name)
    write_recipe(job, "llamafactory", tmp_path)
    config = yaml.safe_load((tmp_path / "llamafactory.yaml").read_text())
    config.pop("deepspeed", None)  # LLaMA-Factory runs DeepSpeed only under torchrun (checked by the JSON tests)
    model_args, data_args, training_args, finetuning_args, _ = get_train_args(config | {"use_cpu": True})
    assert (training_args.per_device_train_batch_size, data_args.cutoff_len) == (job.micro_batch, job.seq_len)
    assert finetuning_args.finetuning_type == ("full" if job.method == "full" else "lora")
    bits = 8 if job.quant_type == "int8" else 4
    assert model_args.quantization_bit == (bits if job.method == "qlora" else None)


# --- SkyPilot -----------------------------------------------------------------------------------------------------


def test_skypilot_task_structure(tmp_path: Path) -> None:
    job = make_job("fsdp2-qlora-2nodes")
    paths = {p.name for p in write_recipe(job, "skypilot", tmp_path)}
    assert {"sky.yaml", "accelerate_config.yaml", "train_args.json", "launch.sh"} <= paths
    text = (tmp_path / "sky.yaml").read_text()
    task = yaml.safe_load(text)
    assert task["resources"]["accelerators"] == "H100:8" and task["num_nodes"] == 2
    assert task["resources"]["any_of"] == [{"infra": "aws/us-east-1"}, {"infra": "runpod"}]
    assert "left out (no SkyPilot cloud): modal" in text
    assert task["workdir"] == "." and task["run"].rstrip().endswith("bash launch.sh")
    for var in ("SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_GPUS_PER_NODE"):
        assert var in task["run"]
    assert "peft" in task["setup"] and "bitsandbytes" in task["setup"]


@pytest.mark.parametrize("name", ["single-qlora", "fsdp2-qlora-2nodes", "zero2-offload"])
def test_skypilot_task_from_yaml(name: str, tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("sky")
    import sky

    monkeypatch.setenv("HOME", str(tmp_path))  # SkyPilot keeps its state under ~/.sky
    job = make_job(name)
    write_recipe(job, "skypilot", tmp_path / "recipe")
    task = sky.Task.from_yaml(str(tmp_path / "recipe" / "sky.yaml"))
    expected = {skypilot.SKYPILOT_GPUS[resolve_gpu_name(job.gpu).gpu.name]: job.gpus_on_node}
    assert task.num_nodes == job.num_nodes
    assert all(r.accelerators == expected for r in task.resources)
    clouds = {str(r.cloud).lower() for r in task.resources if r.cloud is not None}
    assert clouds == {recipes.skypilot_cloud(p) for p, _ in job.clouds} - {None}


def test_skypilot_names_are_catalog_gpus_and_clouds() -> None:
    for name in skypilot.SKYPILOT_GPUS:
        assert resolve_gpu_name(name).gpu.name == name
    assert recipes.skypilot_cloud("runpod-community") == "runpod" and recipes.skypilot_cloud("DigitalOcean") == "do"
    assert recipes.skypilot_cloud("spheron") is None and recipes.skypilot_cloud("paper-2024") is None


# --- writing, errors ----------------------------------------------------------------------------------------------


def test_no_overwrite_without_force_and_force_replaces(tmp_path: Path) -> None:
    job = make_job("zero2-offload")
    paths = write_recipe(job, "accelerate", tmp_path)
    (tmp_path / "train_args.json").unlink()
    (tmp_path / "launch.sh").write_text("mine\n")
    with pytest.raises(TunecostError, match=r"launch\.sh.*--force"):
        write_recipe(job, "accelerate", tmp_path)
    assert not (tmp_path / "train_args.json").exists()  # checked before anything is written
    assert (tmp_path / "launch.sh").read_text() == "mine\n"
    assert write_recipe(job, "accelerate", tmp_path, force=True) == paths
    assert (tmp_path / "launch.sh").read_text().startswith("#!/usr/bin/env bash")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)  # no temporary files left


@pytest.mark.parametrize(
    ("target", "changes", "match"),
    [
        ("helm", {}, r"unknown recipe target 'helm'.*accelerate, torchtune"),
        ("torchtune", {"strategy": "zero3"}, r"torchtune recipe: .*FSDP2 only.*zero3"),
        ("torchtune", {"strategy": "hsdp"}, r"torchtune recipe: .*hsdp"),
        ("torchtune", {"dtype": "fp16"}, r"torchtune recipe: .*fp16"),
        ("torchtune", {"quant_type": "fp4"}, r"torchtune recipe: .*NF4"),
        ("torchtune", {"epochs": 1.5}, r"torchtune recipe: .*whole epochs"),
        ("torchtune", {"lora_targets": ("experts",)}, r"torchtune recipe: .*experts"),
        ("llamafactory", {"lora_targets": ("attention", "router")}, r"llamafactory recipe: .*routers"),
        ("llamafactory", {"lora_alpha": 7.5}, r"llamafactory recipe: .*integer"),
        ("torchtune", {"packing": "cross-document"}, r"torchtune recipe: .*no cross-document packing"),
        ("skypilot", {"gpu": "H800-80GB-SXM"}, r"skypilot recipe: .*H800-80GB-SXM"),
    ],
)
def test_unknown_target_or_inexpressible_setup_is_one_error(target: str, changes: dict, match: str, tmp_path: Path):
    with pytest.raises(TunecostError, match=match):
        write_recipe(make_job("single-qlora", **changes), target, tmp_path)
    assert not any(tmp_path.iterdir())


def test_offload_with_8bit_adamw_cannot_go_to_deepspeed(tmp_path: Path) -> None:
    for optimizer in ("adamw-8bit", "adamw-4bit"):
        with pytest.raises(TunecostError, match=r"accelerate recipe: .*the low-bit AdamWs run on the GPU"):
            write_recipe(make_job("zero2-offload", optimizer=optimizer), "accelerate", tmp_path)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"strategy": "fsdp9"}, "unknown strategy"),
        ({"strategy": "single", "num_gpus": 2}, "multi-GPU strategy"),
        ({"strategy": "ddp", "num_gpus": 12}, "whole nodes"),
        ({"strategy": "ddp", "num_gpus": 2, "offload": "params"}, "offload 'params'"),
        ({"micro_batch": 0}, "micro-batch"),
        ({"lora_rank": 0}, "LoRA rank"),
        ({"method": "dora"}, "unsupported method"),
    ],
)
def test_launch_job_validates_itself(changes: dict, match: str) -> None:
    with pytest.raises(TunecostError, match=match):
        make_job("single-qlora", **changes)


def test_every_target_renders_every_job_it_can(tmp_path: Path) -> None:
    """Each target either writes its files or refuses with one TunecostError, for every job here."""
    for name in JOBS:
        for target in TARGETS:
            try:
                paths = write_recipe(make_job(name), target, tmp_path / name / target)
            except TunecostError as exc:
                assert str(exc).startswith(f"{target} recipe: cannot express"), exc
            else:
                assert all(p.stat().st_size > 0 for p in paths)


def test_recipes_do_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, tunecost.estimate.recipes; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize("packing", ["per-document", "cross-document"])
def test_packing_reaches_every_recipe(packing: str, tmp_path: Path) -> None:
    """LLaMA-Factory's neat_packing / packing, TRL's packing_strategy bfd / wrapped, torchtune's dataset.packed."""
    job = make_job("ddp-lora", packing=packing)
    write_recipe(job, "llamafactory", tmp_path / "lf")
    config = yaml.safe_load((tmp_path / "lf" / "llamafactory.yaml").read_text())
    assert config.get("neat_packing" if packing == "per-document" else "packing") is True
    assert set(config) <= known_keys("llamafactory", "hf_training_args", "hf_seq2seq_args", "hf_training_args_older")
    write_recipe(job, "accelerate", tmp_path / "acc")
    args = json.loads((tmp_path / "acc" / "train_args.json").read_text())
    assert args["packing"] == {"packing": True, "packing_strategy": "bfd" if packing == "per-document" else "wrapped"}
    if packing == "per-document":
        write_recipe(dataclasses.replace(job, strategy="fsdp2"), "torchtune", tmp_path / "tt")
        assert "dataset.packed=True" in launch_words(tmp_path / "tt" / "launch.sh")


def test_torch_compile_reaches_every_recipe(tmp_path: Path) -> None:
    """LLaMA-Factory's and the HF Trainer's torch_compile, torchtune's compile; the readers take each back."""
    job = make_job("ddp-lora", torch_compile=True)
    write_recipe(job, "llamafactory", tmp_path / "lf")
    assert yaml.safe_load((tmp_path / "lf" / "llamafactory.yaml").read_text())["torch_compile"] is True
    write_recipe(job, "accelerate", tmp_path / "acc")
    assert json.loads((tmp_path / "acc" / "train_args.json").read_text())["training_args"]["torch_compile"] is True
    write_recipe(dataclasses.replace(job, strategy="fsdp2"), "torchtune", tmp_path / "tt")
    assert "compile=True" in launch_words(tmp_path / "tt" / "launch.sh")
    write_recipe(make_job("ddp-lora"), "llamafactory", tmp_path / "eager")
    assert "torch_compile" not in yaml.safe_load((tmp_path / "eager" / "llamafactory.yaml").read_text())


def test_liger_kernel_reaches_the_hf_recipes(tmp_path: Path) -> None:
    """LLaMA-Factory's enable_liger_kernel and the HF Trainer's use_liger_kernel; the readers take each back."""
    job = make_job("ddp-lora", liger_kernel=True)
    write_recipe(job, "llamafactory", tmp_path / "lf")
    assert yaml.safe_load((tmp_path / "lf" / "llamafactory.yaml").read_text())["enable_liger_kernel"] is True
    write_recipe(job, "accelerate", tmp_path / "acc")
    args = json.loads((tmp_path / "acc" / "train_args.json").read_text())["training_args"]
    assert args["use_liger_kernel"] is True
    write_recipe(make_job("ddp-lora"), "llamafactory", tmp_path / "eager")
    assert "enable_liger_kernel" not in yaml.safe_load((tmp_path / "eager" / "llamafactory.yaml").read_text())


def test_liger_kernel_has_no_torchtune_recipe(tmp_path: Path) -> None:
    with pytest.raises(TunecostError, match="torchtune has no Liger kernels"):
        write_recipe(
            dataclasses.replace(make_job("ddp-lora", liger_kernel=True), strategy="fsdp2"), "torchtune", tmp_path
        )
    assert not list(tmp_path.iterdir())


def test_single_projections_reach_every_recipe(tmp_path: Path) -> None:
    """PEFT's target_modules, LLaMA-Factory's lora_target and torchtune's lora_attn_modules name the projections."""
    job = make_job("ddp-lora", lora_targets=("q_proj", "v_proj"))
    write_recipe(job, "accelerate", tmp_path / "acc")
    lora = json.loads((tmp_path / "acc" / "train_args.json").read_text())["lora_config"]
    assert lora["target_modules"] == ["q_proj", "v_proj"] and "target_parameters" not in lora
    write_recipe(job, "llamafactory", tmp_path / "lf")
    assert yaml.safe_load((tmp_path / "lf" / "llamafactory.yaml").read_text())["lora_target"] == "q_proj,v_proj"
    write_recipe(
        dataclasses.replace(job, strategy="fsdp2", lora_targets=("o_proj", "mlp")), "torchtune", tmp_path / "tt"
    )
    words = launch_words(tmp_path / "tt" / "launch.sh")
    assert "model.lora_attn_modules=[output_proj]" in words and "model.apply_lora_to_mlp=True" in words
    with pytest.raises(TunecostError, match="torchtune recipe: .*the MLP whole"):
        write_recipe(dataclasses.replace(job, strategy="fsdp2", lora_targets=("down_proj",)), "torchtune", tmp_path)


@pytest.mark.parametrize(("fp8", "backend"), [("rowwise", "torchao"), ("te-delayed", "te")])
def test_fp8_reaches_the_llamafactory_recipe_and_reads_back(fp8: str, backend: str, tmp_path: Path) -> None:
    """LLaMA-Factory's fp8 / fp8_backend (train/fp8_utils.py: torchao rowwise, or Transformer Engine); its reader
    takes the same recipe back."""
    from tunecost.workload.frameworks.registry import read_config

    write_recipe(make_job("ddp-lora", fp8=fp8), "llamafactory", tmp_path)
    written = yaml.safe_load((tmp_path / "llamafactory.yaml").read_text())
    assert (written["fp8"], written["fp8_backend"]) == (True, backend)
    assert read_config(tmp_path / "llamafactory.yaml").options["fp8"] == fp8


@pytest.mark.parametrize(
    ("target", "fp8"), [("accelerate", "tensorwise"), ("torchtune", "rowwise"), ("llamafactory", "tensorwise")]
)
def test_fp8_a_recipe_cannot_launch_is_one_error(target: str, fp8: str, tmp_path: Path) -> None:
    """The HF Trainer sets its mixed precision from bf16 before accelerate's fp8; torchtune's recipes have no FP8;
    LLaMA-Factory's torchao recipe is rowwise."""
    with pytest.raises(TunecostError, match=f"{target} recipe: cannot express this setup: FP8"):
        write_recipe(make_job("ddp-lora", fp8=fp8), target, tmp_path)
    assert not list(tmp_path.iterdir())


def test_the_lora_dropout_reaches_every_recipe_and_reads_back(tmp_path: Path) -> None:
    """The dropout the plan priced (its mask and dropped copy of each adapter's input) is the one each recipe runs:
    PEFT's lora_dropout, LLaMA-Factory's lora_dropout (read back by its reader), torchtune's model.lora_dropout."""
    from peft import LoraConfig

    from tunecost.workload.frameworks.registry import read_config

    job = make_job("ddp-lora", lora_dropout=0.05)
    write_recipe(job, "accelerate", tmp_path / "acc")
    args = json.loads((tmp_path / "acc" / "train_args.json").read_text())
    assert LoraConfig(**args["lora_config"]).lora_dropout == 0.05
    write_recipe(job, "llamafactory", tmp_path / "lf")
    assert read_config(tmp_path / "lf" / "llamafactory.yaml").options["lora_dropout"] == 0.05
    write_recipe(dataclasses.replace(job, strategy="fsdp2"), "torchtune", tmp_path / "tt")
    assert "model.lora_dropout=0.05" in launch_words(tmp_path / "tt" / "launch.sh")


def test_a_full_fine_tunes_parameter_precision_reaches_the_hf_recipes_and_reads_back(tmp_path: Path) -> None:
    """LLaMA-Factory upcasts a full fine-tune's parameters off DeepSpeed (FSDP included): bf16 parameters as priced need
    pure_bf16 (bf16 off), fp32 ones (`fp32_params`) its default; the Trainer recipe loads those in float32. Each
    reader takes its recipe back."""
    job = dataclasses.replace(make_job("ddp-lora"), method="full", lora_targets=())
    for fp32, lf_keys, load in ((False, (False, True), "bfloat16"), (True, (True, None), "float32")):
        planned = dataclasses.replace(job, fp32_params=fp32)
        write_recipe(planned, "llamafactory", tmp_path / f"lf-{fp32}")
        written = yaml.safe_load((tmp_path / f"lf-{fp32}" / "llamafactory.yaml").read_text())
        assert (written["bf16"], written.get("pure_bf16")) == lf_keys
        assert read_config(tmp_path / f"lf-{fp32}" / "llamafactory.yaml").options.get("fp32_params", False) is fp32
        write_recipe(planned, "accelerate", tmp_path / f"acc-{fp32}")
        assert json.loads((tmp_path / f"acc-{fp32}" / "train_args.json").read_text())["model"]["dtype"] == load
    for fp32, lf_keys in ((False, (False, True)), (True, (True, None))):  # FSDP's mixed precision: upcast too
        planned, out = dataclasses.replace(job, strategy="fsdp2", fp32_params=fp32), tmp_path / f"fsdp-{fp32}"
        write_recipe(planned, "llamafactory", out)
        written = yaml.safe_load((out / "llamafactory.yaml").read_text())
        assert (written["bf16"], written.get("pure_bf16")) == lf_keys
        both = read_configs([out / "llamafactory.yaml", out / "accelerate_config.yaml"]).options
        assert (both["strategy"], both.get("fp32_params", False)) == ("fsdp2", fp32)
    zero2 = dataclasses.replace(job, strategy="zero2")
    write_recipe(zero2, "llamafactory", tmp_path / "z2")
    assert "pure_bf16" not in yaml.safe_load((tmp_path / "z2" / "llamafactory.yaml").read_text())
    with pytest.raises(TunecostError, match="llamafactory recipe: .*fp16 parameters of a full fine-tune"):
        write_recipe(dataclasses.replace(job, dtype="fp16"), "llamafactory", tmp_path / "fp16")


def test_lora_over_fp32_weights_goes_to_the_trainer_recipe_only(tmp_path: Path) -> None:
    """TRL loads the model in float32 as planned; LLaMA-Factory loads it in the compute dtype and torchtune builds
    it in one dtype, so neither can run fp32 frozen weights under autocast."""
    job = make_job("ddp-lora", fp32_params=True)
    write_recipe(job, "accelerate", tmp_path / "acc")
    assert json.loads((tmp_path / "acc" / "train_args.json").read_text())["model"]["dtype"] == "float32"
    for target in ("llamafactory", "torchtune"):
        with pytest.raises(TunecostError, match=f"{target} recipe: .*fp32 frozen weights under autocast"):
            write_recipe(dataclasses.replace(job, strategy="fsdp2") if target == "torchtune" else job, target, tmp_path)
