"""torchtune recipe YAML read as a tunecost job (configs written as recipes/configs/llama3_1/*.yaml show them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunecost.errors import TunecostError
from tunecost.models.catalog import resolve_model
from tunecost.workload.frameworks import ConfigFile, ConfigJob, parse_config_file
from tunecost.workload.frameworks.torchtune import FRAMEWORK, MODELS

LORA_SINGLE = """\
output_dir: /tmp/torchtune/llama3_2_3B/lora_single_device
model:
  _component_: torchtune.models.llama3_2.lora_llama3_2_3b
  lora_attn_modules: ['q_proj', 'v_proj']
  apply_lora_to_mlp: true
  lora_rank: "16"
  lora_alpha: 32
  lora_dropout: 0.0
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  path: /tmp/Llama-3.2-3B-Instruct/original/tokenizer.model
  max_seq_len: 2048
checkpointer:
  _component_: torchtune.training.FullModelHFCheckpointer
  checkpoint_dir: /tmp/Llama-3.2-3B-Instruct/
  model_type: LLAMA3_2
dataset:
  _component_: torchtune.datasets.alpaca_cleaned_dataset
  packed: false
batch_size: 4
optimizer:
  _component_: torch.optim.AdamW
  fused: true
  lr: 3e-4
loss:
  _component_: torchtune.modules.loss.LinearCrossEntropyLoss
epochs: 1
gradient_accumulation_steps: 8
compile: false
device: cuda
dtype: bf16
enable_activation_checkpointing: true
enable_activation_offloading: false
profiler:
  _component_: torchtune.training.setup_torch_profiler
  enabled: false
"""

QLORA_SINGLE = """\
model:
  _component_: torchtune.models.llama3_1.qlora_llama3_1_8b
  lora_attn_modules: ['q_proj', 'k_proj', 'v_proj', 'output_proj']
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  path: /tmp/Meta-Llama-3.1-8B-Instruct/original/tokenizer.model
  max_seq_len: null
dataset:
  _component_: torchtune.datasets.instruct_dataset
  source: json
  data_files: data/my_data.json
  packed: true
batch_size: 2
optimizer:
  _component_: bitsandbytes.optim.PagedAdamW8bit
  lr: 1e-4
loss:
  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss
epochs: 2
compile: true
dtype: bf16
enable_activation_offloading: true
"""

FULL_DISTRIBUTED = """\
tokenizer:
  _component_: torchtune.models.qwen2_5.qwen2_5_tokenizer
  max_seq_len: 4096
dataset:
  _component_: torchtune.datasets.alpaca_dataset
model:
  _component_: torchtune.models.qwen2_5.qwen2_5_7b_instruct
batch_size: 2
epochs: 1
optimizer:
  _component_: torch.optim.AdamW
  lr: 2e-5
loss:
  _component_: torchtune.modules.loss.LinearCrossEntropyLoss
optimizer_in_bwd: true
gradient_accumulation_steps: 1
device: cuda
enable_activation_checkpointing: true
custom_sharded_layers: ['tok_embeddings', 'output']
fsdp_cpu_offload: true
data_parallel_shard_dim: 8
dtype: bf16
"""


def _read(tmp_path: Path, text: str, name: str = "config.yaml") -> ConfigJob:
    path = tmp_path / name
    path.write_text(text)
    data = parse_config_file(path)
    assert FRAMEWORK.detect(data)
    return FRAMEWORK.read(ConfigFile(path=str(path), data=data))


def _named(job: ConfigJob, *starts: str) -> None:
    """Each filled default is among the assumptions, named with the framework's title."""
    for start in starts:
        assert any(a.startswith(start) and "torchtune" in a for a in job.assumptions), (start, job.assumptions)


def test_lora_single_device(tmp_path: Path) -> None:
    job = _read(tmp_path, LORA_SINGLE)
    assert job.framework == "torchtune"
    assert job.options == {
        "stack": "torchtune",
        "model": "meta-llama/Llama-3.2-3B",
        "method": "lora",
        "lora_rank": 16,
        "lora_dropout": 0.0,
        "lora_alpha": 32,
        "lora_targets": "mlp,q_proj,v_proj",  # lora_attn_modules q_proj, v_proj and apply_lora_to_mlp
        "dtype": "bf16",
        "gradient_checkpointing": True,
        "offload_activations": False,
        "chunked_loss": True,
        "optimizer": "adamw",
        "fused_adamw": True,  # optimizer.fused: True
        "batch_size": 4,
        "grad_accum": 8,
        "epochs": 1,
        "seq_len": 2048,
        "attention": "sdpa",
        "dataset": "alpaca-cleaned",  # alpaca_cleaned_dataset loads yahma/alpaca-cleaned, a catalog dataset
    }
    _named(job, "attention sdpa", "dataset alpaca-cleaned", "GPUs")
    assert {"checkpointer", "profiler"} <= set(
        job.not_modelled
    ) and "gradient_accumulation_steps" not in job.not_modelled
    assert job.options["lora_dropout"] == 0.0 and "model.lora_dropout" not in job.not_modelled


def test_qlora_defaults_and_local_data(tmp_path: Path) -> None:
    job = _read(tmp_path, QLORA_SINGLE)
    o = job.options
    assert (o["model"], o["method"], o["quant_type"], o["double_quant"]) == (
        "meta-llama/Llama-3.1-8B",
        "qlora",
        "nf4",
        True,
    )
    assert (o["lora_rank"], o["lora_alpha"], o["lora_targets"]) == (8, 16, "attention")  # the builder's defaults
    assert (o["optimizer"], o["offload_activations"], o["dataset"], o["epochs"]) == (
        "adamw-8bit",
        True,
        "data/my_data.json",
        2,
    )
    assert o["gradient_checkpointing"] is False  # the recipes' default
    assert "seq_len" not in o
    _named(job, "nf4", "lora_rank 8", "lora_alpha 16", "apply_lora_to_mlp false", "gradient_checkpointing off")
    _named(job, "tokenizer.max_seq_len unset", "compile true")
    assert o["torch_compile"] is True
    assert o["packing"] == "per-document"
    assert any(a.startswith("packing per-document: dataset.packed") for a in job.assumptions)
    assert not any("all four projections" in a for a in job.assumptions)


def test_full_distributed(tmp_path: Path) -> None:
    job = _read(tmp_path, FULL_DISTRIBUTED)
    o = job.options
    assert (o["model"], o["method"], o["seq_len"]) == ("Qwen/Qwen2.5-7B-Instruct", "full", 4096)
    assert (o["strategy"], o["num_gpus"], o["offload"]) == ("fsdp2", 8, "params")
    assert o["optimizer_in_backward"] is True and o["chunked_loss"] is True
    _named(job, "data_parallel_replicate_dim 1", "strategy fsdp2", "chunked_loss")
    assert "custom_sharded_layers" in job.not_modelled


@pytest.mark.parametrize(
    ("extra", "strategy", "gpus"),
    [
        ("data_parallel_replicate_dim: 2\ndata_parallel_shard_dim: 4\n", "hsdp", 8),
        ("fsdp_reshard_after_forward: false\n", "fsdp2-shard-grad-op", None),
    ],
)
def test_distributed_layouts(tmp_path: Path, extra: str, strategy: str, gpus: int | None) -> None:
    text = FULL_DISTRIBUTED.replace("fsdp_cpu_offload: true\ndata_parallel_shard_dim: 8\n", extra)
    job = _read(tmp_path, text)
    assert job.options["strategy"] == strategy
    assert job.options.get("num_gpus") == gpus
    if gpus is None:
        _named(job, "GPUs")


def test_every_builder_is_a_catalog_model() -> None:
    for builder, hub_id in MODELS.items():
        assert resolve_model(hub_id).hub_id, builder


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('lora_rank: "16"', "lora_rank: eight", "model.lora_rank"),
        ("dtype: bf16", "dtype: fp16", "dtype"),
        ("lora_llama3_2_3b", "lora_llama3_2_vision_11b", "model._component_"),
        ("lora_llama3_2_3b", "lora_llama9_3b", "model._component_"),
        ("alpaca_cleaned_dataset", "stack_exchange_paired_dataset", "dataset._component_"),
        ("modules.loss.LinearCrossEntropyLoss", "rlhf.loss.DPOLoss", "loss._component_"),
        ("torch.optim.AdamW", "torch.optim.Adagrad", "optimizer._component_"),
        ("lora_dropout: 0.0", "use_dora: true", "model.use_dora"),
        (
            "epochs: 1",
            "epochs: 1\nteacher_model:\n  _component_: torchtune.models.llama3_1.llama3_1_8b",
            "teacher_model",
        ),
        ("epochs: 1", "epochs: 1\ntensor_parallel_dim: 2", "tensor_parallel_dim"),
        ("epochs: 1", "epochs: 1\nquantizer:\n  _component_: torchtune.training.quantization.X", "quantizer"),
    ],
)
def test_errors_name_file_and_key(tmp_path: Path, old: str, new: str, key: str) -> None:
    assert old in LORA_SINGLE
    with pytest.raises(TunecostError) as err:
        _read(tmp_path, LORA_SINGLE.replace(old, new))
    assert str(tmp_path / "config.yaml") in str(err.value) and f": {key}: " in str(err.value)


EVALUATION = """\
model:
  _component_: torchtune.models.qwen3.qwen3_0_6b_instruct
checkpointer:
  _component_: torchtune.training.FullModelHFCheckpointer
  checkpoint_dir: /tmp/Qwen3-0.6B-Instruct
  model_type: QWEN3
tasks: ["truthfulqa_mc2"]
limit: null
max_seq_length: 4096
batch_size: 8
quantizer: null
"""


@pytest.mark.parametrize(("text", "key"), [(EVALUATION, "tasks"), (EVALUATION.replace("tasks", "prompt"), "prompt")])
def test_an_evaluation_or_generation_config_trains_nothing(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(TunecostError, match=f": {key}: an evaluation, generation or quantization config"):
        _read(tmp_path, text)


def test_a_builder_of_another_source_or_dataset_is_not_read(tmp_path: Path) -> None:
    other = _read(tmp_path, LORA_SINGLE.replace("alpaca_cleaned_dataset", "slimorca_dataset"))
    assert "dataset" not in other.options  # Open-Orca/SlimOrca-Dedup, not the catalog's SlimOrca
    assert any(a.startswith("dataset slimorca_dataset: torchtune's builder, not read") for a in other.assumptions)


def test_a_null_quantizer_is_no_quantization_aware_training(tmp_path: Path) -> None:
    assert _read(tmp_path, LORA_SINGLE + "quantizer: null\n").options["method"] == "lora"


def test_detect_is_false_for_other_frameworks() -> None:
    others = [
        {"model_name_or_path": "meta-llama/Llama-3.1-8B", "stage": "sft", "finetuning_type": "lora"},  # LLaMA-Factory
        {"base_model": "NousResearch/Llama-3.2-1B", "adapter": "lora", "micro_batch_size": 2},  # axolotl
        {"checkpoint_dir": "checkpoints/meta-llama/Llama-2-7b-hf", "precision": "bf16-true", "train": {}},  # litgpt
        {"model": {"name": "llama3", "flavor": "8B"}, "training": {"seq_len": 8192}},  # torchtitan
        {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 4},  # DeepSpeed
    ]
    assert not any(FRAMEWORK.detect(d) for d in others)


@pytest.mark.parametrize(
    ("enabled", "extra", "checkpointing", "recomputed"),
    [
        ("false", "ac_mode: none\n", False, None),
        ("false", "ac_mode: full\n", True, None),
        ("false", "ac_mode: selective\nac_option: 2\n", True, 14),  # Qwen2.5-7B: 28 layers, every 2nd block
        ("true", "ac_mode: selective\nac_option: 2\n", False, None),  # the recipe applies neither
    ],
)
def test_ac_mode_as_the_full_distributed_recipe_reads_it(tmp_path, enabled, extra, checkpointing, recomputed):
    text = FULL_DISTRIBUTED.replace(
        "enable_activation_checkpointing: true\n", f"enable_activation_checkpointing: {enabled}\n"
    )
    job = _read(tmp_path, text + extra)
    assert job.options["gradient_checkpointing"] is checkpointing
    assert job.options.get("recompute_layers") == recomputed
    assert "ac_mode" not in job.not_modelled and "ac_option" not in job.not_modelled


def test_ac_mode_is_not_read_by_the_lora_recipes(tmp_path):
    text = LORA_SINGLE.replace("enable_activation_checkpointing: true", "enable_activation_checkpointing: false")
    assert text != LORA_SINGLE
    job = _read(tmp_path, text + "ac_mode: selective\nac_option: 1\n")
    assert job.options["gradient_checkpointing"] is False
    assert any("not read by torchtune's LoRA recipes" in a for a in job.assumptions)


def test_fp8_training_of_the_full_distributed_recipe(tmp_path):
    job = _read(tmp_path, FULL_DISTRIBUTED + "enable_fp8_training: true\n")
    assert job.options["fp8"] == "tensorwise" and "enable_fp8_training" not in job.not_modelled
    rowwise = _read(tmp_path, FULL_DISTRIBUTED + "enable_fp8_training: true\nfp8_recipe_name: rowwise\n")
    assert rowwise.options["fp8"] == "rowwise"
    with pytest.raises(TunecostError, match="fp8_recipe_name: 'mx'"):
        _read(tmp_path, FULL_DISTRIBUTED + "enable_fp8_training: true\nfp8_recipe_name: mx\n")


@pytest.mark.parametrize(("line", "fused"), [("  fused: False\n", False), ("  fused: True\n", True), ("", None)])
def test_the_optimizers_fused_flag_is_read(tmp_path: Path, line: str, fused: bool | None) -> None:
    """`optimizer.fused` is the AdamW the step runs (False: the multi-tensor one, whose temporaries the fused kernel
    does not hold); unstated, the stack's own (torchtune's configs set fused=True)."""
    job = _read(tmp_path, FULL_DISTRIBUTED.replace("  lr: 2e-5\n", "  lr: 2e-5\n" + line))
    assert job.options.get("fused_adamw") is fused
    assert "optimizer.fused" not in job.not_modelled


def test_a_list_of_datasets_is_concatenated(tmp_path):
    """The recipes concatenate a `dataset` list (ConcatDataset): the first gives the lengths and its packing, the
    queries are all of theirs where the catalog counts each; a builder tunecost does not read leaves the first's."""
    from tunecost.catalog.datasets import get_dataset_facts

    one = "dataset:\n  _component_: torchtune.datasets.alpaca_cleaned_dataset\n  packed: false\n"
    assert one in LORA_SINGLE
    two = "dataset:\n  - _component_: torchtune.datasets.instruct_dataset\n    source: openai/gsm8k\n"
    two += "    split: train[:50%]\n  - _component_: torchtune.datasets.alpaca_cleaned_dataset\n"
    job = _read(tmp_path, LORA_SINGLE.replace(one, two))
    rows = get_dataset_facts("gsm8k-train").num_queries, get_dataset_facts("alpaca-cleaned").num_queries
    assert job.options["dataset"] == "gsm8k-train" and "dataset_split" not in job.options
    assert job.options["mixture_queries"] == round(rows[0] / 2) + rows[1] and "dataset" not in job.not_modelled
    unread = _read(tmp_path, LORA_SINGLE.replace(one, two.replace("alpaca_cleaned_dataset", "text_completion_dataset")))
    assert unread.options["dataset_split"] == "train[:50%]" and "mixture_queries" not in unread.options
    assert any(a.startswith("dataset: only the first of 2 datasets gives the lengths") for a in unread.assumptions)
