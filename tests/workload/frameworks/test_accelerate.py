"""accelerate's config YAML and DeepSpeed JSON configs read as tunecost jobs (written as `accelerate config` saves
them and as the transformers DeepSpeed docs show them, "auto" values included)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tunecost.errors import TunecostError
from tunecost.workload.frameworks import ConfigFile, ConfigJob, parse_config_file
from tunecost.workload.frameworks.accelerate import FRAMEWORK_ACCELERATE, FRAMEWORK_DEEPSPEED, FRAMEWORKS
from tunecost.workload.frameworks.adapters import FRAMEWORKS as ADAPTER_FRAMEWORKS
from tunecost.workload.frameworks.hf import FRAMEWORKS as HF_FRAMEWORKS

DDP_YAML = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_GPU
downcast_bf16: 'no'
enable_cpu_affinity: false
gpu_ids: all
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 4
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""

FSDP_YAML = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
fsdp_config:
  fsdp_activation_checkpointing: true
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: true
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_version: 2
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 2
num_processes: 16
rdzv_backend: static
same_network: true
use_cpu: false
"""

# an older FSDP1 file: the deprecated fsdp_sharding_strategy, no fsdp_version, no mixed_precision
FSDP1_YAML = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_sharding_strategy: SHARD_GRAD_OP
  fsdp_backward_prefetch: BACKWARD_PRE
num_processes: 8
"""

DEEPSPEED_YAML = """\
compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config:
  gradient_accumulation_steps: 4
  offload_optimizer_device: cpu
  offload_param_device: none
  zero3_init_flag: false
  zero_stage: 2
distributed_type: DEEPSPEED
machine_rank: 0
mixed_precision: fp16
num_machines: 1
num_processes: 8
use_cpu: false
"""

DEEPSPEED_FILE_YAML = """\
compute_environment: LOCAL_MACHINE
deepspeed_config:
  deepspeed_config_file: ds_z3_offload.json
  zero3_init_flag: true
distributed_type: DEEPSPEED
num_processes: 8
"""

ZERO2 = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 8,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}},
    "zero_optimization": {
        "stage": 2,
        "allgather_partitions": True,
        "overlap_comm": True,
        "reduce_scatter": True,
        "reduce_bucket_size": 5e8,
        "contiguous_gradients": True,
    },
}

ZERO3_OFFLOAD = {
    "train_micro_batch_size_per_gpu": 1,
    "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
        "stage3_gather_16bit_weights_on_model_save": True,
    },
    "activation_checkpointing": {"partition_activations": True, "cpu_checkpointing": True},
}

# transformers' docs' ds_config_zero3.json: the Trainer fills every "auto"
ZERO3_AUTO = {
    "fp16": {"enabled": "auto"},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto"}},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "none"},
        "overlap_comm": True,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}

TRAINER_ARGS = {"output_dir": "o", "per_device_train_batch_size": 2, "num_train_epochs": 1.0}
LORA = {"peft_type": "LORA", "r": 16, "target_modules": ["q_proj"]}
LLAMA_FACTORY = {"stage": "sft", "finetuning_type": "full", "deepspeed": "ds_z3.json", "per_device_train_batch_size": 1}
AXOLOTL = {"base_model": "m", "micro_batch_size": 2, "deepspeed": "deepspeed_configs/zero2.json"}


def _read(framework, tmp_path: Path, name: str, content: str | dict) -> ConfigJob:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    data = parse_config_file(path)
    assert [f.name for f in (*FRAMEWORKS, *HF_FRAMEWORKS, *ADAPTER_FRAMEWORKS) if f.detect(data)] == [framework.name]
    return framework.read(ConfigFile(path=str(path), data=data))


def _said(job: ConfigJob, *words: str) -> bool:
    return any(all(w in line for w in words) for line in job.assumptions)


def test_accelerate_multi_gpu(tmp_path: Path) -> None:
    job = _read(FRAMEWORK_ACCELERATE, tmp_path, "ddp.yaml", DDP_YAML)
    assert job.options == {"num_gpus": 4, "dtype": "bf16", "strategy": "ddp"}  # one machine: its size unsaid
    assert job.assumptions == () and job.not_modelled == ()


def test_accelerate_fsdp(tmp_path: Path) -> None:
    job = _read(FRAMEWORK_ACCELERATE, tmp_path, "fsdp.yaml", FSDP_YAML)
    assert job.options == {
        "num_gpus": 16,
        "gpus_per_node": 8,
        "dtype": "bf16",
        "strategy": "fsdp2",
        "offload": "params",
        "gradient_checkpointing": True,
        "reentrant": False,
    }
    assert "fsdp_config.fsdp_state_dict_type" in job.not_modelled

    job = _read(FRAMEWORK_ACCELERATE, tmp_path, "fsdp1.yaml", FSDP1_YAML)
    assert job.options == {"num_gpus": 8, "strategy": "fsdp2-shard-grad-op"}
    assert _said(job, "fsdp_version 1", "accelerate's default")
    assert _said(job, "num_machines 1", "accelerate's default")
    assert _said(job, "mixed_precision no (accelerate's default)")
    assert _said(job, "SHARD_GRAD_OP", "fsdp2-shard-grad-op")
    assert job.not_modelled == ("fsdp_config.fsdp_backward_prefetch",)


def test_accelerate_deepspeed(tmp_path: Path) -> None:
    job = _read(FRAMEWORK_ACCELERATE, tmp_path, "ds.yaml", DEEPSPEED_YAML)
    assert job.options == {
        "num_gpus": 8,
        "dtype": "fp16",
        "strategy": "zero2",
        "offload": "optimizer",
    }
    assert job.not_modelled == ("deepspeed_config.gradient_accumulation_steps",)

    job = _read(FRAMEWORK_ACCELERATE, tmp_path, "ds_file.yaml", DEEPSPEED_FILE_YAML)
    assert "strategy" not in job.options
    assert _said(job, "deepspeed_config_file ds_z3_offload.json", "pass that file too")

    plugin_default = DEEPSPEED_YAML.replace("  zero_stage: 2\n", "")
    job = _read(FRAMEWORK_ACCELERATE, tmp_path, "ds2.yaml", plugin_default)
    assert job.options["strategy"] == "zero2" and _said(job, "zero_stage 2", "accelerate's default")


def test_deepspeed_zero2(tmp_path: Path) -> None:
    job = _read(FRAMEWORK_DEEPSPEED, tmp_path, "ds_z2.json", ZERO2)
    assert job.options == {"batch_size": 4, "grad_accum": 8, "strategy": "zero2", "dtype": "bf16", "optimizer": "adamw"}
    assert job.assumptions == ()
    assert job.not_modelled == (
        "gradient_clipping",
        "zero_optimization.allgather_partitions",
        "zero_optimization.overlap_comm",
        "zero_optimization.reduce_scatter",
        "zero_optimization.reduce_bucket_size",
        "zero_optimization.contiguous_gradients",
    )


def test_deepspeed_zero3_offload(tmp_path: Path) -> None:
    job = _read(FRAMEWORK_DEEPSPEED, tmp_path, "ds_z3.json", ZERO3_OFFLOAD)
    assert job.options == {"batch_size": 1, "strategy": "zero3", "offload": "params", "dtype": "fp16"}
    assert _said(job, "no optimizer section", "Trainer's optim")
    assert _said(job, "activation_checkpointing section")
    optimizer_only = {**ZERO3_OFFLOAD, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    job = _read(FRAMEWORK_DEEPSPEED, tmp_path, "ds_z3o.json", optimizer_only)
    assert job.options["offload"] == "optimizer"


def test_deepspeed_auto_values(tmp_path: Path) -> None:
    job = _read(FRAMEWORK_DEEPSPEED, tmp_path, "ds_auto.json", ZERO3_AUTO)
    assert job.options == {"strategy": "zero3", "optimizer": "adamw"}  # batch size and dtype: the Trainer's
    assert _said(job, "train_micro_batch_size_per_gpu auto", "per_device_train_batch_size")
    assert _said(job, "bf16.enabled auto", "the Trainer's bf16")
    assert _said(job, "fp16.enabled auto", "the Trainer's fp16")
    assert _said(job, "gradient_accumulation_steps auto")
    assert _said(job, "zero_optimization.reduce_bucket_size", "optimizer.params.lr", "the Trainer fills them")


def test_deepspeed_defaults(tmp_path: Path) -> None:
    job = _read(FRAMEWORK_DEEPSPEED, tmp_path, "ds0.json", {"train_batch_size": 32, "zero_optimization": {}})
    assert job.options == {"strategy": "ddp"}
    assert _said(job, "zero_optimization.stage 0", "DeepSpeed's default")
    assert _said(job, "train_batch_size", "micro-batch")
    assert _said(job, "no bf16/fp16 section")
    z2 = {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}
    job = _read(FRAMEWORK_DEEPSPEED, tmp_path, "ds_z2p.json", z2)
    assert "offload" not in job.options and _said(job, "offload_param cpu", "ZeRO-3 only")


@pytest.mark.parametrize(
    ("framework", "content", "message"),
    [
        (FRAMEWORK_ACCELERATE, DDP_YAML.replace("MULTI_GPU", "XLA"), "distributed_type: XLA is not modelled"),
        (
            FRAMEWORK_ACCELERATE,
            DDP_YAML.replace("mixed_precision: bf16", "mixed_precision: fp4"),
            "mixed_precision: fp4 is not modelled",
        ),
        (FRAMEWORK_ACCELERATE, DDP_YAML.replace("num_processes: 4", "num_processes: four"), "num_processes: must be"),
        (
            FRAMEWORK_ACCELERATE,
            DDP_YAML.replace("num_processes: 4", "num_processes: 3").replace("machines: 1", "machines: 2"),
            "num_processes: 3 processes do not fill 2 machines",
        ),
        (
            FRAMEWORK_ACCELERATE,
            FSDP1_YAML.replace("SHARD_GRAD_OP", "HYBRID_SHARD_ZERO2"),
            "fsdp_config: fsdp_sharding_strategy: HYBRID_SHARD_ZERO2 is not modelled",
        ),
        (
            FRAMEWORK_ACCELERATE,
            DEEPSPEED_YAML.replace("offload_optimizer_device: cpu", "offload_optimizer_device: nvme"),
            "deepspeed_config: offload_optimizer_device: nvme offload is not modelled",
        ),
        (
            FRAMEWORK_ACCELERATE,
            FSDP_YAML.replace("fsdp_reshard_after_forward: true", "fsdp_reshard_after_forward: FULL_SHARD"),
            "fsdp_config: fsdp_reshard_after_forward: full_shard: FSDP2 takes true or false",
        ),
        (
            FRAMEWORK_DEEPSPEED,
            {**ZERO2, "zero_optimization": {"stage": "three"}},
            "zero_optimization: stage: must be a whole number",
        ),
        (
            FRAMEWORK_DEEPSPEED,
            {**ZERO2, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}},
            "zero_optimization: offload_param: nvme offload is not modelled",
        ),
        (
            FRAMEWORK_DEEPSPEED,
            {**ZERO2, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}},
            "zero_optimization: offload_param: cpu without the optimizer offloaded: parameter-only offload is not",
        ),
        (FRAMEWORK_DEEPSPEED, {**ZERO2, "optimizer": {"type": "OneBitAdam"}}, "optimizer: type: OneBitAdam is not"),
        (
            FRAMEWORK_DEEPSPEED,
            {**ZERO2, "train_micro_batch_size_per_gpu": "four"},
            "train_micro_batch_size_per_gpu: must be a whole number",
        ),
        (
            FRAMEWORK_DEEPSPEED,
            {**ZERO2, "bf16": {"enabled": "yes please"}},
            "bf16: enabled: must be true, false or auto",
        ),
    ],
)
def test_errors_name_the_file_and_key(tmp_path: Path, framework, content: str | dict, message: str) -> None:
    path = tmp_path / ("cfg.yaml" if isinstance(content, str) else "cfg.json")
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(TunecostError, match=f"{path.name}: {message}"):
        framework.read(ConfigFile(path=str(path), data=parse_config_file(path)))


@pytest.mark.parametrize("data", [TRAINER_ARGS, LORA, LLAMA_FACTORY, AXOLOTL, {"load_in_4bit": True}], ids=str)
def test_detect_is_false_for_other_frameworks(data: dict) -> None:
    assert not any(framework.detect(data) for framework in FRAMEWORKS)


@pytest.mark.parametrize(
    ("fp8_config", "recipe"),
    [
        ("", "tensorwise"),
        ("fp8_config:\n  backend: AO\n", "tensorwise"),
        ("fp8_config:\n  backend: TE\n", "te-delayed"),
    ],
)
def test_accelerate_fp8_reads_the_backend(tmp_path: Path, fp8_config: str, recipe: str) -> None:
    """mixed_precision fp8: torchao's default Float8LinearConfig (tensorwise) where the backend is AO or unset
    (accelerate's first choice when torchao is installed), Transformer Engine's delayed scaling for TE."""
    text = DDP_YAML.replace("mixed_precision: bf16", "mixed_precision: fp8") + fp8_config
    job = _read(FRAMEWORK_ACCELERATE, tmp_path, "fp8.yaml", text)
    assert (job.options["fp8"], job.options["dtype"]) == (recipe, "bf16")
    assert _said(job, f"fp8 {recipe}:") and _said(job, "backend auto") == (fp8_config == "")


def test_accelerate_fp8_with_ms_amp_is_an_error(tmp_path: Path) -> None:
    text = DDP_YAML.replace("mixed_precision: bf16", "mixed_precision: fp8") + "fp8_config:\n  backend: MSAMP\n"
    with pytest.raises(TunecostError, match=r"fp8\.yaml: fp8_config: backend: MSAMP: tunecost models FP8 with torchao"):
        _read(FRAMEWORK_ACCELERATE, tmp_path, "fp8.yaml", text)


def test_deepspeed_train_batch_size_gives_the_gpus(tmp_path: Path) -> None:
    """train_batch_size = micro-batch x accumulation x world size, as DeepSpeed checks it."""
    job = _read(FRAMEWORK_DEEPSPEED, tmp_path, "ds.json", {**ZERO2, "train_batch_size": 128})
    assert (job.options["grad_accum"], job.options["num_gpus"]) == (8, 4)
    with pytest.raises(TunecostError, match="train_batch_size: 100 is not micro-batch 4 x accumulation 8"):
        _read(FRAMEWORK_DEEPSPEED, tmp_path, "ds.json", {**ZERO2, "train_batch_size": 100})


PARALLELISM = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
mixed_precision: bf16
num_machines: 1
num_processes: 8
parallelism_config:
  parallelism_config_dp_replicate_size: {replicate}
  parallelism_config_dp_shard_size: {shard}
  parallelism_config_tp_size: {tp}
  parallelism_config_cp_size: {cp}
"""


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ((1, 8, 1, 1), {"num_gpus": 8, "strategy": "fsdp2"}),
        ((1, 2, 2, 2), {"num_gpus": 8, "strategy": "fsdp2", "tp": 2, "sequence_parallel": False, "cp": 2}),
        ((2, 2, 2, 1), {"num_gpus": 8, "strategy": "hsdp", "gpus_per_node": 4, "tp": 2, "sequence_parallel": False}),
    ],
)
def test_accelerate_parallelism_config_sets_the_layout(tmp_path: Path, sizes: tuple, expected: dict) -> None:
    replicate, shard, tp, cp = sizes
    text = PARALLELISM.format(replicate=replicate, shard=shard, tp=tp, cp=cp)
    job = _read(FRAMEWORK_ACCELERATE, tmp_path, "par.yaml", text)
    assert {k: v for k, v in job.options.items() if k not in ("dtype", "gpus_per_node") or k in expected} == expected
    assert not any(k.startswith("parallelism_config.parallelism_config_") and k.endswith("_size")
                   for k in job.not_modelled)  # fmt: skip


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ((1, 2, 2, 1), "parallelism_config_dp_shard_size: the sizes' product 4 is not num_processes 8"),
        ((2, 1, 4, 1), "parallelism_config_dp_shard_size: 1 with cp_size 1 under FSDP: nothing to shard over"),
        ((1, 8, 1, 0), "parallelism_config_cp_size: must be at least 1, got 0"),
    ],
)
def test_accelerate_parallelism_config_errors(tmp_path: Path, sizes: tuple, message: str) -> None:
    replicate, shard, tp, cp = sizes
    path = tmp_path / "par.yaml"
    path.write_text(PARALLELISM.format(replicate=replicate, shard=shard, tp=tp, cp=cp))
    with pytest.raises(TunecostError, match=f"par.yaml: parallelism_config: {re.escape(message)}"):
        FRAMEWORK_ACCELERATE.read(ConfigFile(path=str(path), data=parse_config_file(path)))


def test_accelerate_ulysses_sequence_parallelism_is_refused(tmp_path: Path) -> None:
    """TRL's alst_ulysses_4gpu.yaml: DeepSpeed ZeRO-3 with ALST/Ulysses over 2 ranks."""
    text = PARALLELISM.format(replicate=1, shard=2, tp=1, cp=1).replace("distributed_type: FSDP", "distributed_type: "
           "DEEPSPEED") + "  parallelism_config_sp_size: 2\n  parallelism_config_sp_backend: deepspeed\n"  # fmt: skip
    path = tmp_path / "alst.yaml"
    path.write_text(text.replace("num_processes: 8", "num_processes: 4"))
    with pytest.raises(TunecostError, match="parallelism_config_sp_size: 2: ALST/Ulysses sequence parallelism"):
        FRAMEWORK_ACCELERATE.read(ConfigFile(path=str(path), data=parse_config_file(path)))
