"""LLaMA-Factory training YAML read as a tunecost job (configs written as its examples/train_* folders show them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunecost.errors import TunecostError
from tunecost.workload.frameworks import ConfigFile, ConfigJob, parse_config_file
from tunecost.workload.frameworks.hf_common import peft_targets
from tunecost.workload.frameworks.llamafactory import FRAMEWORK
from tunecost.workload.job import targets_text

LORA_SFT = """\
### model
model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct
trust_remote_code: true

### method
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 16
lora_target: all

### dataset
dataset: identity,alpaca_en_demo
template: llama3
cutoff_len: 1024
max_samples: 1000
preprocessing_num_workers: 16

### output
output_dir: saves/llama3-8b/lora/sft
logging_steps: 10
report_to: none

### train
per_device_train_batch_size: 2
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
bf16: true
"""

QLORA_MIXTRAL = """\
model_name_or_path: mistralai/Mixtral-8x7B-v0.1
quantization_bit: 4
quantization_method: bnb

stage: sft
do_train: true
finetuning_type: lora
lora_rank: "16"
lora_alpha: 32
lora_dropout: 0
lora_target: w1,w2,w3,gate
flash_attn: fa2

dataset: commonsense_15k
template: mistral
cutoff_len: 1024

per_device_train_batch_size: 1
gradient_accumulation_steps: 4
learning_rate: 5e-5
num_train_epochs: 1
optim: paged_adamw_8bit
bf16: true
"""

FULL_DS3 = """\
model_name_or_path: Qwen/Qwen3-4B-Instruct-2507
stage: sft
do_train: true
finetuning_type: full
deepspeed: examples/deepspeed/ds_z3_config.json

dataset: alpaca_en_demo
template: qwen3_nothink
cutoff_len: 2048
packing: true

output_dir: saves/qwen3-4b/full/sft
per_device_train_batch_size: 1
gradient_accumulation_steps: 2
num_train_epochs: 3.0
fp16: true
disable_gradient_checkpointing: true
"""

# other frameworks' configs, as plain dicts of their keys
AXOLOTL = {"base_model": "NousResearch/Llama-3.2-1B", "adapter": "lora", "lora_r": 16, "sequence_len": 2048,
           "micro_batch_size": 2, "datasets": [{"path": "teknium/GPT4-LLM-Cleaned", "type": "alpaca"}]}  # fmt: skip
TORCHTUNE = {"model": {"_component_": "torchtune.models.llama3_1.lora_llama3_1_8b", "lora_rank": 8},
             "tokenizer": {"_component_": "torchtune.models.llama3.llama3_tokenizer"}, "batch_size": 2}  # fmt: skip
HF_TRAINING_ARGS = {"output_dir": "out", "per_device_train_batch_size": 4, "bf16": True, "optim": "adamw_torch"}
PEFT_ADAPTER = {"peft_type": "LORA", "r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj"]}


def _read(tmp_path: Path, text: str, name: str = "train.yaml") -> ConfigJob:
    path = tmp_path / name
    path.write_text(text)
    data = parse_config_file(path)
    assert FRAMEWORK.detect(data)
    return FRAMEWORK.read(ConfigFile(path=str(path), data=data))


def _defaulted(job: ConfigJob, option: str) -> bool:
    """Whether an assumption names `option` as LLaMA-Factory's default."""
    return any(line.startswith(option) and "LLaMA-Factory's default" in line for line in job.assumptions)


def test_lora_sft(tmp_path):
    job = _read(tmp_path, LORA_SFT)
    assert job.framework == "llamafactory"
    assert job.options == {
        "model": "meta-llama/Meta-Llama-3-8B-Instruct",
        "method": "lora",
        "lora_rank": 16,
        "lora_alpha": 32,  # lora_rank * 2
        "lora_dropout": 0.0,  # LLaMA-Factory's default
        "lora_targets": "attention,mlp",
        "dtype": "bf16",
        "attention": "sdpa",
        "gradient_checkpointing": True,
        "reentrant": True,
        "optimizer": "adamw",
        "fused_adamw": True,
        "seq_len": 1024,
        "batch_size": 2,
        "grad_accum": 8,
        "epochs": 3.0,
        "max_queries": 2000,  # max_samples 1000 of each of the two datasets (LLaMA-Factory's data/loader.py)
        "max_queries_per_dataset": 1000,
        "stack": "hf-peft",
    }
    assert any(line.startswith("max_samples 1000: each of the 2 dataset(s) cut") for line in job.assumptions)
    for option in ("lora_alpha 32", "attention sdpa", "gradient_checkpointing on", "reentrant on", "optimizer adamw"):
        assert _defaulted(job, option), option
    assert any("every nn.Linear, read as attention,mlp" in line for line in job.assumptions)  # all
    assert any(line.startswith("dataset identity: a LLaMA-Factory dataset name") for line in job.assumptions)
    assert "dataset" not in job.options
    assert {"template", "learning_rate"} <= set(
        job.not_modelled
    ) and "gradient_accumulation_steps" not in job.not_modelled
    assert "max_samples" not in job.not_modelled
    assert "lora_rank" not in job.not_modelled and "bf16" not in job.not_modelled


def test_ray_workers_are_the_runs_gpus(tmp_path):
    """examples/train_lora/qwen3_lora_sft_ray.yaml: ray_num_workers is the GPUs of a Ray run, one per worker."""
    job = _read(tmp_path, LORA_SFT + "ray_num_workers: 4\n")
    assert job.options["num_gpus"] == 4 and "ray_num_workers" not in job.not_modelled
    assert any(a.startswith("num_gpus 4: ray_num_workers, one GPU per Ray worker") for a in job.assumptions)
    assert "num_gpus" not in _read(tmp_path, LORA_SFT + "ray_num_workers: 1\n").options


def test_qlora_mixtral_paper_targets(tmp_path):
    job = _read(tmp_path, QLORA_MIXTRAL, "mixtral.yml")
    opts = job.options
    assert (opts["method"], opts["quant_type"], opts["double_quant"]) == ("qlora", "nf4", True)
    assert (opts["lora_rank"], opts["lora_alpha"]) == (16, 32)  # "16" as a string is accepted
    assert opts["lora_targets"] == "experts,router"
    assert (opts["attention"], opts["optimizer"], opts["epochs"]) == ("flash", "adamw-8bit", 1)
    assert opts["dataset"] == "commonsense_15k"  # a tunecost catalog name
    assert _defaulted(job, "quant_type nf4") and _defaulted(job, "double_quant on")
    assert not _defaulted(job, "quantization_method")
    assert any("w1/w2/w3: read as MoE experts" in line for line in job.assumptions)
    assert opts["lora_dropout"] == 0 and "lora_dropout" not in job.not_modelled


def test_full_deepspeed_fp16(tmp_path):
    job = _read(tmp_path, FULL_DS3)
    opts = job.options
    assert opts["method"] == "full"
    assert not any(k.startswith(("lora", "quant")) for k in opts)
    assert (opts["dtype"], opts["gradient_checkpointing"]) == ("fp16", False)
    assert "reentrant" not in opts and "strategy" not in opts
    assert "deepspeed config examples/deepspeed/ds_z3_config.json: pass it too with --config" in job.assumptions
    assert opts["packing"] == "cross-document"  # packing without neat_packing: one causal mask over the row
    assert any(line.startswith("packing cross-document") for line in job.assumptions)
    assert "packing" not in job.not_modelled
    assert _defaulted(job, "attention sdpa") and _defaulted(job, "optimizer adamw")


def test_defaults_of_a_bare_config(tmp_path):
    job = _read(tmp_path, "model_name_or_path: Qwen/Qwen2.5-7B\ncutoff_len: 512\n")
    opts = job.options
    assert (opts["method"], opts["lora_rank"], opts["lora_alpha"]) == ("lora", 8, 16)
    assert (opts["batch_size"], opts["epochs"], opts["dtype"]) == (8, 3.0, "bf16")
    for option in ("stage sft", "method lora", "lora_rank 8", "lora_alpha 16", "lora_target all", "batch_size 8",
                   "epochs 3.0", "dtype bf16"):  # fmt: skip
        assert _defaulted(job, option), option
    assert any(line.startswith("do_train unset") for line in job.assumptions)
    # examples/extras/nlg_eval/llama3_lora_predict.yaml: do_predict, no do_train: nothing is trained
    with pytest.raises(TunecostError, match="do_predict: true without do_train: an evaluation or prediction run"):
        _read(tmp_path, "model_name_or_path: Qwen/Qwen2.5-7B\ncutoff_len: 512\ndo_predict: true\n")


def test_partial_target_list_and_inline_deepspeed(tmp_path):
    text = "model_name_or_path: m\nlora_target: q_proj, v_proj\ndeepspeed:\n  zero_optimization:\n    stage: 2\n"
    job = _read(tmp_path, text + "    offload_optimizer:\n      device: cpu\n")
    assert job.options["lora_targets"] == "q_proj,v_proj"  # the listed projections, not the whole group
    assert not any("whole attention group" in line for line in job.assumptions)
    assert (job.options["strategy"], job.options["offload"]) == ("zero2", "optimizer")


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("stage: dpo", "stage"),
        ("stage: pt", "stage"),
        ("stage: kto", "stage"),
        ("finetuning_type: freeze", "finetuning_type"),
        ("finetuning_type: oft", "finetuning_type"),
        ("quantization_bit: 3", "quantization_bit"),
        ("quantization_bit: 8\nfinetuning_type: full", "quantization_bit"),
        ("use_unsloth: true", "use_unsloth"),
        ("use_kt: true", "use_kt"),  # examples/ktransformers: the experts on the CPU
        ("shift_attn: true", "shift_attn"),
        ("mixture_of_depths: convert", "mixture_of_depths"),  # examples/extras/mod
        ("optim: adafactor", "optim"),
        ("flash_attn: xformers", "flash_attn"),
        ("lora_rank: eight", "lora_rank"),
        ("cutoff_len: [1024]", "cutoff_len"),
        ("image_max_pixels: 262144", "image_max_pixels"),
    ],
)
def test_errors_name_file_and_key(tmp_path, line, key):
    path = tmp_path / "bad.yaml"
    path.write_text(f"model_name_or_path: meta-llama/Llama-3.1-8B\n{line}\n")
    data = parse_config_file(path)
    with pytest.raises(TunecostError) as err:
        FRAMEWORK.read(ConfigFile(path=str(path), data=data))
    assert str(path) in str(err.value) and f": {key}:" in str(err.value)


def test_stage_error_says_what_tunecost_estimates(tmp_path):
    path = tmp_path / "dpo.yaml"
    path.write_text("model_name_or_path: m\nstage: dpo\nfinetuning_type: lora\n")
    with pytest.raises(TunecostError, match="supervised fine-tuning"):
        FRAMEWORK.read(ConfigFile(path=str(path), data=parse_config_file(path)))


def test_vision_model_is_refused(tmp_path):
    path = tmp_path / "vl.yaml"
    path.write_text("model_name_or_path: Qwen/Qwen3-VL-4B-Instruct\nstage: sft\n")
    with pytest.raises(TunecostError, match="model_name_or_path: a multimodal"):
        FRAMEWORK.read(ConfigFile(path=str(path), data=parse_config_file(path)))


@pytest.mark.parametrize("data", [AXOLOTL, TORCHTUNE, HF_TRAINING_ARGS, PEFT_ADAPTER])
def test_detect_is_false_for_other_frameworks(data):
    assert not FRAMEWORK.detect(data)


@pytest.mark.parametrize(
    ("targets", "model", "groups"),
    [
        (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], "m", "attention,mlp"),
        (["query_key_value", "dense"], "EleutherAI/pythia-1b", "attention"),
        (["w1", "w2", "w3"], "internlm/internlm2-7b", "mlp"),
        (["w1", "w2", "w3"], "mistralai/Mixtral-8x7B-v0.1", "experts"),
        (["model.layers.0.block_sparse_moe.experts.0.w1", "block_sparse_moe.gate"], "m", "experts,router"),
        (["mlp.experts.gate_up_proj", "mlp.gate.weight", "self_attn.q_proj"], "m", "experts,router,q_proj"),
        (["qkv_proj"], "m", "attention"),  # Phi-3's fused q, k, v: the whole group
        (["all-linear"], "m", "attention,mlp"),
        (["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], "microsoft/Phi-3-mini-4k-instruct", "attention,mlp"),
        (["gate_up_proj"], "openai/gpt-oss-20b", "experts"),  # an MoE's fused experts
        (["q_proj", "lm_head"], "m", "q_proj"),  # lm_head left out, with a note
        ([r".*\.(q_proj|v_proj)$"], "m", "q_proj,v_proj"),  # a PEFT pattern: the module paths it matches
        (["model.layers.*.self_attn.[qkv]_proj"], "m", "q_proj,k_proj,v_proj"),
        ([r"model.language_model.layers.[\d]+.(mlp|self_attn).(up|down|gate|q|k|v|o)_proj"], "m", "attention,mlp"),
        ([r".*\.(w1|w2|w3|gate)"], "mistralai/Mixtral-8x7B-v0.1", "experts,router"),
    ],
)
def test_peft_targets(targets, model, groups):
    cfg = ConfigFile(path="lf.yaml", data={})
    assert targets_text(peft_targets(cfg, "lora_target", targets, model)[0]) == groups


def test_peft_targets_without_an_adapted_module_is_an_error():
    with pytest.raises(TunecostError, match="lf.yaml: lora_target: 'lm_head' is not a module tunecost adapts"):
        peft_targets(ConfigFile(path="lf.yaml", data={}), "lora_target", ["lm_head"], "m")


def test_neat_packing_keeps_each_example_apart(tmp_path):
    opts = _read(tmp_path, FULL_DS3.replace("packing: true", "neat_packing: true")).options
    assert opts["packing"] == "per-document"


def test_quantization_bit_8_reads_as_int8_base_weights(tmp_path):
    path = tmp_path / "lora8.yaml"
    path.write_text("model_name_or_path: meta-llama/Llama-3.1-8B\nfinetuning_type: lora\nquantization_bit: 8\n")
    job = FRAMEWORK.read(ConfigFile(path=str(path), data=parse_config_file(path)))
    assert (job.options["method"], job.options["quant_type"]) == ("qlora", "int8")
    assert "double_quant" not in job.options


MEGATRON_FULL = """\
model_name_or_path: Qwen/Qwen3-8B
do_train: true
stage: sft
finetuning_type: full
dataset: alpaca_en_demo
cutoff_len: 4096
output_dir: saves/mca/qwen3_full
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
num_train_epochs: 2
bf16: true
tensor_model_parallel_size: 2
sequence_parallel: true
pipeline_model_parallel_size: 2
recompute_granularity: full
"""


def test_the_megatron_backend_reads_its_layout(tmp_path):
    """examples/megatron: USE_MCA / USE_MEGATRON_BRIDGE keys set TP (Megatron's), stages over the accumulated
    micro-batches, recomputation and the distributed optimizer; the Trainer's checkpointing defaults drop out."""
    job = _read(tmp_path, MEGATRON_FULL)
    assert job.framework == "llamafactory-megatron"
    wanted = {"tp": 2, "pp": 2, "sequence_parallel": True, "tp_impl": "megatron", "micro_batches": 8,
              "gradient_checkpointing": True, "strategy": "zero1", "stack": "tunecost"}  # fmt: skip
    assert {k: job.options[k] for k in wanted} == wanted
    assert "reentrant" not in job.options and not any(a.startswith("gradient_checkpointing") for a in job.assumptions)
    assert "use_distributed_optimizer true: LLaMA-Factory's Megatron backend's default" in " ".join(job.assumptions)
    plain = _read(tmp_path, MEGATRON_FULL.replace("recompute_granularity: full", "use_distributed_optimizer: false"))
    assert (plain.options["gradient_checkpointing"], plain.options["strategy"]) == (False, "ddp")
    assert not any("zero1" in a for a in plain.assumptions)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("sequence_parallel: true", "expert_model_parallel_size: 0", "expert_model_parallel_size: must be at least 1"),
        ("tensor_model_parallel_size: 2", "tensor_model_parallel_size: 3", "tensor_model_parallel_size"),
        ("recompute_granularity: full", "recompute_granularity: block", "recompute_granularity: 'block'"),
        ("recompute_granularity: full", "virtual_pipeline_model_parallel_size: 0", "virtual_pipeline_.*at least 1"),
    ],
)
def test_a_megatron_layout_it_cannot_model_names_the_key(tmp_path, old: str, new: str, message: str) -> None:
    with pytest.raises(TunecostError, match=message):
        _read(tmp_path, MEGATRON_FULL.replace(old, new))


def test_torch_compile_and_a_compile_mode_turn_it_on(tmp_path):
    """LLaMA-Factory passes torch_compile to the HF Trainer, whose TrainingArguments turn it on when a compile
    backend or mode is set."""
    for extra in ("torch_compile: true\n", "torch_compile_mode: max-autotune\n"):
        job = _read(tmp_path, f"model_name_or_path: Qwen/Qwen2.5-7B\ncutoff_len: 512\n{extra}")
        assert job.options["torch_compile"] is True and not job.not_modelled, extra
    assert "torch_compile" not in _read(tmp_path, "model_name_or_path: m\ncutoff_len: 512\n").options


def test_enable_liger_kernel_is_read(tmp_path):
    job = _read(tmp_path, "model_name_or_path: Qwen/Qwen2.5-7B\ncutoff_len: 512\nenable_liger_kernel: true\n")
    assert job.options["liger_kernel"] is True and not job.not_modelled
    assert "liger_kernel" not in _read(tmp_path, "model_name_or_path: m\ncutoff_len: 512\n").options


@pytest.mark.parametrize(
    ("lines", "recipe"),
    [
        ("fp8: true\n", "rowwise"),  # fp8_backend auto: torchao, Float8LinearConfig.from_recipe_name("rowwise")
        ("fp8: true\nfp8_backend: te\n", "te-delayed"),
        ("fp8_enable_fsdp_float8_all_gather: true\n", "rowwise"),  # the parser turns fp8 on for it
    ],
)
def test_fp8_as_llamafactory_builds_it(tmp_path, lines, recipe):
    """train/fp8_utils.py create_fp8_kwargs: torchao rowwise for auto/torchao, Transformer Engine for te."""
    job = _read(tmp_path, LORA_SFT + lines)
    assert (job.options["fp8"], job.options["dtype"]) == (recipe, "bf16")
    assert any(line.startswith(f"fp8 {recipe}:") and "LLaMA-Factory's" in line for line in job.assumptions)
    assert "fp8" not in job.not_modelled


def test_fp8_with_ms_amp_is_an_error(tmp_path):
    with pytest.raises(TunecostError, match=r"train\.yaml: fp8_backend: msamp: tunecost models FP8 with torchao"):
        _read(tmp_path, LORA_SFT + "fp8: true\nfp8_backend: msamp\n")


def test_the_trainers_fsdp_arguments_set_the_strategy(tmp_path):
    """examples/extras/fp8/llama3_fp8_fsdp_sft.yaml: `fsdp: [full_shard, auto_wrap]`, TrainingArguments' own FSDP
    (version 1: the default of the transformers <= 5.8.0 LLaMA-Factory pins)."""
    job = _read(tmp_path, LORA_SFT + "fsdp:\n  - full_shard\n  - auto_wrap\n")
    assert job.options["strategy"] == "fsdp1" and "fsdp" not in job.not_modelled
    offload = _read(tmp_path, LORA_SFT + "fsdp: full_shard offload auto_wrap\nfsdp_config:\n  version: 1\n")
    assert (offload.options["strategy"], offload.options["offload"]) == ("fsdp1", "params")


def test_a_full_fine_tune_keeps_fp32_parameters_under_autocast_unless_pure_bf16(tmp_path):
    """model/adapter.py: a full fine-tune's parameters upcast to fp32 (torch AMP under bf16), unless pure_bf16 or
    under DeepSpeed; without bf16 or fp16 the step itself is fp32, which the note says."""
    text = "model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: full\n"
    amp = _read(tmp_path, text + "bf16: true\n")
    assert amp.options["fp32_params"] is True and amp.options["dtype"] == "bf16"
    assert any(a.startswith("fp32_params: LLaMA-Factory upcasts") for a in amp.assumptions)
    for other in ("bf16: true\npure_bf16: true\n", "bf16: true\ndeepspeed: ds_z0_config.json\n"):
        job = _read(tmp_path, text + other)
        assert "fp32_params" not in job.options and not any("upcasts" in a for a in job.assumptions)
    plain = _read(tmp_path, text)
    assert "fp32_params" not in plain.options
    assert any("without bf16 or fp16, trains them in fp32" in a for a in plain.assumptions)
    assert "fp32_params" not in _read(tmp_path, text.replace("full", "lora") + "bf16: true\n").options


def test_flash_attn_auto_on_gemma2_is_not_sdpa(tmp_path):
    text = "model_name_or_path: google/gemma-2-9b\nstage: sft\nfinetuning_type: lora\n"
    job = _read(tmp_path, text)
    assert job.options["attention"] == "eager" and not any(a.startswith("attention sdpa") for a in job.assumptions)
    assert _read(tmp_path, text + "flash_attn: fa2\n").options["attention"] == "flash"
    assert _read(tmp_path, text.replace("google/gemma-2-9b", "meta-llama/Llama-3.1-8B")).options["attention"] == "sdpa"


def test_lora_target_and_dataset_may_be_yaml_lists(tmp_path):
    text = "model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: lora\n"
    job = _read(tmp_path, text + "lora_target: [q_proj, v_proj]\ndataset: [gsm8k, my_own]\n")
    assert (job.options["lora_targets"], job.options["dataset"]) == ("q_proj,v_proj", "gsm8k")


def test_a_dataset_name_is_its_file_in_dataset_info_under_the_working_directory(tmp_path, monkeypatch):
    """data/parser.py: dataset_dir (default data/) holds dataset_info.json, whose entry names the local file."""
    import json

    data = tmp_path / "data"
    data.mkdir()
    (data / "alpaca_en_demo.json").write_text(json.dumps([{"instruction": "Say hi", "input": "", "output": "Hi"}]))
    (data / "chat.json").write_text("[]")
    info = {
        "alpaca_en_demo": {"file_name": "alpaca_en_demo.json"},
        "chat": {"file_name": "chat.json", "formatting": "sharegpt", "columns": {"messages": "messages"}},
        "hub": {"hf_hub_url": "someone/data", "file_name": "alpaca_en_demo.json"},
        "missing": {"file_name": "missing.json"},
        "gsm8k": {"file_name": "alpaca_en_demo.json"},  # its own gsm8k: not the catalog's
    }
    (data / "dataset_info.json").write_text(json.dumps(info))
    monkeypatch.chdir(tmp_path)
    text = "model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: lora\ndataset: "
    job = _read(tmp_path, text + "alpaca_en_demo\n")
    assert job.options["dataset"] == str(Path("data") / "alpaca_en_demo.json")
    assert any(a.startswith("dataset alpaca_en_demo: data/alpaca_en_demo.json") for a in job.assumptions)
    assert _read(tmp_path, text + "gsm8k\n").options["dataset"] == str(Path("data") / "alpaca_en_demo.json")
    for name in ("chat", "hub", "missing", "unlisted"):  # renamed columns, a hub dataset, no file, no entry
        job = _read(tmp_path, text + f"{name}\n")
        assert "dataset" not in job.options and any("give --dataset FILE" in a for a in job.assumptions), name
    other = tmp_path / "elsewhere"
    other.mkdir()
    (data / "dataset_info.json").rename(other / "dataset_info.json")
    (data / "alpaca_en_demo.json").rename(other / "alpaca_en_demo.json")
    job = _read(tmp_path, text + f"alpaca_en_demo\ndataset_dir: {other}\n")
    assert job.options["dataset"] == str(other / "alpaca_en_demo.json")


def test_several_catalog_datasets_are_concatenated_or_interleaved(tmp_path):
    """merge_dataset concatenates them (mix_strategy concat, the default) or interleaves them, each cut to
    max_samples first: the queries per epoch where the catalog counts each; unknown ones leave one dataset's, said."""
    from tunecost.catalog.datasets import get_dataset_facts

    text = "model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: lora\n"
    rows = get_dataset_facts("gsm8k").num_queries, get_dataset_facts("commonsense_15k").num_queries
    job = _read(tmp_path, text + "dataset: gsm8k,commonsense_15k\nmax_samples: 5000\n")
    assert job.options["mixture_queries"] == min(rows[0], 5000) + min(rows[1], 5000)
    assert any(a.startswith("dataset: 6319 queries per epoch, its 2 datasets concatenated") for a in job.assumptions)
    both = text + "dataset: gsm8k,commonsense_15k\n"
    assert _read(tmp_path, both + "mix_strategy: interleave_under\n").options["mixture_queries"] == 2 * min(rows)
    assert _read(tmp_path, both + "mix_strategy: interleave_over\n").options["mixture_queries"] == 2 * max(rows)
    drawn = _read(tmp_path, both + "mix_strategy: interleave_over\ninterleave_probs: 0.9,0.1\n")
    assert drawn.options["mixture_queries"] == round(rows[1] / 0.1)
    assert any("drawn with interleave_probs 0.9,0.1 until every one" in a for a in drawn.assumptions)
    job = _read(tmp_path, text + "dataset: gsm8k,my_own\n")
    assert "mixture_queries" not in job.options and any("not all in the catalog" in a for a in job.assumptions)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("mix_strategy: interleave\n", "mix_strategy: interleave: one of concat, interleave_under"),
        ("interleave_probs: 0.5,0.5\n", "interleave_probs: only valid with mix_strategy interleave_under"),
        ("mix_strategy: interleave_under\ninterleave_probs: 0.5,0.4\n", "0.5,0.4: 2 probabilities, one per"),
        ("mix_strategy: interleave_under\ninterleave_probs: '1'\n", "1: 2 probabilities"),
        ("mix_strategy: interleave_under\ninterleave_probs: a,b\n", "a,b: numbers separated by commas"),
    ],
)
def test_a_mixture_the_framework_refuses_is_one_error(tmp_path, extra, message):
    text = "model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: lora\n"
    with pytest.raises(TunecostError, match=message):
        _read(tmp_path, text + "dataset: gsm8k,commonsense_15k\n" + extra)


def test_additional_target_and_resize_vocab_train_modules_fully(tmp_path):
    text = "model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: lora\n"
    job = _read(tmp_path, text + "additional_target: embed_tokens,lm_head\n")
    assert job.options["modules_to_save"] == "embed_tokens,lm_head" and "additional_target" not in job.not_modelled
    assert _read(tmp_path, text + "resize_vocab: true\n").options["modules_to_save"] == "embed_tokens,lm_head"


def test_the_megatron_backend_counts_the_embedding_in_the_split_where_told(tmp_path):
    """Qwen3-8B's 36 layers over 5 stages: refused as Megatron Core refuses them, read where the file counts the
    embedding as a layer of the split (account_for_embedding_in_pipeline_split)."""
    five = MEGATRON_FULL.replace("pipeline_model_parallel_size: 2", "pipeline_model_parallel_size: 5")
    with pytest.raises(TunecostError, match="pipeline_model_parallel_size 5 does not divide the model's 36"):
        _read(tmp_path, five)
    job = _read(tmp_path, five + "account_for_embedding_in_pipeline_split: true\n")
    assert job.options["pp"] == 5
    assert any(a.startswith("account_for_embedding_in_pipeline_split: the decoder layers") for a in job.assumptions)
    assert (job.options["first_stage_less_layers"], job.options["last_stage_less_layers"]) == (1, 0)


def test_the_megatron_backend_reads_expert_parallelism(tmp_path) -> None:
    job = _read(tmp_path, MEGATRON_FULL.replace("sequence_parallel: true", "expert_model_parallel_size: 2"))
    assert job.options["expert_parallel"] == 2


def test_several_local_datasets_are_counted_and_read_together(tmp_path, monkeypatch):
    """LLaMA-Factory's examples train on `identity,alpaca_en_demo`, two files of dataset_info.json: each cut to
    max_samples (data/loader.py), concatenated or interleaved (data/data_utils.py); their lengths are read together."""
    import json

    from tunecost.workload.job_data import job_data

    data = tmp_path / "data"
    data.mkdir()
    row = {"instruction": "Say hi", "input": "", "output": "Hi there"}
    (data / "a.json").write_text(json.dumps([row] * 3))
    (data / "b.json").write_text(json.dumps([{**row, "output": "A much longer answer " * 20}]))
    (data / "dataset_info.json").write_text(json.dumps({"a": {"file_name": "a.json"}, "b": {"file_name": "b.json"}}))
    monkeypatch.chdir(tmp_path)
    text = "model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: lora\ndataset: a,b\n"
    job = _read(tmp_path, text + "max_samples: 2\n")
    assert job.options["dataset"] == f"{Path('data') / 'a.json'},{Path('data') / 'b.json'}"
    assert job.options["mixture_queries"] == 3  # 2 of a + 1 of b
    assert _read(tmp_path, text + "mix_strategy: interleave_under\n").options["mixture_queries"] == 2
    both = job_data(job.options["dataset"], model="mixtral-8x7b")
    alone = [job_data(str(data / name), model="mixtral-8x7b") for name in ("a.json", "b.json")]
    assert both.lengths == alone[0].lengths + alone[1].lengths and both.num_queries == 4
    partly = _read(tmp_path, text.replace("a,b", "a,unlisted"))  # one is not a local file: names, as before
    assert "mixture_queries" not in partly.options and partly.options.get("dataset") is None
