"""The Hugging Face stack's files read as tunecost jobs: TrainingArguments / SFTConfig dumps and YAMLs, PEFT's
adapter_config.json and BitsAndBytesConfig, written as `to_json_string()` / `save_pretrained` / TRL's docs show them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunecost.catalog.datasets import get_dataset_facts
from tunecost.errors import TunecostError
from tunecost.workload.frameworks import ConfigFile, ConfigJob, parse_config_file
from tunecost.workload.frameworks.adapters import FRAMEWORK_BNB, FRAMEWORK_PEFT_LORA
from tunecost.workload.frameworks.adapters import FRAMEWORKS as ADAPTER_FRAMEWORKS
from tunecost.workload.frameworks.hf import FRAMEWORK_TRAINING_ARGS
from tunecost.workload.frameworks.hf import FRAMEWORKS as TRAINER_FRAMEWORKS

FRAMEWORKS = (*TRAINER_FRAMEWORKS, *ADAPTER_FRAMEWORKS)

# TrainingArguments(...).to_json_string() (transformers 5: activation_checkpointing beside its gradient_* alias)
TRAINER_JSON = {
    "output_dir": "out/llama-lora",
    "per_device_train_batch_size": 4,
    "num_train_epochs": 2.0,
    "max_steps": -1,
    "learning_rate": 0.0002,
    "lr_scheduler_type": "cosine",
    "optim": "paged_adamw_8bit",
    "weight_decay": 0.0,
    "gradient_accumulation_steps": 4,
    "bf16": True,
    "fp16": False,
    "tf32": None,
    "activation_checkpointing": True,
    "activation_checkpointing_kwargs": {"use_reentrant": True},
    "gradient_checkpointing": True,
    "gradient_checkpointing_kwargs": {"use_reentrant": True},
    "torch_compile": True,
    "logging_steps": 10,
    "save_strategy": "epoch",
    "report_to": [],
    "seed": 42,
    "fsdp": None,
    "fsdp_config": None,
    "deepspeed": None,
}

# a script's arguments with the defaults left out and a DeepSpeed file named
TRAINER_DEFAULTS_JSON = {"output_dir": "out", "per_device_train_batch_size": 2, "deepspeed": "ds_z3.json"}

# `trl sft --config sft.yaml`: ScriptArguments + SFTConfig (+ ModelConfig's attn_implementation)
SFT_YAML = """\
model_name_or_path: Qwen/Qwen2.5-7B
dataset_name: trl-lib/Capybara
attn_implementation: flash_attention_2
learning_rate: 2.0e-5
num_train_epochs: 1
per_device_train_batch_size: "2"
gradient_accumulation_steps: 8
max_length: 2048
packing: true
output_dir: Qwen2.5-7B-SFT
fsdp: full_shard auto_wrap
fsdp_config:
  fsdp_version: 1
  activation_checkpointing: true
"""

# a TRL QLoRA recipe: SFTConfig plus ModelConfig's PEFT and 4-bit keys
TRL_QLORA_YAML = """\
model_name_or_path: mistralai/Mixtral-8x7B-v0.1
dataset_name: trl-lib/Capybara
per_device_train_batch_size: 1
num_train_epochs: 1
output_dir: mixtral-qlora
use_peft: true
lora_r: 16
lora_target_modules: [w1, w2, w3, gate]
load_in_4bit: true
use_bnb_nested_quant: true
gradient_checkpointing_kwargs:
  use_reentrant: true
optim: adamw_torch_fused
"""

# FSDP2 through TrainingArguments, SHARD_GRAD_OP written the transformers 5 way
FSDP2_YAML = """\
output_dir: out
per_device_train_batch_size: 8
bf16: true
fsdp: true
fsdp_config:
  version: 2
  reshard_after_forward: false
  cpu_offload: false
"""

# adapter_config.json as LoraConfig.save_pretrained writes it
LORA_LLAMA = {
    "alpha_pattern": {},
    "auto_mapping": None,
    "base_model_name_or_path": "meta-llama/Llama-3.1-8B",
    "bias": "none",
    "fan_in_fan_out": False,
    "inference_mode": True,
    "lora_alpha": 32,
    "lora_dropout": 0.05,
    "modules_to_save": ["lm_head"],
    "peft_type": "LORA",
    "r": 16,
    "rank_pattern": {},
    "revision": None,
    "target_modules": ["v_proj", "q_proj"],
    "task_type": "CAUSAL_LM",
    "use_dora": False,
    "use_rslora": False,
}
LORA_ALL_LINEAR = {
    "peft_type": "LORA",
    "task_type": "CAUSAL_LM",
    "r": 64,
    "lora_alpha": 16,
    "target_modules": "all-linear",
}
# the paper's Mixtral targets, rank and alpha left to PEFT's defaults
LORA_MIXTRAL = {
    "peft_type": "LORA",
    "base_model_name_or_path": "mistralai/Mixtral-8x7B-v0.1",
    "target_modules": ["w1", "w2", "w3", "gate"],
}
# PEFT >= 0.17 on transformers 5's fused experts: target_parameters
LORA_PARAMS = {
    "peft_type": "LORA",
    "r": 8,
    "lora_alpha": 16,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight"],
}

# BitsAndBytesConfig(...).to_dict()
BNB_NF4 = {
    "quant_method": "bitsandbytes",
    "_load_in_8bit": False,
    "_load_in_4bit": True,
    "llm_int8_threshold": 6.0,
    "llm_int8_skip_modules": None,
    "llm_int8_enable_fp32_cpu_offload": False,
    "llm_int8_has_fp16_weight": False,
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
    "bnb_4bit_compute_dtype": "bfloat16",
    "bnb_4bit_quant_storage": "uint8",
    "load_in_4bit": True,
    "load_in_8bit": False,
}
BNB_MINIMAL = {"load_in_4bit": True}
BNB_8BIT = {"quant_method": "bitsandbytes", "load_in_8bit": True, "load_in_4bit": False, "llm_int8_threshold": 6.0}

# other frameworks' configs (plain dicts of their keys)
LLAMA_FACTORY = {
    "model_name_or_path": "m",
    "stage": "sft",
    "finetuning_type": "lora",
    "per_device_train_batch_size": 2,
    "output_dir": "o",
    "num_train_epochs": 3.0,
}
AXOLOTL = {"base_model": "m", "micro_batch_size": 2, "load_in_4bit": True, "adapter": "qlora", "num_epochs": 1}
ACCELERATE = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU", "num_processes": 8}
DEEPSPEED = {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}}
TORCHTUNE = {"batch_size": 2, "model": {"_component_": "torchtune.models.llama3_1.lora_llama3_1_8b"}, "epochs": 1}


def _write(tmp_path: Path, name: str, content: str | dict) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def _read(framework, tmp_path: Path, name: str, content: str | dict) -> ConfigJob:
    path = _write(tmp_path, name, content)
    data = parse_config_file(path)
    assert framework.detect(data)
    assert [f.name for f in FRAMEWORKS if f.detect(data)] == [framework.name]
    return framework.read(ConfigFile(path=str(path), data=data))


def _said(job: ConfigJob, *words: str) -> bool:
    return any(all(w in line for w in words) for line in job.assumptions)


def test_training_arguments_json_dump(tmp_path: Path) -> None:
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "args.json", TRAINER_JSON)
    assert job.options == {
        "stack": "hf-peft",
        "batch_size": 4,
        "grad_accum": 4,
        "epochs": 2.0,
        "optimizer": "adamw-8bit",
        "attention": "sdpa",
        "dtype": "bf16",
        "gradient_checkpointing": True,
        "reentrant": True,
        "torch_compile": True,
    }
    assert "method" not in job.options  # the PEFT / bitsandbytes files say it
    assert _said(job, "attention sdpa", "transformers' default")
    assert job.not_modelled == () and job.options["grad_accum"] == 4  # the optimizer's share of the step
    assert _said(job, "torch_compile", "fuses each layer's element-wise")


def test_training_arguments_defaults(tmp_path: Path) -> None:
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "args.json", TRAINER_DEFAULTS_JSON)
    assert job.options == {
        "stack": "hf-peft",
        "batch_size": 2,
        "epochs": 3.0,
        "optimizer": "adamw",
        "fused_adamw": True,  # adamw_torch_fused, the default
        "attention": "sdpa",
        "dtype": "bf16",  # no autocast: the model as from_pretrained loads it (the checkpoint's dtype)
        "gradient_checkpointing": False,
    }
    for option in ("epochs 3.0", "optimizer adamw", "dtype bf16 (bf16, fp16 off)", "gradient_checkpointing off"):
        assert _said(job, option, "TrainingArguments' default"), option
    assert _said(job, "dtype bf16", "no autocast", "--dtype fp32 for a model loaded in fp32")
    assert _said(job, "deepspeed config ds_z3.json", "pass it too with --config")
    assert _said(job, "method: TrainingArguments do not say")
    assert job.not_modelled == ()


def test_sft_config_yaml(tmp_path: Path) -> None:
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "sft.yaml", SFT_YAML)
    assert job.options == {
        "stack": "hf-peft",
        "model": "Qwen/Qwen2.5-7B",
        "method": "full",
        "batch_size": 2,
        "grad_accum": 8,
        "epochs": 1,
        "optimizer": "adamw",
        "fused_adamw": True,
        "attention": "flash",
        "dtype": "bf16",
        "gradient_checkpointing": True,
        "reentrant": False,
        "strategy": "fsdp1",
        "seq_len": 2048,
        "packing": "per-document",  # TRL's default packing_strategy bfd: position ids, attention per example
        "chunked_loss": True,  # TRL >= 1.7's default loss_type chunked_nll
        "fp32_params": True,  # TRL loads in fp32; FSDP gathers and computes the layers in bf16
    }
    assert _said(job, "fp32_params: TRL loads the model in fp32")
    assert _said(job, "dtype bf16", "SFTConfig's default")  # TRL: bf16 unless fp16
    assert _said(job, "gradient_checkpointing on", "SFTConfig's default")
    assert _said(job, "packing per-document: packing_strategy bfd", "SFTConfig's default")
    assert _said(job, "loss_type chunked_nll", "SFTConfig's default since TRL 1.7")
    assert not _said(job, "FSDP version 2")  # fsdp_config says version 1
    assert _said(job, "method full (use_peft unset)", "ModelConfig's default")  # TRL's sft.py: full unless use_peft
    assert _said(job, "dataset_name trl-lib/Capybara", "give --dataset FILE")  # no lengths known for it


def test_a_hub_dataset_in_the_local_cache_is_the_jobs_data(tmp_path: Path, hub_cache) -> None:
    hub_cache("trl-lib/Capybara", [{"messages": [{"role": "user", "content": "Hi"}]}])
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "sft.yaml", SFT_YAML)
    assert job.options["dataset"] == "trl-lib/Capybara"
    assert _said(job, "dataset_name trl-lib/Capybara: its copy in the local Hugging Face cache is counted")


def test_trl_qlora_recipe(tmp_path: Path) -> None:
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "qlora.yaml", TRL_QLORA_YAML)
    options = job.options
    assert options["method"] == "qlora" and options["quant_type"] == "nf4" and options["double_quant"] is True
    assert (options["lora_rank"], options["lora_alpha"], options["lora_targets"]) == (16, 32, "experts,router")
    assert options["seq_len"] == 1024 and options["reentrant"] is True and options["optimizer"] == "adamw"
    assert _said(job, "lora_alpha 32", "ModelConfig's default")
    assert _said(job, "quant_type nf4", "ModelConfig's default")
    assert _said(job, "seq_len 1024", "SFTConfig's default")


def test_trl_8bit_lora(tmp_path: Path) -> None:
    text = TRL_QLORA_YAML.replace("load_in_4bit: true", "load_in_8bit: true")
    assert text != TRL_QLORA_YAML
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "lora8.yaml", text)
    assert (job.options["method"], job.options["quant_type"]) == ("qlora", "int8")
    assert _said(job, "load_in_8bit", "LLM.int8") and not _said(job, "quant_type nf4")


def test_fsdp2_shard_grad_op(tmp_path: Path) -> None:
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "args.yaml", FSDP2_YAML)
    assert job.options["strategy"] == "fsdp2-shard-grad-op" and "offload" not in job.options
    legacy = {"output_dir": "o", "per_device_train_batch_size": 1, "fsdp": "full_shard offload auto_wrap"}
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "legacy.json", legacy)
    assert (job.options["strategy"], job.options["offload"]) == ("fsdp2", "params")
    assert _said(job, "FSDP version 2", "transformers' default")


def test_lora_adapter_configs(tmp_path: Path) -> None:
    job = _read(FRAMEWORK_PEFT_LORA, tmp_path, "adapter_config.json", LORA_LLAMA)
    assert job.options == {
        "lora_rank": 16,
        "lora_alpha": 32,
        "lora_dropout": 0.05,
        "lora_targets": "q_proj,v_proj",
        "method": "lora",
        "stack": "hf-peft",
        "model": "meta-llama/Llama-3.1-8B",
        "modules_to_save": "lm_head",  # trained fully beside the adapters (`memory --modules-to-save`)
    }
    assert not any("whole attention group" in line for line in job.assumptions)  # the listed projections only
    assert job.not_modelled == () and job.options["lora_dropout"] == 0.05

    job = _read(FRAMEWORK_PEFT_LORA, tmp_path, "adapter_config.json", LORA_ALL_LINEAR)
    assert (job.options["lora_rank"], job.options["lora_targets"]) == (64, "attention,mlp")
    assert _said(job, "all-linear", "every nn.Linear") and not _said(job, "all-linear", "MoE")  # a dense model
    moe = {**LORA_ALL_LINEAR, "base_model_name_or_path": "mistralai/Mixtral-8x7B-v0.1"}
    job = _read(FRAMEWORK_PEFT_LORA, tmp_path, "adapter_config.json", moe)
    assert _said(job, "all-linear", "on an MoE model, attention and any dense MLP only", "transformers >= 5")

    job = _read(FRAMEWORK_PEFT_LORA, tmp_path, "adapter_config.json", LORA_MIXTRAL)
    assert job.options["lora_targets"] == "experts,router"
    assert (job.options["lora_rank"], job.options["lora_alpha"]) == (8, 8)
    assert _said(job, "lora_rank 8", "PEFT LoraConfig's default") and _said(job, "lora_alpha 8", "PEFT LoraConfig")

    job = _read(FRAMEWORK_PEFT_LORA, tmp_path, "adapter_config.json", LORA_PARAMS)
    assert job.options["lora_targets"] == "attention,experts,router"


def test_lora_default_targets(tmp_path: Path) -> None:
    job = _read(FRAMEWORK_PEFT_LORA, tmp_path, "adapter_config.json", {"peft_type": "LORA", "r": 4, "lora_alpha": 8})
    assert "lora_targets" not in job.options
    assert _said(job, "target_modules unset", "PEFT LoraConfig's default", "tunecost's default targets")


@pytest.mark.parametrize(
    ("model", "targets", "said"),
    [
        ("meta-llama/Llama-3.1-8B", "q_proj,v_proj", "PEFT's default for model type llama"),
        ("mistralai/Mixtral-8x7B-v0.1", "q_proj,v_proj", "PEFT's default for model type mixtral"),
        ("Qwen/Qwen1.5-MoE-A2.7B", None, "PEFT has none for model type qwen2_moe"),
    ],
)
def test_unset_target_modules_are_pefts_for_the_model_type(tmp_path: Path, model, targets, said) -> None:
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "base_model_name_or_path": model}
    job = _read(FRAMEWORK_PEFT_LORA, tmp_path, "adapter_config.json", config)
    assert job.options.get("lora_targets") == targets
    assert _said(job, "target_modules unset", said)


def test_bitsandbytes_configs(tmp_path: Path) -> None:
    job = _read(FRAMEWORK_BNB, tmp_path, "bnb.json", BNB_NF4)
    assert job.options == {
        "method": "qlora",
        "quant_type": "nf4",
        "double_quant": True,
        "dtype": "bf16",
        "stack": "hf-peft",
    }
    assert job.assumptions == () and job.not_modelled == ()

    job = _read(FRAMEWORK_BNB, tmp_path, "bnb.yaml", "load_in_4bit: true\n")
    assert (job.options["quant_type"], job.options["double_quant"], job.options["dtype"]) == ("fp4", False, "fp32")
    for option in ("quant_type fp4", "double_quant False", "dtype fp32"):
        assert _said(job, option, "BitsAndBytesConfig's default"), option

    path = _write(tmp_path, "bnb8.json", BNB_8BIT)
    job = FRAMEWORK_BNB.read(ConfigFile(path=str(path), data=parse_config_file(path)))
    assert (job.options["method"], job.options["quant_type"], job.options["stack"]) == ("qlora", "int8", "hf-peft")
    assert "dtype" not in job.options and _said(job, "load_in_8bit", "LLM.int8")
    path = _write(tmp_path, "bnb8fp16.json", {**BNB_8BIT, "llm_int8_has_fp16_weight": True})
    with pytest.raises(TunecostError, match=r"bnb8fp16\.json: llm_int8_has_fp16_weight: 16-bit weights kept"):
        FRAMEWORK_BNB.read(ConfigFile(path=str(path), data=parse_config_file(path)))


@pytest.mark.parametrize(
    ("framework", "data", "message"),
    [
        (
            FRAMEWORK_TRAINING_ARGS,
            {**TRAINER_DEFAULTS_JSON, "per_device_train_batch_size": "eight"},
            "per_device_train_batch_size: must be a whole number",
        ),
        (
            FRAMEWORK_TRAINING_ARGS,
            {**TRAINER_DEFAULTS_JSON, "optim": "adafactor"},
            "optim: 'adafactor' is not modelled",
        ),
        (
            FRAMEWORK_TRAINING_ARGS,
            {**TRAINER_DEFAULTS_JSON, "attn_implementation": "flex_attention"},
            "attn_implementation: 'flex_attention' is not modelled",
        ),
        (FRAMEWORK_TRAINING_ARGS, {**TRAINER_DEFAULTS_JSON, "bf16": True, "fp16": True}, "bf16: bf16 and fp16"),
        (FRAMEWORK_TRAINING_ARGS, {**TRAINER_DEFAULTS_JSON, "fsdp": "hybrid_shard"}, "fsdp: hybrid_shard with FSDP"),
        (
            FRAMEWORK_TRAINING_ARGS,
            {**TRAINER_DEFAULTS_JSON, "use_peft": False, "load_in_8bit": True},
            "load_in_8bit: quantized weights without LoRA",
        ),
        (FRAMEWORK_PEFT_LORA, {"peft_type": "IA3", "target_modules": ["k_proj"]}, "peft_type: 'IA3' is not modelled"),
        (FRAMEWORK_PEFT_LORA, {**LORA_LLAMA, "use_dora": True}, "use_dora: DoRA is not modelled"),
        (FRAMEWORK_PEFT_LORA, {**LORA_LLAMA, "r": "eight"}, "r: must be a whole number"),
        (FRAMEWORK_PEFT_LORA, {**LORA_LLAMA, "task_type": "SEQ_CLS"}, "task_type: SEQ_CLS: tunecost estimates"),
        (FRAMEWORK_PEFT_LORA, {**LORA_LLAMA, "target_modules": ["lm_head"]}, "target_modules: 'lm_head' is not"),
        (FRAMEWORK_BNB, {**BNB_NF4, "bnb_4bit_quant_type": "int4"}, "bnb_4bit_quant_type: 'int4' is not a 4-bit"),
        (FRAMEWORK_BNB, {**BNB_NF4, "bnb_4bit_compute_dtype": "int8"}, "bnb_4bit_compute_dtype: 'int8' is not"),
    ],
)
def test_errors_name_the_file_and_key(tmp_path: Path, framework, data: dict, message: str) -> None:
    path = _write(tmp_path, "cfg.json", data)
    with pytest.raises(TunecostError, match="cfg.json: " + message.replace("(", r"\(")):
        framework.read(ConfigFile(path=str(path), data=parse_config_file(path)))


@pytest.mark.parametrize(
    "data", [LLAMA_FACTORY, AXOLOTL, ACCELERATE, DEEPSPEED, TORCHTUNE], ids=lambda d: next(iter(d))
)
def test_detect_is_false_for_other_frameworks(data: dict) -> None:
    assert not any(framework.detect(data) for framework in FRAMEWORKS)


def test_detect_tells_the_three_apart() -> None:
    for data, framework in (
        (TRAINER_JSON, FRAMEWORK_TRAINING_ARGS),
        (LORA_LLAMA, FRAMEWORK_PEFT_LORA),
        (BNB_NF4, FRAMEWORK_BNB),
        (BNB_MINIMAL, FRAMEWORK_BNB),
    ):
        assert [f for f in FRAMEWORKS if f.detect(data)] == [framework]


def test_trl_fills_its_lora_dropout(tmp_path: Path) -> None:
    """TRL's ModelConfig defaults lora_dropout to 0.05 (PEFT's LoraConfig to 0): an unset one is TRL's, and said."""
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "qlora.yaml", TRL_QLORA_YAML)
    assert job.options["lora_dropout"] == 0.05 and _said(job, "lora_dropout 0.05", "ModelConfig's default")


def test_wrapped_packing_attends_across_the_row(tmp_path: Path) -> None:
    yaml_text = SFT_YAML.replace("packing: true", "packing: true\npacking_strategy: wrapped")
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "sft.yaml", yaml_text)
    assert job.options["packing"] == "cross-document"
    assert _said(job, "packing cross-document: packing_strategy wrapped:")


@pytest.mark.parametrize(
    ("optim", "ours"),
    [("adamw_torch_fused", "adamw"), ("paged_adamw_8bit", "adamw-8bit"), ("adamw_torch_8bit", "adamw-8bit")],
)
def test_the_trainers_optimizer_names(tmp_path: Path, optim: str, ours: str) -> None:
    """torchao's AdamW8bit (adamw_torch_8bit) keeps bitsandbytes' 8-bit states: blocks of 256, fp32 scales."""
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "args.json", {**TRAINER_DEFAULTS_JSON, "optim": optim})
    assert job.options["optimizer"] == ours


@pytest.mark.parametrize(
    ("extra", "on"),
    [
        ({"use_liger_kernel": True}, True),
        ({"use_liger_kernel": True, "liger_kernel_config": {"rope": True, "swiglu": True}}, True),
        ({"use_liger_kernel": True, "liger_kernel_config": {"fused_linear_cross_entropy": False}}, False),
        ({"use_liger_kernel": False}, False),
    ],
)
def test_use_liger_kernel_is_read_with_the_default_kernels(tmp_path: Path, extra: dict, on: bool) -> None:
    args = {"output_dir": "out", "per_device_train_batch_size": 2, **extra}
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "args.json", args)
    assert job.options.get("liger_kernel", False) is on
    if on:
        assert _said(job, "use_liger_kernel", "fused linear cross-entropy") and not job.not_modelled
    elif extra["use_liger_kernel"]:
        assert _said(job, "only Liger's default kernels are modelled") and "liger_kernel_config" in job.not_modelled


@pytest.mark.parametrize(
    ("extra", "chunked"),
    [("", True), ("loss_type: chunked_nll\n", True), ("loss_type: nll\n", False), ("use_liger_kernel: true\n", False)],
)
def test_sft_loss_type_chunked_nll_is_trls_default(tmp_path: Path, extra: str, chunked: bool) -> None:
    """SFTConfig's loss_type: chunked_nll when unset (TRL >= 1.7) unless use_liger_kernel, which makes it nll."""
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "sft.yaml", SFT_YAML + extra)
    assert job.options.get("chunked_loss", False) is chunked
    assert "loss_type" not in job.not_modelled


def test_sft_chunked_nll_with_liger_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TunecostError, match="loss_type: chunked_nll with use_liger_kernel"):
        _read(
            FRAMEWORK_TRAINING_ARGS, tmp_path, "sft.yaml", SFT_YAML + "loss_type: chunked_nll\nuse_liger_kernel: true\n"
        )


def test_sft_activation_offloading_is_read(tmp_path: Path) -> None:
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "sft.yaml", SFT_YAML + "activation_offloading: true\n")
    assert job.options["offload_activations"] is True and "activation_offloading" not in job.not_modelled
    assert _said(job, "activation_offloading: TRL's OffloadActivations")


# the alignment handbook's recipes/zephyr-7b-beta/sft/config_full.yaml (@925acdf), shortened: TRL's SFTConfig and
# ModelConfig keys beside the handbook's dataset_mixture and chat_template
HANDBOOK_SFT = """\
model_name_or_path: mistralai/Mistral-7B-v0.1
torch_dtype: bfloat16
attn_implementation: flash_attention_2
chat_template: "{% for message in messages %}{{ message['content'] }}{% endfor %}"
dataset_mixture:
  datasets:
    - id: HuggingFaceH4/ultrachat_200k
      split: train_sft
    - id: HuggingFaceH4/ultrachat_200k
      split: test_sft
  test_split_size: 1000
bf16: true
gradient_checkpointing: true
gradient_checkpointing_kwargs:
  use_reentrant: False
max_seq_length: 2048
num_train_epochs: 1
output_dir: data/zephyr-7b-sft-full
per_device_train_batch_size: 16
"""


def test_an_alignment_handbook_sft_recipe(tmp_path: Path) -> None:
    """The handbook's ScriptArguments.dataset_mixture gives the data (its first dataset), chat_template is read."""
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "config_full.yaml", HANDBOOK_SFT)
    assert job.options["dataset"] == "ultrachat-200k" and job.options["seq_len"] == 2048
    assert (job.options["method"], job.options["batch_size"], job.options["reentrant"]) == ("full", 16, False)
    mixed = HANDBOOK_SFT.replace("id: HuggingFaceH4/ultrachat_200k\n      split: test", "id: org/other\n      split: t")
    two = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "two.yaml", mixed)
    assert _said(two, "dataset_mixture: only the first of 2 datasets gives the lengths")


def test_trls_dataset_mixture_gives_the_data(tmp_path: Path) -> None:
    """TRL's own DatasetMixtureConfig: `datasets`, each a `path` (trl/scripts/utils.py)."""
    text = "model_name_or_path: Qwen/Qwen2.5-0.5B\ndatasets:\n  - path: tatsu-lab/alpaca\n    split: train\n"
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "mix.yaml", text)
    assert job.options["dataset"] == "alpaca" and _said(job, "TRL SFTConfig's default")


def test_a_bare_trl_cli_config_is_read_with_sfts_defaults(tmp_path: Path) -> None:
    """`trl sft --config`'s example (examples/cli_configs/example_config.yaml): model and data, no batch size."""
    text = (
        "model_name_or_path: Qwen/Qwen2.5-0.5B\ndataset_name: stanfordnlp/imdb\nreport_to: none\nlearning_rate: 1e-4\n"
    )
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "example_config.yaml", text)
    assert (job.options["batch_size"], job.options["seq_len"], job.options["method"]) == (8, 1024, "full")
    assert job.options["gradient_checkpointing"] is True and _said(job, "dataset_name stanfordnlp/imdb")


def test_a_preference_trainers_config_is_one_error(tmp_path: Path) -> None:
    """DPOConfig and its kin carry `beta` (the handbook's dpo/ and orpo/ recipes)."""
    path = _write(tmp_path, "dpo.yaml", HANDBOOK_SFT.replace("bf16: true", "beta: 0.01"))
    with pytest.raises(TunecostError, match=r"dpo\.yaml: beta: a preference or RL trainer's config"):
        FRAMEWORK_TRAINING_ARGS.read(ConfigFile(path=str(path), data=parse_config_file(path)))


def test_trl_loads_the_model_in_fp32_unless_its_dtype_says(tmp_path: Path) -> None:
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "sft.yaml", TRL_QLORA_YAML)
    assert _said(job, "TRL loads the model in fp32", "TRL's default float32", "frozen weights")
    half = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "sft.yaml", TRL_QLORA_YAML + "dtype: bfloat16\n")
    assert not _said(half, "TRL loads the model in fp32") and "dtype" not in half.not_modelled
    # a full fine-tune of the fp32 model under bf16 autocast is torch AMP on one GPU or DDP; DeepSpeed casts it
    text = "model_name_or_path: Qwen/Qwen2.5-0.5B\ndataset_name: trl-lib/Capybara\nbf16: true\n"
    full = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "sft.yaml", text)
    assert full.options["fp32_params"] is True and _said(full, "fp32_params: TRL loads the model in fp32")
    lora = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "sft.yaml", text + "use_peft: true\n")
    assert lora.options["fp32_params"] is True and lora.options["method"] == "lora"  # fp32 frozen weights
    staged = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "sft.yaml", text + "deepspeed: z2.json\n")
    assert "fp32_params" not in staged.options and not _said(staged, "TRL loads the model in fp32")


@pytest.mark.parametrize(
    ("data", "dataset", "split"),
    [
        ("dataset_name: openai/gsm8k\ndataset_train_split: test\n", "gsm8k", None),  # the catalog's test row
        ("dataset_name: openai/gsm8k\ndataset_train_split: train\n", "gsm8k-train", None),
        ("dataset_name: openai/gsm8k\n", "gsm8k-train", None),  # no split stated: the hub id's train row
        ("datasets:\n  - path: HuggingFaceH4/ultrachat_200k\n    split: test_sft\n", "ultrachat-200k-test-sft", None),
        ("datasets:\n  - path: HuggingFaceH4/ultrachat_200k\n    split: train_gen\n", "ultrachat-200k", "train_gen"),
        ("dataset_name: synthetic-arith\ndataset_train_split: test\n", "synthetic-arith", None),  # not a catalog row
        ("datasets:\n  - path: HuggingFaceH4/ultrachat_200k\n    split: train_sft[:10%]\n", "ultrachat-200k",
         "train_sft[:10%]"),
    ],
)  # fmt: skip
def test_the_split_a_config_names_picks_the_catalog_row_or_slices_it(tmp_path: Path, data, dataset, split) -> None:
    """A catalog row of the named split is the job's data; a split the catalog has no row of is left to count."""
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "sft.yaml", "model_name_or_path: Qwen/Qwen2.5-0.5B\n" + data)
    assert (job.options["dataset"], job.options.get("dataset_split")) == (dataset, split)


def test_the_handbooks_test_split_size_is_held_out(tmp_path: Path) -> None:
    """dataset_mixture.test_split_size: train_test_split of the concatenated mixture (src/alignment/data.py)."""
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "config_full.yaml", HANDBOOK_SFT)
    assert job.options["eval_split"] == 1000
    assert _said(job, "dataset_mixture: 230975 queries per epoch (207865 of HuggingFaceH4/ultrachat_200k train_sft")


def test_a_mixture_of_counted_datasets_is_priced_at_its_queries(tmp_path: Path) -> None:
    """The handbook takes int(rows x weight) of each entry's split and concatenates them (src/alignment/data.py):
    where the catalog counts every split, the mixture's queries are the job's; the first dataset gives the lengths."""
    two = "  datasets:\n    - id: openai/gsm8k\n      split: train\n      weight: 0.5\n"
    two += "    - id: openai/gsm8k\n      split: test\n"
    text = HANDBOOK_SFT.replace(
        HANDBOOK_SFT[HANDBOOK_SFT.index("  datasets:") : HANDBOOK_SFT.index("  test_split")], two
    )
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "mix.yaml", text)
    rows = {name: get_dataset_facts(name).num_queries for name in ("gsm8k-train", "gsm8k")}
    assert job.options["mixture_queries"] == int(rows["gsm8k-train"] * 0.5) + rows["gsm8k"]
    assert job.options["dataset"] == "gsm8k-train" and "dataset_split" not in job.options
    assert _said(job, "dataset_mixture: 5055 queries per epoch", "x 0.5 +", "the first's lengths stand for all")
    one = text.replace("    - id: openai/gsm8k\n      split: test\n", "")
    assert (
        _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "one.yaml", one).options["mixture_queries"] == rows["gsm8k-train"] // 2
    )
    with pytest.raises(TunecostError, match=r"bad\.yaml: dataset_mixture: datasets: weight of openai/gsm8k must be"):
        _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "bad.yaml", text.replace("weight: 0.5", "weight: 2"))


def test_trls_test_split_size_holds_out_part_of_its_datasets(tmp_path: Path) -> None:
    """DatasetMixtureConfig.test_split_size (top level beside `datasets`): train_test_split of the mixture."""
    text = "model_name_or_path: Qwen/Qwen2.5-0.5B\ndatasets:\n  - path: tatsu-lab/alpaca\ntest_split_size: 0.05\n"
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "mix.yaml", text)
    assert job.options["eval_split"] == 0.05 and "test_split_size" not in job.not_modelled


def test_trl_datasets_win_over_dataset_name(tmp_path: Path) -> None:
    """trl/scripts/sft.py loads `datasets` and ignores dataset_name beside it."""
    text = TRL_QLORA_YAML + "datasets:\n  - path: HuggingFaceH4/ultrachat_200k\n"
    assert _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "sft.yaml", text).options["dataset"] == "ultrachat-200k"


@pytest.mark.parametrize(("optim", "fused"), [(None, True), ("adamw_torch_fused", True), ("adamw_torch", None)])
def test_the_trainers_fused_adamw_is_read(tmp_path: Path, optim, fused) -> None:
    """transformers' default optim (torch >= 2.8) is adamw_torch_fused: torch's AdamW with fused=True."""
    text = TRL_QLORA_YAML.replace("optim: adamw_torch_fused\n", "") + (f"optim: {optim}\n" if optim else "")
    assert _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "sft.yaml", text).options.get("fused_adamw") is fused


def test_fused_adamw_is_the_behaviours_adamw() -> None:
    from tunecost.cli.common import stack_behaviour
    from tunecost.simulate.behaviour import ADAMW_FUSED

    assert stack_behaviour("hf-peft", fused_adamw=True).adamw_impl == ADAMW_FUSED
    assert stack_behaviour("hf-peft").adamw_impl != ADAMW_FUSED


@pytest.mark.parametrize(("extra", "dtype"), [("", "fp32"), ("dtype: bfloat16\n", "bf16"), ("dtype: auto\n", "bf16")])
def test_trl_without_autocast_trains_in_its_load_dtype(tmp_path: Path, extra: str, dtype: str) -> None:
    assert "bf16" not in TRL_QLORA_YAML
    job = _read(FRAMEWORK_TRAINING_ARGS, tmp_path, "sft.yaml", TRL_QLORA_YAML + "bf16: false\nfp16: false\n" + extra)
    assert job.options["dtype"] == dtype and _said(job, f"dtype {dtype} (bf16, fp16 off)", "no autocast")
