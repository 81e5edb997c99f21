"""litgpt finetune YAML read as a tunecost job (configs written as config_hub/finetune/*/lora|qlora|full.yaml show
them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunecost.errors import TunecostError
from tunecost.workload.frameworks import ConfigFile, ConfigJob, parse_config_file
from tunecost.workload.frameworks.litgpt import FRAMEWORK

LORA = """\
checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B
out_dir: out/finetune/lora-llama-3.2-1B
precision: bf16-true
devices: 1
num_nodes: 1
lora_r: 32
lora_alpha: 16
lora_dropout: 0.05
lora_query: true
lora_key: false
lora_value: true
lora_projection: false
lora_mlp: false
lora_head: false
data:
  class_path: litgpt.data.Alpaca2k
  init_args:
    mask_prompt: false
    prompt_style: alpaca
train:
  save_interval: 200
  global_batch_size: 8
  micro_batch_size: 2
  lr_warmup_steps: 10
  epochs: 2
  max_tokens:
  max_seq_length: 512
logger_name: csv
seed: 1337
optimizer:
  class_path: torch.optim.AdamW
  init_args:
    lr: 0.0002
    weight_decay: 0.0
"""

QLORA = """\
checkpoint_dir: checkpoints/mistralai/Mistral-7B-v0.1
out_dir: out/finetune/qlora-mistral-7b
precision: bf16-true
quantize: bnb.nf4-dq
lora_r: 16
lora_mlp: true
data:
  class_path: litgpt.data.JSON
  init_args:
    json_path: data/my_data.json
    val_split_fraction: 0.1
train:
  micro_batch_size: 4
  max_seq_length: 1024
"""

FULL = """\
checkpoint_dir: checkpoints/meta-llama/Meta-Llama-3.1-8B
out_dir: out/finetune/full-llama-3.1-8b
precision: bf16-mixed
devices: 4
num_nodes: 2
resume: false
train:
  global_batch_size: 64
  micro_batch_size: 4
  epochs: 1
  max_seq_length: 512
optimizer: AdamW
"""


def _read(tmp_path: Path, text: str) -> ConfigJob:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    data = parse_config_file(path)
    assert FRAMEWORK.detect(data)
    return FRAMEWORK.read(ConfigFile(path=str(path), data=data))


def _named(job: ConfigJob, *starts: str) -> None:
    """Each filled default is among the assumptions, named with the framework's title."""
    for start in starts:
        assert any(a.startswith(start) and "litgpt" in a for a in job.assumptions), (start, job.assumptions)


def test_lora(tmp_path: Path) -> None:
    job = _read(tmp_path, LORA)
    assert job.framework == "litgpt"
    assert job.options == {
        "stack": "tunecost",
        "model": "meta-llama/Llama-3.2-1B",
        "method": "lora",
        "lora_rank": 32,
        "lora_dropout": 0.05,
        "lora_alpha": 16,
        "lora_targets": "q_proj,v_proj",
        "dtype": "bf16",
        "num_gpus": 1,
        "gradient_checkpointing": False,
        "batch_size": 2,
        "epochs": 2,
        "seq_len": 512,
        "optimizer": "adamw",
        "attention": "sdpa",
        "queries_per_step": 8,
        "grad_accum": 4,  # global batch 8 / (micro-batch 2 x 1 rank): TrainArgs.gradient_accumulation_iters
    }
    _named(job, "litgpt's own model code", "method lora", "gradient_checkpointing off", "data Alpaca2k")
    assert any(a.startswith("grad_accum 4: train.global_batch_size 8 / (micro-batch 2") for a in job.assumptions)
    assert {"out_dir", "optimizer.init_args.lr"} <= set(job.not_modelled)
    assert job.options["lora_dropout"] == 0.05 and "lora_dropout" not in job.not_modelled
    assert "train.max_tokens" not in job.not_modelled  # null: sets nothing


def test_a_model_whose_transformers_attention_fuses_qkv_takes_lora_on_the_whole_attention(tmp_path: Path) -> None:
    """litgpt adapts parts of its own fused qkv for every model; where the transformers model tunecost simulates
    fuses q, k and v too (Falcon's query_key_value), q_proj/v_proj name nothing, so the attention is adapted whole."""
    job = _read(tmp_path, LORA.replace("meta-llama/Llama-3.2-1B", "tiiuae/falcon-7b"))
    assert job.options["lora_targets"] == "attention"
    _named(job, "lora_query/key/value: falcon-7b's transformers attention fuses q, k and v")
    assert _read(tmp_path, LORA).options["lora_targets"] == "q_proj,v_proj"


def test_qlora_defaults(tmp_path: Path) -> None:
    job = _read(tmp_path, QLORA)
    o = job.options
    assert (o["model"], o["method"], o["quant_type"], o["double_quant"]) == (
        "mistralai/Mistral-7B-v0.1",
        "qlora",
        "nf4",
        True,
    )
    assert (o["lora_rank"], o["lora_alpha"], o["lora_targets"]) == (16, 16, "mlp,q_proj,v_proj")
    assert (o["batch_size"], o["epochs"], o["seq_len"], o["dataset"]) == (4, 5, 1024, "data/my_data.json")
    assert (o["num_gpus"], o["optimizer"]) == (1, "adamw")
    _named(job, "lora_alpha 16", "lora_query true, lora_key false", "epochs 5", "devices 1", "num_nodes 1")
    _named(job, "optimizer adamw: litgpt runs bitsandbytes' PagedAdamW")


def test_full_multi_node(tmp_path: Path) -> None:
    job = _read(tmp_path, FULL)
    o = job.options
    assert (o["model"], o["method"], o["dtype"]) == ("meta-llama/Meta-Llama-3.1-8B", "full", "bf16")
    assert (o["strategy"], o["num_gpus"], o["gpus_per_node"], o["gradient_checkpointing"]) == ("fsdp1", 8, 4, True)
    assert "lora_rank" not in o
    _named(job, "method full", "precision bf16-mixed", "strategy fsdp1", "data Alpaca")
    assert "resume" in job.not_modelled and "fp32_params" not in o  # FSDP shards the fp32 weights


def test_a_full_fine_tune_on_one_device_is_torch_amp_over_fp32_weights(tmp_path: Path) -> None:
    """Fabric's bf16-mixed on one device: fp32 weights, gradients and AdamW states under bf16 autocast."""
    job = _read(tmp_path, FULL.replace("devices: 4", "devices: 1").replace("num_nodes: 2", "num_nodes: 1"))
    assert job.options["fp32_params"] is True and job.options["num_gpus"] == 1
    _named(job, "fp32_params: precision bf16-mixed: litgpt keeps fp32 weights")
    lora = _read(tmp_path, LORA.replace("precision: bf16-true", "precision: bf16-mixed"))
    assert lora.options["fp32_params"] is True and lora.options["method"] == "lora"  # its frozen weights too


def test_default_precision(tmp_path: Path) -> None:
    job = _read(tmp_path, LORA.replace("precision: bf16-true\n", ""))
    assert job.options["dtype"] == "bf16"
    _named(job, "dtype bf16: litgpt's default precision bf16-mixed")


@pytest.mark.parametrize(
    ("text", "old", "new", "key"),
    [
        (LORA, "lora_r: 32", "lora_r: eight", "lora_r"),
        (LORA, "precision: bf16-true", "precision: 64-true", "precision"),
        (QLORA, "bnb.nf4-dq", "bnb.int8-training", "quantize"),
        (QLORA, "precision: bf16-true", "precision: bf16-mixed", "precision"),
        (QLORA, "precision: bf16-true\n", "devices: 2\nprecision: bf16-true\n", "quantize"),
        (FULL, "optimizer: AdamW", "optimizer: Adagrad", "optimizer"),
        (
            LORA,
            "lora_query: true\nlora_key: false\nlora_value: true",
            "lora_query: false\nlora_value: false",
            "lora_query",
        ),  # no target
        (LORA, "checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B", "checkpoint_dir: ''", "checkpoint_dir"),
    ],
)
def test_errors_name_file_and_key(tmp_path: Path, text: str, old: str, new: str, key: str) -> None:
    assert old in text
    with pytest.raises(TunecostError) as err:
        _read(tmp_path, text.replace(old, new))
    assert str(tmp_path / "config.yaml") in str(err.value) and f": {key}: " in str(err.value)


def test_pretrain_config_is_refused(tmp_path: Path) -> None:
    text = "model_name: tiny-llama-1.1b\nout_dir: out/pretrain\ninitial_checkpoint_dir:\ndata: TinyLlama\n"
    text += "tokenizer_dir: checkpoints/meta-llama/Llama-2-7b-hf\ntrain:\n  micro_batch_size: 4\n"
    with pytest.raises(TunecostError, match="model_name: .*supervised fine-tuning"):
        _read(tmp_path, text)


def test_detect_is_false_for_other_frameworks() -> None:
    others = [
        {"model_name_or_path": "meta-llama/Llama-3.1-8B", "stage": "sft", "output_dir": "saves"},  # LLaMA-Factory
        {"base_model": "NousResearch/Llama-3.2-1B", "adapter": "lora", "output_dir": "./out"},  # axolotl
        {"model": {"_component_": "torchtune.models.llama3_1.lora_llama3_1_8b"}, "batch_size": 2},  # torchtune
        {"model": {"name": "llama3", "flavor": "8B"}, "training": {"local_batch_size": 1}},  # torchtitan
        {"output_dir": "out", "per_device_train_batch_size": 4, "bf16": True},  # HF TrainingArguments
    ]
    assert not any(FRAMEWORK.detect(d) for d in others)
