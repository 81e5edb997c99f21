"""LLaMA-Factory v1 training YAML (USE_V1=1) read as a tunecost job, configs written as its examples/v1 folders show
them: plugin configs for LoRA, quantization and the distributed backend, its own trainer's defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunecost.errors import TunecostError
from tunecost.workload.frameworks.registry import read_config

LORA_FSDP2 = """\
model: Qwen/Qwen3-4B
model_class: llm

peft_config:
  name: lora
  r: 16
  lora_alpha: 32
  lora_dropout: 0.05
  target_modules: all

kernel_config:
  name: auto

dist_config:
  name: fsdp2
  dcp_path: null

train_dataset: data/v1_sft_demo.yaml

output_dir: ./outputs/test_lora
micro_batch_size: 1
cutoff_len: 2048
learning_rate: 1.0e-4
max_steps: 10
"""
BARE = "model: Qwen/Qwen3-0.6B\ntrain_dataset: data/v1_sft_demo.yaml\n"


def _read(tmp_path: Path, text: str):
    path = tmp_path / "train.yaml"
    path.write_text(text, encoding="utf-8")
    return read_config(path)


def test_a_lora_fsdp2_example_reads_as_its_plugins_say(tmp_path: Path) -> None:
    job = _read(tmp_path, LORA_FSDP2)
    assert job.framework == "llamafactory-v1"
    assert job.options == {
        "model": "Qwen/Qwen3-4B", "method": "lora", "lora_rank": 16, "lora_alpha": 32, "lora_dropout": 0.05,
        "lora_targets": "attention,mlp", "dtype": "bf16", "attention": "sdpa", "gradient_checkpointing": True,
        "reentrant": False, "optimizer": "adamw", "seq_len": 2048, "batch_size": 1, "max_steps": 10,
        "strategy": "fsdp2", "stack": "hf-peft",
    }  # fmt: skip
    assert set(job.not_modelled) == {"output_dir", "learning_rate"}
    assert any(a.startswith("global batch: LLaMA-Factory v1's default") for a in job.assumptions)


def test_the_trainers_defaults_are_named(tmp_path: Path) -> None:
    job = _read(tmp_path, BARE)
    assert job.options["method"] == "full"
    assert (job.options["batch_size"], job.options["seq_len"], job.options["epochs"]) == (1, 2048, 3)
    assert job.options["reentrant"] is False  # BaseTrainer: gradient_checkpointing_enable({"use_reentrant": False})
    said = " | ".join(job.assumptions)
    for default in ("batch_size 1", "seq_len 2048", "epochs 3", "attention sdpa", "optimizer adamw"):
        assert f"{default}" in said
    assert "strategy" not in job.options  # no dist_config: one GPU, or DDP on several


def test_lora_plugin_defaults_and_a_qlora_quant_plugin(tmp_path: Path) -> None:
    text = BARE + "peft_config:\n  name: lora\nquant_config:\n  name: auto\n  quantization_bit: 4\n"
    job = _read(tmp_path, text)
    assert {k: job.options[k] for k in ("method", "lora_rank", "lora_alpha", "lora_dropout", "quant_type")} == {
        "method": "qlora", "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.05, "quant_type": "nf4",
    }  # fmt: skip
    assert "lora_rank 8: LLaMA-Factory v1's default" in job.assumptions


def test_the_auto_quant_plugin_without_bits_quantizes_nothing(tmp_path: Path) -> None:
    """plugins/model_plugins/quantization.py: quantization_auto returns the model as it is when quantization_bit is
    unset; the bnb plugin defaults to 4 bits."""
    auto = _read(tmp_path, BARE + "peft_config:\n  name: lora\nquant_config:\n  name: auto\n")
    assert auto.options["method"] == "lora" and "quant_type" not in auto.options
    bnb = _read(tmp_path, BARE + "peft_config:\n  name: lora\nquant_config:\n  name: bnb\n")
    assert bnb.options["method"] == "qlora"
    assert "quantization_bit 4 (the bnb plugin's default): LLaMA-Factory v1's default" in bnb.assumptions


def test_a_global_batch_and_offloaded_fsdp2(tmp_path: Path) -> None:
    text = BARE + "global_batch_size: 64\nmax_steps: 100\ndist_config:\n  name: fsdp2\n  offload_params: true\n"
    job = _read(tmp_path, text)
    assert {k: job.options[k] for k in ("queries_per_step", "max_steps", "strategy", "offload")} == {
        "queries_per_step": 64, "max_steps": 100, "strategy": "fsdp2", "offload": "params",
    }  # fmt: skip


def test_the_v0_format_stays_with_its_own_reader(tmp_path: Path) -> None:
    job = _read(tmp_path, "model_name_or_path: Qwen/Qwen3-0.6B\nstage: sft\nfinetuning_type: lora\ncutoff_len: 512\n")
    assert job.framework == "llamafactory"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("batching_strategy: dynamic_batching\n", "batching_strategy: dynamic_batching: a token budget's"),
        ("micro_batch_size: 2\nbatching_strategy: padding_free\n", "padding_free: one unpadded row"),
        ("cp_size: 2\ncp_mode: ulysses\n", "cp_size: 2: LLaMA-Factory v1's Ulysses context parallelism"),
        ("optim_config:\n  name: muon\n", "optim_config: name: muon is not modelled"),
        ("dist_config:\n  name: fsdpturbo\n", "dist_config: name: fsdpturbo"),
        ("peft_config:\n  name: freeze\n", "peft_config: name: freeze"),
        ("peft_config:\n  name: lora\n  export_dir: ./merged\n", "export_dir: a merge and export config"),
        ("peft_config:\n  name: lora\n  rank: 8\n", "peft_config.rank: not a key of LLaMA-Factory v1's config"),
        ("model_class: cls\n", "model_class: a cls model"),
        ("quant_config:\n  name: bnb\n", "quant_config: LLaMA-Factory v1 quantizes the base weights of a LoRA run"),
        ("micro_batch_sise: 2\n", "not a key of LLaMA-Factory v1's config (did you mean micro_batch_size?)"),
    ],
)
def test_what_it_does_not_model_is_one_error_naming_the_key(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(TunecostError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        _read(tmp_path, BARE + extra)
