"""`--config FILE`: a framework's own config answers as the same job given as flags (byte-identical --json), the
flags override it, and its defaults are named on stderr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunecost.workload.frameworks.registry import read_configs

# one small job per format, as each framework writes it (Qwen2.5-0.5B / Qwen3-0.6B: seconds to simulate)
CONFIGS: dict[str, dict[str, str]] = {
    "llamafactory": {
        "train.yaml": """
model_name_or_path: Qwen/Qwen2.5-0.5B
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all
cutoff_len: 1024
per_device_train_batch_size: 2
gradient_accumulation_steps: 4
num_train_epochs: 1.0
learning_rate: 1.0e-4
bf16: true
output_dir: saves/qwen/lora/sft
""",
    },
    "axolotl": {
        "lora.yml": """
base_model: Qwen/Qwen2.5-0.5B
adapter: lora
lora_r: 16
lora_alpha: 32
lora_target_linear: true
sequence_len: 1024
micro_batch_size: 2
num_epochs: 1
bf16: true
gradient_checkpointing: true
optimizer: adamw_torch
learning_rate: 0.0002
output_dir: ./outputs/lora-out
""",
    },
    "torchtune": {
        "lora_single_device.yaml": """
model:
  _component_: torchtune.models.qwen2_5.lora_qwen2_5_0_5b
  lora_attn_modules: ['q_proj', 'k_proj', 'v_proj', 'output_proj']
  apply_lora_to_mlp: True
  lora_rank: 8
  lora_alpha: 16
tokenizer:
  _component_: torchtune.models.qwen2_5.qwen2_5_tokenizer
  max_seq_len: 1024
loss:
  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss
optimizer:
  _component_: torch.optim.AdamW
  fused: True
  lr: 2e-3
batch_size: 2
epochs: 1
dtype: bf16
enable_activation_checkpointing: True
""",
    },
    "hf": {
        "args.json": json.dumps(
            {
                "model_name_or_path": "Qwen/Qwen2.5-0.5B",
                "output_dir": "out",
                "per_device_train_batch_size": 2,
                "num_train_epochs": 1,
                "learning_rate": 2e-4,
                "bf16": True,
                "gradient_checkpointing": True,
                "optim": "adamw_torch",
            }
        ),
        "adapter_config.json": json.dumps(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "base_model_name_or_path": "Qwen/Qwen2.5-0.5B",
                "r": 8,
                "lora_alpha": 16,
                "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
            }
        ),
        "bnb.json": json.dumps(
            {
                "quant_method": "bitsandbytes",
                "load_in_4bit": True,
                "bnb_4bit_quant_type": "nf4",
                "bnb_4bit_use_double_quant": True,
                "bnb_4bit_compute_dtype": "bfloat16",
            }
        ),
    },
    "accelerate+deepspeed": {
        "args.json": json.dumps(
            {
                "model_name_or_path": "Qwen/Qwen2.5-0.5B",
                "output_dir": "out",
                "per_device_train_batch_size": 2,
                "num_train_epochs": 1,
                "bf16": True,
                "gradient_checkpointing": True,
            }
        ),
        "accelerate.yaml": """
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  zero_stage: 2
mixed_precision: bf16
num_machines: 1
num_processes: 2
""",
        "ds_config.json": json.dumps(
            {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}}
        ),
    },
    "litgpt": {
        "lora.yaml": """
checkpoint_dir: checkpoints/Qwen/Qwen2.5-0.5B
out_dir: out/finetune/lora
precision: bf16-true
devices: 1
lora_r: 8
lora_alpha: 16
lora_query: true
lora_value: true
train:
  micro_batch_size: 2
  epochs: 1
  max_seq_length: 1024
""",
    },
    "torchtitan": {
        "qwen3.toml": """
[job]
dump_folder = "./outputs"
[model]
name = "qwen3"
flavor = "0.6B"
[training]
local_batch_size = 2
seq_len = 1024
[parallelism]
data_parallel_shard_degree = 2
[activation_checkpoint]
mode = "full"
""",
    },
}
FLAG_NAMES = {"num_gpus": "--gpus"}
NEGATIVE = {"reentrant": "--non-reentrant"}
MEMORY = [
    "model",
    "method",
    "seq_len",
    "batch_size",
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
    "stack",
    "chunked_loss",
    "offload_activations",
    "optimizer_in_backward",
]
ESTIMATE = [*MEMORY, *["dataset", "epochs", "num_gpus", "gpus_per_node", "strategy", "offload"]]
MAX_BATCH = ["model", "method", "seq_len", "dataset", "gradient_checkpointing", "lora_rank", "lora_alpha"]


def _write(tmp_path: Path, files: dict[str, str]) -> list[str]:
    paths = []
    for name, text in files.items():
        (tmp_path / name).write_text(text.lstrip(), encoding="utf-8")
        paths.append(str(tmp_path / name))
    return paths


def _flags(options: dict, names: list[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        if name not in options:
            continue
        value, flag = options[name], FLAG_NAMES.get(name, "--" + name.replace("_", "-"))
        if isinstance(value, bool):
            out.append(flag if value else NEGATIVE.get(name, "--no-" + flag[2:]))
        else:
            out += [flag, str(value)]
    return out


def _json(cli_runner, args: list[str]) -> str:
    from tunecost.cli.main import app

    result = cli_runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("fmt", list(CONFIGS))
def test_a_config_answers_as_its_flags(cli_runner, tmp_path: Path, fmt: str) -> None:
    paths = _write(tmp_path, CONFIGS[fmt])
    options = read_configs(paths).options
    config = [arg for p in paths for arg in ("--config", p)]
    for command, names, extra in (
        ("memory", MEMORY, []),
        (
            "estimate",
            ESTIMATE,
            ["--gpu", "RTX-4090", "--queries", "1000", *(["--epochs", "1"] * ("epochs" not in options))],
        ),
        ("max-batch", MAX_BATCH, ["--gpu", "RTX-4090", "--device", "cpu"]),
    ):
        from_config = _json(cli_runner, [command, *config, *extra])
        from_flags = _json(cli_runner, [command, *_flags(options, names), *extra])
        assert from_config == from_flags, (fmt, command)


def test_flags_override_the_config_and_defaults_are_named(cli_runner, tmp_path: Path) -> None:
    from tunecost.cli.main import app

    (path,) = _write(tmp_path, CONFIGS["llamafactory"])
    result = cli_runner.invoke(app, ["memory", "--config", path, "--lora-rank", "32", "--json"])
    assert result.exit_code == 0, result.output
    flags = _json(cli_runner, ["memory", *_flags({**read_configs([path]).options, "lora_rank": 32}, MEMORY)])
    assert result.stdout == flags
    assert "assumed: lora_alpha 16: LLaMA-Factory's default" in result.stderr
    assert "not modelled" in result.stderr and "learning_rate" in result.stderr


@pytest.mark.parametrize(
    ("text", "suffix", "message"),
    [
        ("model_name_or_path: [unclosed", ".yaml", "not valid YAML"),
        ('{"per_device_train_batch_size": 2,', ".json", "not valid JSON"),
        ("[model\nname = 1", ".toml", "not valid TOML"),
        ("just: a mapping\nof: nothing known\n", ".yaml", "not a config tunecost reads"),
        ("model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nlora_rank: eight\n", ".yaml", "lora_rank"),
        ("model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: dpo\nfinetuning_type: lora\n", ".yaml", "stage"),
    ],
)
def test_a_bad_config_is_one_error_line(cli_error, tmp_path: Path, text: str, suffix: str, message: str) -> None:
    path = tmp_path / f"bad{suffix}"
    path.write_text(text, encoding="utf-8")
    line = cli_error(["memory", "--config", str(path)])
    assert str(path) in line and message in line
