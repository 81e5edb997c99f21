"""torchtitan TOML read as a tunecost job (configs written as torchtitan/models/*/train_configs/*.toml show them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunecost.errors import TunecostError
from tunecost.models.catalog import resolve_model
from tunecost.workload.frameworks import ConfigFile, ConfigJob, parse_config_file
from tunecost.workload.frameworks.torchtitan import FLAVORS, FRAMEWORK

LLAMA3_8B = """\
[job]
dump_folder = "./outputs"
description = "Llama 3 8B training"

[metrics]
log_freq = 10

[model]
name = "llama3"
flavor = "8B"
hf_assets_path = "./assets/hf/Llama-3.1-8B"

[optimizer]
name = "AdamW"
lr = 3e-4

[training]
local_batch_size = 1
seq_len = 8192
max_norm = 1.0
steps = 1000
dataset = "c4"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 1
pipeline_parallel_degree = 1
context_parallel_degree = 1

[checkpoint]
enable = false
folder = "checkpoint"

[compile]
enable = false
components = ["model", "loss"]

[activation_checkpoint]
mode = "full"
"""

QWEN3_HSDP = """\
[model]
name = "qwen3"
flavor = "14B"

[training]
local_batch_size = 2
seq_len = 4096
dtype = "bfloat16"
enable_cpu_offload = false

[parallelism]
data_parallel_replicate_degree = 2
data_parallel_shard_degree = 8
fsdp_reshard_after_forward = "always"

[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"

[compile]
enable = true
"""

OLD_DEFAULTS = """\
[model]
name = "llama3"
flavor = "8B_flex"

[training]
batch_size = 4
mixed_precision_param = "float32"

[parallelism]
data_parallel_shard_degree = 4
fsdp_reshard_after_forward = "never"
"""


def _read(tmp_path: Path, text: str) -> ConfigJob:
    path = tmp_path / "config.toml"
    path.write_text(text)
    data = parse_config_file(path)
    assert FRAMEWORK.detect(data)
    return FRAMEWORK.read(ConfigFile(path=str(path), data=data))


def _named(job: ConfigJob, *starts: str) -> None:
    """Each filled default is among the assumptions, named with the framework's title."""
    for start in starts:
        assert any(a.startswith(start) and "torchtitan" in a for a in job.assumptions), (start, job.assumptions)


def test_llama3_8b_fsdp(tmp_path: Path) -> None:
    job = _read(tmp_path, LLAMA3_8B)
    assert job.framework == "torchtitan"
    assert job.options == {
        "method": "full",
        "stack": "tunecost",
        "model": "meta-llama/Llama-3.1-8B",
        "attention": "sdpa",
        "batch_size": 1,
        "seq_len": 8192,
        "dtype": "bf16",
        "optimizer": "adamw",
        "gradient_checkpointing": True,
        "strategy": "fsdp2",
        "max_steps": 1000,
        "fp32_params": True,
    }
    _named(job, "method full", "torchtitan's own model code", "training.dtype float32", "fp32_params", "GPUs")
    assert any("by FSDP's mixed precision" in a for a in job.assumptions)
    _named(job, "training.mixed_precision_param bfloat16", "parallelism.fsdp_reshard_after_forward default")
    assert {"job", "metrics", "checkpoint", "model.hf_assets_path"} <= set(job.not_modelled)


def test_qwen3_hsdp_selective(tmp_path: Path) -> None:
    job = _read(tmp_path, QWEN3_HSDP)
    o = job.options
    assert (o["model"], o["dtype"], o["batch_size"], o["seq_len"]) == ("Qwen/Qwen3-14B", "bf16", 2, 4096)
    assert (o["strategy"], o["num_gpus"], o["gpus_per_node"]) == ("hsdp", 16, 8)
    assert o["gradient_checkpointing"] is True and "offload" not in o
    _named(job, "optimizer AdamW", "dataset c4_test", "compile.enable")
    assert o["torch_compile"] is True
    assert any(a.startswith("activation_checkpoint.mode selective") for a in job.assumptions)
    assert not any("fp32 parameters" in a for a in job.assumptions)  # dtype bfloat16: pure bf16
    loss_only = _read(tmp_path, QWEN3_HSDP + 'components = ["loss"]\n')  # torchtitan compiles the model only if named
    assert "torch_compile" not in loss_only.options
    assert "compile.components ['loss']: the model runs eagerly (not 'model')" in loss_only.assumptions


def test_old_keys_and_defaults(tmp_path: Path) -> None:
    job = _read(tmp_path, OLD_DEFAULTS)
    o = job.options
    assert (o["batch_size"], o["seq_len"], o["dtype"]) == (4, 2048, "fp32")
    assert (o["strategy"], o["num_gpus"]) == ("fsdp2-shard-grad-op", 4)
    _named(job, "seq_len 2048", "gradient_checkpointing on", "training.dtype float32", "attention sdpa")
    assert any("flex attention modelled as SDPA" in a for a in job.assumptions)
    assert "training.batch_size: read as training.local_batch_size, its name today" in job.assumptions
    both = OLD_DEFAULTS.replace("batch_size = 4", "batch_size = 4\nlocal_batch_size = 2")
    with pytest.raises(TunecostError, match=r"training.batch_size: and training.local_batch_size .* both set"):
        _read(tmp_path, both)


def test_a_toml_of_mid_2025_reads_as_todays(tmp_path: Path) -> None:
    """torchtitan 34d815c0's (2025-07-22) names: training.compile, checkpoint.enable_checkpoint, [float8]."""
    today = QWEN3_HSDP.replace('flavor = "14B"', 'flavor = "14B"\nconverters = ["float8"]')
    today += '\n[checkpoint]\nenable = false\n\n[quantize.linear.float8]\nrecipe_name = "rowwise"\n'
    older = today.replace("\n[compile]\nenable = true\n", "").replace("dtype =", "compile = true\ndtype =")
    older = older.replace("enable = false", "enable_checkpoint = false").replace("quantize.linear.float8", "float8")
    for text in (today, older):
        job = _read(tmp_path, text)
        assert (job.options["torch_compile"], job.options["fp8"]) == (True, "rowwise")
    assert [a for a in job.assumptions if "its name today" in a] == [
        "training.compile: read as compile.enable, its name today",
        "checkpoint.enable_checkpoint: read as checkpoint.enable, its name today",
        "float8.recipe_name: read as quantize.linear.float8.recipe_name, its name today",
    ]
    with pytest.raises(TunecostError, match=r"training.compile: and compile.enable .* are both set"):
        _read(tmp_path, QWEN3_HSDP.replace("enable_cpu_offload = false", "compile = true"))


def test_every_flavor_is_a_catalog_model() -> None:
    for flavor, hub_id in FLAVORS.items():
        assert resolve_model(hub_id).hub_id, flavor


def test_deepseek_v3_16b_is_deepseek_v2_lite_with_flex_attention(tmp_path: Path) -> None:
    """models/deepseek_v3/__init__.py "16B": V2-Lite's sizes (dim 2048, 27 layers, one dense, 64 experts of 1408 with 2
    shared, top 6, MLA q_lora_rank 0, kv_lora_rank 512, heads of 128 + 64 and 128), attn_type flex."""
    job = _read(tmp_path, LLAMA3_8B.replace('name = "llama3"', 'name = "deepseek_v3"').replace('"8B"', '"16B"'))
    spec = resolve_model(job.options["model"])
    assert spec.name == "deepseek-v2-lite"
    assert (spec.config["num_hidden_layers"], spec.config["n_routed_experts"], spec.config["kv_lora_rank"]) == (
        27,
        64,
        512,
    )
    assert any("flex attention (block-causal) modelled as SDPA" in a for a in job.assumptions)


@pytest.mark.parametrize(
    ("flavor", "name", "sizes"),
    [("236B", "deepseek-v2", (5120, 60, 1, 160, 6)), ("671B", "deepseek-v3", (7168, 61, 3, 256, 8))],
)
def test_deepseek_v3_236b_and_671b_are_deepseek_v2_and_v3(tmp_path: Path, flavor, name, sizes) -> None:
    """models/deepseek_v3/__init__.py "236B": V2's sizes (dim 5120, 60 layers, 1 dense, 160 experts, top 6), "671B":
    V3's (dim 7168, 61 layers, 3 dense, 256 experts, top 8); both flex attention by default."""
    job = _read(tmp_path, LLAMA3_8B.replace('name = "llama3"', 'name = "deepseek_v3"').replace('"8B"', f'"{flavor}"'))
    spec = resolve_model(job.options["model"])
    keys = ("hidden_size", "num_hidden_layers", "first_k_dense_replace", "n_routed_experts", "num_experts_per_tok")
    assert spec.name == name and tuple(spec.config[k] for k in keys) == sizes
    assert any("flex attention (block-causal) modelled as SDPA" in a for a in job.assumptions)


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("local_batch_size = 1", 'local_batch_size = "one"', "training.local_batch_size"),
        ('flavor = "8B"', 'flavor = "debugmodel"', "model.flavor"),
        ('name = "llama3"', 'name = "flux"', "model.name"),
        ("tensor_parallel_degree = 1", "tensor_parallel_degree = 0", "parallelism.tensor_parallel_degree"),
        ("pipeline_parallel_degree = 1", "pipeline_parallel_degree = 0", "parallelism.pipeline_parallel_degree"),
        ("context_parallel_degree = 1", "context_parallel_degree = -1", "parallelism.context_parallel_degree"),
        ("pipeline_parallel_degree = 1", "expert_parallel_degree = 0", "parallelism.expert_parallel_degree"),
        ('name = "AdamW"', 'name = "Lion"', "optimizer.name"),
        ('mode = "full"', 'mode = "sometimes"', "activation_checkpoint.mode"),
        (
            "data_parallel_replicate_degree = 1",
            "data_parallel_replicate_degree = 0",
            "parallelism.data_parallel_replicate_degree",
        ),
        ("steps = 1000", 'steps = 1000\nenable_cpu_offload = true\ndtype = "float16"', "training.dtype"),
    ],
)
def test_errors_name_file_and_key(tmp_path: Path, old: str, new: str, key: str) -> None:
    assert old in LLAMA3_8B
    with pytest.raises(TunecostError) as err:
        _read(tmp_path, LLAMA3_8B.replace(old, new))
    assert str(tmp_path / "config.toml") in str(err.value) and f": {key}: " in str(err.value)


def test_cpu_offload_needs_full_sharding(tmp_path: Path) -> None:
    job = _read(tmp_path, LLAMA3_8B.replace("steps = 1000", "steps = 1000\nenable_cpu_offload = true"))
    assert job.options["offload"] == "params"
    with pytest.raises(TunecostError, match="training.enable_cpu_offload: "):
        _read(tmp_path, QWEN3_HSDP.replace("enable_cpu_offload = false", "enable_cpu_offload = true"))


def test_detect_is_false_for_other_frameworks() -> None:
    others = [
        {"model_name_or_path": "meta-llama/Llama-3.1-8B", "stage": "sft", "finetuning_type": "full"},  # LLaMA-Factory
        {"base_model": "NousResearch/Llama-3.2-1B", "adapter": "qlora", "load_in_4bit": True},  # axolotl
        {"model": {"_component_": "torchtune.models.llama3_1.llama3_1_8b"}, "batch_size": 2, "epochs": 1},  # torchtune
        {"checkpoint_dir": "checkpoints/meta-llama/Llama-2-7b-hf", "train": {"micro_batch_size": 2}},  # litgpt
        {"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "num_processes": 8},  # accelerate
    ]
    assert not any(FRAMEWORK.detect(d) for d in others)


def test_float8_converter_is_fp8(tmp_path: Path) -> None:
    """model.converters with torchao's float8 linears -> fp8 at quantize.linear.float8.recipe_name, tensorwise
    when unset (torchtitan @ 238fa99: TorchAOFloat8LinearConfig()); the llama3 TOMLs filter the output head."""
    shipped = LLAMA3_8B.replace('hf_assets_path = "./assets/hf/Llama-3.1-8B"', 'converters = ["float8"]')
    job = _read(tmp_path, shipped + '\n[quantize.linear.float8]\nfilter_fqns = ["output"]\n')
    assert job.options["fp8"] == "tensorwise"
    _named(job, "fp8 tensorwise")
    assert not any("output head" in a for a in job.assumptions)
    rowwise = shipped.replace('["float8"]', '["quantize.linear.float8", "quantize.linear.mx"]')
    job = _read(tmp_path, rowwise + '\n[quantize.linear.float8]\nrecipe_name = "rowwise"\n')
    assert job.options["fp8"] == "rowwise"
    assert any(a.startswith("model.converters quantize.linear.mx: not modelled") for a in job.assumptions)
    assert any("output head converted by torchtitan is modelled in bf16" in a for a in job.assumptions)
    hp = rowwise + '\n[quantize.linear.float8]\nrecipe_name = "rowwise_with_gw_hp"\n'
    with pytest.raises(TunecostError, match=r"quantize.linear.float8.recipe_name.*rowwise_with_gw_hp"):
        _read(tmp_path, hp)
    assert "fp8" not in _read(tmp_path, LLAMA3_8B).options


def test_layer_selective_checkpointing_recomputes_every_nth_layer(tmp_path: Path) -> None:
    """selective_ac_option N wraps blocks N, 2N, ... of each stage (torchtitan's `_apply_layer_sac` counter)."""
    every_second = LLAMA3_8B.replace('mode = "full"', 'mode = "selective"\nselective_ac_option = "2"')
    job = _read(tmp_path, every_second)
    assert job.options["gradient_checkpointing"] and job.options["recompute_layers"] == 16  # Llama-3.1-8B: 32
    assert any(a.startswith("activation_checkpoint.selective_ac_option 2: 16 of") for a in job.assumptions)
    default = _read(tmp_path, LLAMA3_8B.replace('mode = "full"', 'mode = "selective"'))
    assert default.options["recompute_layers"] == 16
    _named(default, "activation_checkpoint.selective_ac_option 2")
    for option in ("1", "0"):  # every layer
        text = LLAMA3_8B.replace('mode = "full"', f'mode = "selective"\nselective_ac_option = "{option}"')
        assert "recompute_layers" not in _read(tmp_path, text).options
    none = _read(tmp_path, every_second.replace('"2"', '"64"'))
    assert none.options["gradient_checkpointing"] is False and "recompute_layers" not in none.options
    with pytest.raises(TunecostError, match="selective_ac_option"):
        _read(tmp_path, every_second.replace('"2"', '"half"'))


def test_expert_parallelism_where_the_experts_split_over_data_parallel_ranks(tmp_path: Path) -> None:
    """torchtitan's expert_parallel_degree (expert_tensor_parallel_degree 1 by default): without TP and CP the
    experts split over the FSDP ranks, as --expert-parallel; with TP the experts must split as TP does (etp = tp),
    and EP spread over context-parallel ranks is refused, each error naming its key."""
    ep = LLAMA3_8B.replace("pipeline_parallel_degree = 1", "pipeline_parallel_degree = 1\nexpert_parallel_degree = 2")
    assert _read(tmp_path, ep).options["expert_parallel"] == 2
    with_tp = ep.replace("tensor_parallel_degree = 1", "tensor_parallel_degree = 2")
    with pytest.raises(TunecostError, match="parallelism.expert_parallel_degree: expert tensor parallelism 1 beside"):
        _read(tmp_path, with_tp)
    split = with_tp.replace(
        "expert_parallel_degree = 2", "expert_parallel_degree = 2\nexpert_tensor_parallel_degree = 2"
    )
    assert _read(tmp_path, split).options["expert_parallel"] == 2
    with pytest.raises(TunecostError, match="expert_parallel_degree: 2 beside context parallelism 2"):
        _read(tmp_path, ep.replace("context_parallel_degree = 1", "context_parallel_degree = 2"))
