"""axolotl YAML read as a tunecost job (configs written as its examples/*/lora.yml, qlora.yml, fft show them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunecost.errors import TunecostError
from tunecost.workload.frameworks import ConfigFile, ConfigJob, parse_config_file
from tunecost.workload.frameworks.axolotl import FRAMEWORK

LORA = """\
base_model: NousResearch/Llama-3.2-1B

datasets:
  - path: data/alpaca_sample.jsonl
    type: alpaca
val_set_size: 0.1
output_dir: ./outputs/lora-out

adapter: lora
lora_model_dir:

sequence_len: 2048
sample_packing: true
eval_sample_packing: true

lora_r: 16
lora_alpha: 32
lora_dropout: 0.05
lora_target_modules:
  - gate_proj
  - down_proj
  - up_proj
  - q_proj
  - v_proj
  - k_proj
  - o_proj

wandb_project:
gradient_accumulation_steps: 2
micro_batch_size: 2
num_epochs: 1
optimizer: adamw_8bit
lr_scheduler: cosine
learning_rate: 0.0002

bf16: auto
tf32: false

gradient_checkpointing: true
logging_steps: 1
attn_implementation: flash_attention_2
"""

QLORA_FSDP = """\
base_model: casperhansen/llama-3-70b-fp16
load_in_8bit: false
load_in_4bit: true

datasets:
  - path: tatsu-lab/alpaca
    type: alpaca
dataset_prepared_path: last_run_prepared
output_dir: ./outputs/out/qlora-llama3-70b

adapter: qlora
sequence_len: "512"
sample_packing: false
pad_to_sequence_len: true

lora_r: 8
lora_alpha: 16
lora_dropout: 0.05
lora_target_linear: true

gradient_accumulation_steps: 4
micro_batch_size: 1
num_epochs: 4
optimizer: adamw_torch_fused
learning_rate: 0.00001

bf16: true
gradient_checkpointing: true
gradient_checkpointing_kwargs:
  use_reentrant: false
flash_attention: true

fsdp:
  - full_shard
  - auto_wrap
fsdp_config:
  fsdp_limit_all_gathers: true
  fsdp_offload_params: true
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
"""

FFT = """\
base_model: NousResearch/Meta-Llama-3.1-8B

datasets:
  - path: tatsu-lab/alpaca
    type: alpaca
  - path: ./extra.parquet
    type: alpaca
output_dir: ./outputs/out

sequence_len: 8192
micro_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 2e-5

bf16: false
fp16: true
deepspeed: deepspeed_configs/zero3_bf16.json
fsdp_version: 2
weight_decay: 0.0
special_tokens:
  pad_token: <|end_of_text|>
"""

# other frameworks' configs, as plain dicts of their keys
LLAMAFACTORY = {"model_name_or_path": "Qwen/Qwen3-4B", "stage": "sft", "finetuning_type": "lora", "lora_rank": 8,
                "lora_target": "all", "dataset": "alpaca_en_demo", "cutoff_len": 2048}  # fmt: skip
TORCHTUNE = {"model": {"_component_": "torchtune.models.llama3_1.lora_llama3_1_8b", "lora_rank": 8},
             "dataset": {"_component_": "torchtune.datasets.alpaca_dataset"}, "batch_size": 2, "epochs": 1}  # fmt: skip
HF_TRAINING_ARGS = {"output_dir": "out", "per_device_train_batch_size": 4, "num_train_epochs": 1, "bf16": True}
PEFT_ADAPTER = {"base_model_name_or_path": "m", "peft_type": "LORA", "r": 16, "target_modules": ["q_proj"]}


def _read(tmp_path: Path, text: str, name: str = "config.yml") -> ConfigJob:
    path = tmp_path / name
    path.write_text(text)
    data = parse_config_file(path)
    assert FRAMEWORK.detect(data)
    return FRAMEWORK.read(ConfigFile(path=str(path), data=data))


def _defaulted(job: ConfigJob, option: str) -> bool:
    """Whether an assumption names `option` as axolotl's default."""
    return any(line.startswith(option) and "axolotl's default" in line for line in job.assumptions)


def test_lora(tmp_path):
    job = _read(tmp_path, LORA)
    assert job.framework == "axolotl"
    assert job.options == {
        "model": "NousResearch/Llama-3.2-1B",
        "method": "lora",
        "lora_rank": 16,
        "lora_alpha": 32,
        "lora_dropout": 0.05,
        "lora_targets": "attention,mlp",
        "dtype": "bf16",
        "attention": "flash",
        "gradient_checkpointing": True,
        "reentrant": True,  # axolotl's default with checkpointing and no kwargs
        "packing": "per-document",  # sample_packing: multipack rows, attention per example
        "optimizer": "adamw-8bit",
        "seq_len": 2048,
        "batch_size": 2,
        "grad_accum": 2,
        "epochs": 1,
        "dataset": "data/alpaca_sample.jsonl",
        "eval_split": 0.1,  # val_set_size: a tenth of the data set aside for evaluation
        "stack": "hf-peft",
    }
    assert _defaulted(job, "dtype bf16") and _defaulted(job, "reentrant on")
    assert not any("whole" in line for line in job.assumptions)  # all seven projections listed
    assert any(line.startswith("packing per-document: sample_packing") for line in job.assumptions)
    assert {"tf32", "learning_rate"} <= set(job.not_modelled) and "gradient_accumulation_steps" not in job.not_modelled
    assert "sample_packing" not in job.not_modelled
    assert job.options["lora_dropout"] == 0.05 and "lora_dropout" not in job.not_modelled


def test_a_hub_dataset_is_the_jobs_data_where_the_local_cache_holds_it(tmp_path, hub_cache):
    text = LORA.replace("data/alpaca_sample.jsonl", "mhenrichsen/alpaca_2k_test")
    job = _read(tmp_path, text)
    assert "dataset" not in job.options
    assert any("`hf download mhenrichsen/alpaca_2k_test --repo-type dataset`" in a for a in job.assumptions)
    hub_cache("mhenrichsen/alpaca_2k_test", [{"instruction": "Hi", "input": "", "output": "Hello"}])
    assert _read(tmp_path, text).options["dataset"] == "mhenrichsen/alpaca_2k_test"


def test_qlora_fsdp(tmp_path):
    job = _read(tmp_path, QLORA_FSDP)
    opts = job.options
    assert (opts["method"], opts["quant_type"], opts["double_quant"]) == ("qlora", "nf4", True)
    assert _defaulted(job, "quant_type nf4") and _defaulted(job, "double_quant on")
    assert (opts["lora_rank"], opts["lora_alpha"], opts["lora_targets"]) == (8, 16, "attention,mlp")
    assert (opts["seq_len"], opts["epochs"], opts["optimizer"]) == (512, 4, "adamw")  # "512" read as a number
    assert (opts["attention"], opts["reentrant"], opts["dtype"]) == ("flash", False, "bf16")
    assert (opts["strategy"], opts["offload"]) == ("fsdp1", "params")
    assert _defaulted(job, "fsdp_version 1")
    assert opts["dataset"] == "alpaca"  # tatsu-lab/alpaca: the catalog's (its queries; lengths where it has them)
    assert not any(line.startswith("datasets[0].path tatsu-lab/alpaca") for line in job.assumptions)
    assert "pad_to_sequence_len" in job.not_modelled and "dataset_prepared_path" in job.not_modelled


def test_datasets_the_catalog_counts_are_concatenated(tmp_path):
    """merge_datasets (utils/data/shared.py) concatenates the entries: their queries where the catalog counts each."""
    from tunecost.catalog.datasets import get_dataset_facts

    two = "  - path: openai/gsm8k\n    type: alpaca\n  - path: openai/gsm8k\n    split: test\n    type: alpaca\n"
    old = "  - path: tatsu-lab/alpaca\n    type: alpaca\n  - path: ./extra.parquet\n    type: alpaca\n"
    assert old in FFT
    job = _read(tmp_path, FFT.replace(old, two), "fft.yaml")
    rows = get_dataset_facts("gsm8k-train").num_queries + get_dataset_facts("gsm8k").num_queries
    assert (job.options["dataset"], job.options["mixture_queries"]) == ("gsm8k-train", rows)
    assert any(a.startswith(f"datasets: {rows} queries per epoch (7473 of openai/gsm8k + ") for a in job.assumptions)


def test_full_fine_tune(tmp_path):
    job = _read(tmp_path, FFT, "fft.yaml")
    opts = job.options
    assert opts["method"] == "full" and _defaulted(job, "method full")
    assert not any(k.startswith(("lora", "quant")) for k in opts)
    assert (opts["dtype"], opts["gradient_checkpointing"], opts["attention"]) == ("fp16", False, "sdpa")
    for option in ("gradient_checkpointing off", "attention sdpa", "optimizer adamw", "epochs 1.0"):
        assert _defaulted(job, option), option
    assert "deepspeed config deepspeed_configs/zero3_bf16.json: pass it too with --config" in job.assumptions
    said = "datasets: only the first of 2 datasets gives the lengths and the queries"
    assert any(a.startswith(said) for a in job.assumptions)
    assert "strategy" not in opts  # fsdp_version alone enables no FSDP
    assert {"special_tokens", "weight_decay", "fsdp_version"} <= set(job.not_modelled)


def test_bare_lora_defaults(tmp_path):
    job = _read(tmp_path, "base_model: m\nadapter: lora\nbf16: false\n")
    opts = job.options
    assert (opts["seq_len"], opts["batch_size"], opts["epochs"], opts["dtype"]) == (512, 1, 1.0, "fp32")
    for option in ("seq_len 512", "batch_size 1", "epochs 1.0", "optimizer adamw"):
        assert _defaulted(job, option), option
    assert "lora_rank" not in opts and any(line.startswith("lora_r unset") for line in job.assumptions)
    assert any(line.startswith("no lora_target_modules") for line in job.assumptions)


def test_fsdp2_partial_targets_and_offload_checkpointing(tmp_path):
    text = (
        "base_model: mistralai/Mixtral-8x7B-v0.1\nadapter: lora\nlora_r: 16\nlora_alpha: 32\n"
        "lora_target_modules: [q_proj, v_proj, w1, w2, w3, gate]\ngradient_checkpointing: offload\n"
        "fsdp_version: 2\nfsdp_config:\n  reshard_after_forward: true\n"
    )
    job = _read(tmp_path, text)
    assert job.options["lora_targets"] == "experts,router,q_proj,v_proj"  # the listed projections only
    assert not any("whole attention group" in line for line in job.assumptions)
    assert job.options["strategy"] == "fsdp2" and job.options["gradient_checkpointing"] is True


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("adapter: lora\nrl: dpo", "rl"),
        ("load_in_8bit: true", "load_in_8bit"),
        ("adapter: qlora\nload_in_4bit: false", "adapter"),
        ("adapter: llama-adapter", "adapter"),
        ("adapter: lora\npeft_use_dora: true", "peft_use_dora"),
        ("load_in_4bit: true", "load_in_4bit"),
        ("adapter: lora\nlora_r: eight", "lora_r"),
        ("micro_batch_size: two", "micro_batch_size"),
        ("optimizer: lion_8bit", "optimizer"),
        ("attn_implementation: sage", "attn_implementation"),
        ("sage_attention: true", "sage_attention"),
        ("processor_type: AutoProcessor", "processor_type"),
        ("pretraining_dataset: allenai/c4", "pretraining_dataset"),
        ("qat:\n  weight_dtype: nvfp4", "qat"),  # quantization-aware training, as torchtune's quantizer
        ("kd_trainer: true", "kd_trainer"),  # knowledge distillation
        ("unfrozen_parameters:\n  - ^lm_head.weight$", "unfrozen_parameters"),  # a subset of the weights trained
    ],
)
def test_errors_name_file_and_key(tmp_path, text, key):
    path = tmp_path / "bad.yml"
    path.write_text(f"base_model: NousResearch/Llama-3.2-1B\nsequence_len: 1024\n{text}\n")
    data = parse_config_file(path)
    with pytest.raises(TunecostError) as err:
        FRAMEWORK.read(ConfigFile(path=str(path), data=data))
    assert str(path) in str(err.value) and f": {key}:" in str(err.value)


@pytest.mark.parametrize(
    "text", ["attn_implementation: xformers", "xformers_attention: true", "attn_implementation: flex_attention"]
)
def test_xformers_and_flex_attention_are_read_as_flash_with_a_note(tmp_path, text):
    """xformers (axolotl registers it with FA2's masks) and flex attention keep the output and log-sum-exp for
    backward, as FlashAttention-2 does (11 of axolotl's examples at 067b021c name one)."""
    job = _read(tmp_path, LORA.replace("attn_implementation: flash_attention_2\n", f"{text}\n"))
    assert job.options["attention"] == "flash"
    assert any(line.startswith("attention flash:") and text.split(":")[0] in line for line in job.assumptions)


def test_debug_is_a_key_axolotl_reads(tmp_path):
    """`debug: true` (four shipped examples) is read by axolotl's code outside its schema: not a typo."""
    job = _read(tmp_path, LORA + "debug: true\n")
    assert "debug" in job.not_modelled


def test_rl_error_says_what_tunecost_estimates(tmp_path):
    path = tmp_path / "dpo.yml"
    path.write_text("base_model: m\nadapter: lora\nrl: dpo\nmicro_batch_size: 1\n")
    with pytest.raises(TunecostError, match="supervised fine-tuning"):
        FRAMEWORK.read(ConfigFile(path=str(path), data=parse_config_file(path)))


@pytest.mark.parametrize("data", [LLAMAFACTORY, TORCHTUNE, HF_TRAINING_ARGS, PEFT_ADAPTER])
def test_detect_is_false_for_other_frameworks(data):
    assert not FRAMEWORK.detect(data)


def test_context_and_tensor_parallel_sizes(tmp_path):
    """examples/alst: context_parallel_size 8 splits each 500k-token row over 8 ranks; tensor_parallel_size is
    transformers' tp_plan (AutoTP under DeepSpeed), which shards no norm: no sequence parallelism."""
    job = _read(tmp_path, QLORA_FSDP + "context_parallel_size: 8\ntensor_parallel_size: 2\n")
    assert (job.options["cp"], job.options["tp"], job.options["sequence_parallel"]) == (8, 2, False)
    assert any(line.startswith("cp 8: context_parallel_size") for line in job.assumptions)
    old = _read(tmp_path, QLORA_FSDP + "sequence_parallel_degree: 4\n", name="old.yml")
    assert old.options["cp"] == 4 and "tp" not in old.options


def test_8bit_lora_reads_as_int8_base_weights(tmp_path):
    """axolotl's lora.yml examples: adapter lora with load_in_8bit, bitsandbytes LLM.int8 under the adapters."""
    job = _read(tmp_path, "base_model: NousResearch/Llama-2-7b-hf\nadapter: lora\nload_in_8bit: true\nlora_r: 32\n")
    assert (job.options["method"], job.options["quant_type"], job.options["lora_rank"]) == ("qlora", "int8", 32)
    assert any("load_in_8bit with adapter lora: LLM.int8" in line for line in job.assumptions)


def test_keys_axolotl_drops_are_dropped_with_a_note(tmp_path):
    """axolotl's pydantic schema ignores keys it lacks (its own examples carry eta_min, adam_eps, test_value): the
    run goes ahead without them, and a misspelt key leaves its default, as it does in axolotl."""
    job = _read(tmp_path, LORA + "eta_min: 0.000001\nmicro_batch_sise: 8\n")
    assert any(line.startswith("eta_min: not a key of axolotl's config") for line in job.assumptions)
    sise = [line for line in job.assumptions if line.startswith("micro_batch_sise:")]
    assert sise and "did you mean micro_batch_size?" in sise[0] and "ignored" in sise[0]
    assert job.options.get("batch_size") != 8 and "eta_min" not in job.not_modelled


def test_torchao_4bit_adamw(tmp_path):
    """optimizer adamw_torch_4bit (ten of axolotl's examples): torchao's AdamW4bit."""
    text = LORA.replace("optimizer: adamw_8bit", "optimizer: adamw_torch_4bit")
    assert text != LORA and _read(tmp_path, text).options["optimizer"] == "adamw-4bit"


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [
        ("bf16: false\nfp16: false\nfloat16: true", "fp16"),
        ("bf16: false\nbfloat16: true", "bf16"),
        ("fp16: true", "fp16"),
    ],
)
def test_half_weights_without_amp_set_the_dtype(tmp_path, precision: str, dtype: str) -> None:
    """resolve_dtype: bfloat16 / float16 load the weights in that dtype (examples/llama-2/gptq-lora.yml)."""
    job = _read(tmp_path, f"base_model: m\nadapter: lora\n{precision}\n")
    assert job.options["dtype"] == dtype
    assert not {"float16", "bfloat16"} & set(job.not_modelled)


@pytest.mark.parametrize(("value", "said"), [("true", "torch_compile:"), ("auto", "torch_compile auto: on")])
def test_torch_compile_is_read(tmp_path, value, said):
    job = _read(tmp_path, f"base_model: m\nadapter: lora\ntorch_compile: {value}\n")
    assert job.options["torch_compile"] is True and "torch_compile" not in job.not_modelled
    assert any(line.startswith(said) and "peak memory is the eager step's" in line for line in job.assumptions)
    assert "torch_compile" not in _read(tmp_path, "base_model: m\nadapter: lora\ntorch_compile: false\n").options


LIGER = "plugins:\n  - axolotl.integrations.liger.LigerPlugin\n"
LIGER_ON = (
    "liger_rope: true\nliger_rms_norm: true\nliger_glu_activation: true\nliger_fused_linear_cross_entropy: true\n"
)


def test_the_liger_plugin_with_its_default_kernels_is_read(tmp_path):
    job = _read(tmp_path, f"base_model: m\nadapter: lora\n{LIGER}{LIGER_ON}")
    assert job.options["liger_kernel"] is True
    assert not {k for k in job.not_modelled if k.startswith("liger_")}
    assert any(line.startswith("Liger plugin:") for line in job.assumptions)


@pytest.mark.parametrize("change", ["liger_fused_linear_cross_entropy: false\n", "liger_cross_entropy: true\n"])
def test_another_liger_kernel_set_is_counted_without_liger(tmp_path, change):
    text = f"base_model: m\nadapter: lora\n{LIGER}{LIGER_ON}".replace("liger_fused_linear_cross_entropy: true\n", "")
    job = _read(tmp_path, text + change)
    assert "liger_kernel" not in job.options
    assert any("only Liger's default kernels are modelled" in line for line in job.assumptions)
    assert "liger_rms_norm" in job.not_modelled
    assert "liger_kernel" not in _read(tmp_path, f"base_model: m\nadapter: lora\n{LIGER_ON}").options  # no plugin


def test_fp8_is_torchaos_tensorwise_float8(tmp_path):
    """`fp8: true` (examples/llama-3/3b-fp8-fsdp2.yaml): accelerate with AORecipeKwargs(Float8LinearConfig()),
    torchao's default tensorwise scaling (core/trainers/base.py)."""
    job = _read(tmp_path, LORA + "fp8: true\n")
    assert (job.options["fp8"], job.options["dtype"]) == ("tensorwise", "bf16")
    assert any(line.startswith("fp8 tensorwise: axolotl's torchao Float8Linear") for line in job.assumptions)
    assert "fp8" not in _read(tmp_path, LORA + "fp8: false\n").options


def test_batch_size_without_accumulation_sets_it(tmp_path):
    """utils/config normalize_config: gradient_accumulation_steps = batch_size // micro_batch_size when unset."""
    base = "base_model: meta-llama/Llama-3.1-8B\nmicro_batch_size: 2\n"
    assert _read(tmp_path, base + "batch_size: 16\n").options["grad_accum"] == 8
    stated = _read(tmp_path, base + "batch_size: 16\ngradient_accumulation_steps: 2\n").options
    assert stated["grad_accum"] == 2  # the stated accumulation wins
    with pytest.raises(TunecostError, match="batch_size: 1 is less than micro_batch_size 2"):
        _read(tmp_path, base + "batch_size: 1\n")


def test_nd_parallel_data_parallel_sizes(tmp_path):
    """examples/distributed-parallel: dp_shard_size x dp_replicate_size x tp fixes the GPUs; FSDP's shard groups
    replicated over the rest are HSDP's (a shard group per node); dp_shard_size alone is one shard group (axolotl
    replicates only over GPUs beyond it, utils/distributed.py _get_parallel_config_kwargs)."""
    fsdp2 = "base_model: meta-llama/Llama-3.1-8B\nmicro_batch_size: 1\nfsdp_version: 2\n"
    fsdp2 += "fsdp_config:\n  offload_params: false\n"
    both = _read(tmp_path, fsdp2 + "dp_shard_size: 4\ndp_replicate_size: 2\ntensor_parallel_size: 2\n")
    o = both.options
    assert (o["num_gpus"], o["strategy"], o["gpus_per_node"], o["tp"]) == (16, "hsdp", 8, 2)
    shard = _read(tmp_path, fsdp2 + "dp_shard_size: 2\ncontext_parallel_size: 2\ntensor_parallel_size: 2\n")
    assert (shard.options["strategy"], shard.options["num_gpus"]) == ("fsdp2", 8)
    assert "gpus_per_node" not in shard.options
    ddp = _read(tmp_path, fsdp2 + "dp_shard_size: 1\ndp_replicate_size: 8\n").options  # replicas of one GPU
    assert (ddp["strategy"], ddp["num_gpus"], "gpus_per_node" in ddp) == ("ddp", 8, False)
    assert _read(tmp_path, fsdp2 + "dp_shard_size: 8\ndp_replicate_size: 1\n").options["strategy"] == "fsdp2"
    deepspeed = _read(tmp_path, "base_model: m\nmicro_batch_size: 1\ndp_shard_size: 2\ndp_replicate_size: 2\n")
    assert "strategy" not in deepspeed.options and deepspeed.options["num_gpus"] == 4


@pytest.mark.parametrize(
    ("extra", "layout"),
    [
        ("expert_parallel_size: 4\n", (4, "ddp", 4)),  # examples/expert_parallel/qwen3_30ba3b_ep_fft_4gpu.yaml
        ("expert_parallel_size: 2\ndp_shard_size: 2\nfsdp_version: 2\nfsdp_config:\n  reshard_after_forward: true\n",
         (4, "fsdp2", 2)),  # qwen3_30ba3b_ep_fsdp_fft_4gpu.yaml: experts over ep, the rest sharded over all four
    ],
)  # fmt: skip
def test_expert_parallel_sets_the_gpus_and_the_experts_split(tmp_path, extra, layout):
    """The EP plugin's GPUs are expert_parallel_size x dp_shard_size (x cp); alone it replicates the rest (DDP)."""
    plugin = "plugins:\n  - axolotl.integrations.expert_parallel.ExpertParallelPlugin\n"
    base = "base_model: Qwen/Qwen3-30B-A3B\nmicro_batch_size: 1\n" + plugin
    o = _read(tmp_path, base + extra).options
    assert (o["num_gpus"], o["strategy"], o["expert_parallel"]) == layout and "gpus_per_node" not in o


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ("tensor_parallel_size: 2\n", "expert_parallel_size: 2 beside tensor_parallel_size"),
        ("dp_shard_size: 2\nfsdp_config:\n  offload_params: false\n", "expert_parallel_size: 2 under fsdp1"),
        ("context_parallel_size: 2\n", "experts spread over context-parallel ranks are not modelled"),
        ("dp_shard_size: 2\n", "expert_parallel_size: 2 under ddp with dp_shard_size 2"),
    ],
)
def test_expert_parallel_layouts_the_plugin_does_not_run_are_one_error(tmp_path, extra, said):
    with pytest.raises(TunecostError, match=said):
        _read(tmp_path, "base_model: Qwen/Qwen3-30B-A3B\nmicro_batch_size: 1\nexpert_parallel_size: 2\n" + extra)
