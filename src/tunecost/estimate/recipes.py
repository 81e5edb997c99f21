"""Launch recipes of a planned setup: the files a framework needs to run it (`tunecost plan --emit DIR`).

`write_recipe(job, target, out_dir)` writes for "accelerate" an accelerate config, a DeepSpeed JSON (ZeRO), the
TrainingArguments / LoRA / BitsAndBytes fields and a launch.sh; for "torchtune" a `tune run` line and its
overrides; for "llamafactory" a LLaMA-Factory YAML; for "skypilot" a SkyPilot task that runs the accelerate recipe.
docs/plan-recipes.md names the source of every key. A setup a target cannot express is one `TunecostError`,
raised before anything is written; an existing file is replaced only with `force`.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.distributed.plan import ParallelPlan
from tunecost.errors import TunecostError
from tunecost.io import atomic_write_text
from tunecost.workload.job import ATTENTION_IMPLS, DEFAULT_DENSE_LORA_TARGETS, DTYPES, LORA_TARGETS, METHODS, OPTIMIZERS

TARGETS = ("accelerate", "torchtune", "llamafactory", "skypilot")
FSDP_STRATEGIES = ("fsdp1", "fsdp2", "fsdp2-shard-grad-op", "hsdp")
ZERO_STAGES = {"zero1": 1, "zero2": 2, "zero3": 3}
DEFAULT_LORA_RANK = 16  # workload.job.LoraConfig's default (the paper's)
MAX_GRAD_NORM = 1.0  # TrainingArguments' default; the HF Trainer checks DeepSpeed's gradient_clipping against it
MASTER_PORT = 29500
SKYPILOT_DEFAULT_DISK_GB = 256  # sky/resources.py DEFAULT_DISK_SIZE_GB
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
HF_OPTIM = {"adamw": "adamw_torch", "adamw-8bit": "paged_adamw_8bit", "sgd": "sgd"}  # transformers OptimizerNames
HF_ATTENTION = {"flash": "flash_attention_2", "sdpa": "sdpa", "eager": "eager"}  # from_pretrained attn_implementation
# LoRA targets as Llama-style module names (transformers 5: q/k/v/o_proj, gate/up/down_proj); MoE experts are fused
# 3-D parameters and the router a TopKRouter, so PEFT reaches them with target_parameters (as tunecost.moe does).
PEFT_MODULES = {"attention": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}
PEFT_PARAMETERS = {"experts": ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"), "router": ("mlp.gate.weight",)}


@dataclass(frozen=True, kw_only=True)
class LaunchJob:
    """The planned setup a recipe launches."""

    model: str  # hub id, e.g. "meta-llama/Llama-2-70b-hf"
    method: str  # full | lora | qlora
    lora_rank: int | None = None  # None: DEFAULT_LORA_RANK
    lora_alpha: float | None = None  # None: 2 x rank
    lora_targets: tuple[str, ...] = ()  # tunecost groups: attention, mlp, experts, router; (): attention + mlp
    quant_type: str = "nf4"  # qlora: nf4 | fp4
    double_quant: bool = True
    dtype: str = "bf16"  # bf16 | fp16 | fp32
    gradient_checkpointing: bool = True
    attention: str = "sdpa"  # flash | sdpa | eager
    optimizer: str = "adamw"  # adamw | adamw-8bit | sgd
    seq_len: int
    micro_batch: int  # per GPU
    grad_accum: int = 1
    epochs: float = 1.0
    dataset: str | None = None  # a name or a local file
    gpu: str  # tunecost catalog GPU name, e.g. "H100-80GB-SXM"
    num_gpus: int = 1
    gpus_per_node: int = 8
    strategy: str = "single"  # single | ddp | fsdp1 | fsdp2 | fsdp2-shard-grad-op | hsdp | zero1 | zero2 | zero3
    offload: str = "none"  # none | optimizer (zero1-3) | params (zero3, fsdp1, fsdp2): CPU offload
    clouds: tuple[tuple[str, str], ...] = ()  # (provider, region) of the price rows the plan used; region may be ""
    disk_gb: int = 0  # disk for the weights (0: the recipe picks SkyPilot's default)

    def __post_init__(self) -> None:
        choices = [("method", self.method, METHODS), ("4-bit type", self.quant_type, ("nf4", "fp4"))]
        choices += [("dtype", self.dtype, DTYPES), ("attention", self.attention, ATTENTION_IMPLS)]
        choices += [("optimizer", self.optimizer, OPTIMIZERS)]
        choices += [("LoRA target", t, LORA_TARGETS) for t in self.lora_targets]
        for what, value, allowed in choices:
            if value not in allowed:
                raise TunecostError(f"unsupported {what} {value!r}; supported: {', '.join(allowed)}")
        ParallelPlan(  # checks the counts, the strategy and its offload
            num_gpus=self.num_gpus, gpus_per_node=self.gpus_per_node, strategy=self.strategy, offload=self.offload
        )
        counts = [("sequence length", self.seq_len), ("micro-batch", self.micro_batch)]
        counts += [("gradient accumulation", self.grad_accum), ("LoRA rank", self.rank)]
        for what, n in counts:
            if n < 1:
                raise TunecostError(f"{what} must be at least 1, got {n}")
        if not (math.isfinite(self.epochs) and self.epochs > 0) or not (math.isfinite(self.alpha) and self.alpha > 0):
            raise TunecostError(f"epochs and LoRA alpha must be positive, got {self.epochs!r} and {self.alpha!r}")
        if not self.model.strip() or self.disk_gb < 0:
            raise TunecostError(f"a recipe needs a model and a disk size >= 0 GB, got {self.model!r}, {self.disk_gb}")

    @property
    def rank(self) -> int:
        return DEFAULT_LORA_RANK if self.lora_rank is None else self.lora_rank

    @property
    def alpha(self) -> float:
        return 2.0 * self.rank if self.lora_alpha is None else self.lora_alpha

    @property
    def targets(self) -> tuple[str, ...]:
        return self.lora_targets or DEFAULT_DENSE_LORA_TARGETS

    @property
    def num_nodes(self) -> int:
        return max(1, -(-self.num_gpus // self.gpus_per_node))

    @property
    def gpus_on_node(self) -> int:
        return min(self.num_gpus, self.gpus_per_node)

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step over every rank."""
        return self.micro_batch * self.grad_accum * self.num_gpus


def write_recipe(job: LaunchJob, target: str, out_dir: Path, *, force: bool = False) -> list[Path]:
    """Write `target`'s files for `job` into `out_dir` (created if missing) and return their paths. Every file is
    rendered and checked before any is written; an existing file is replaced only with `force`."""
    if target not in RENDERERS:
        raise TunecostError(f"unknown recipe target {target!r}; targets: {', '.join(TARGETS)}")
    files = RENDERERS[target](job)
    paths = [Path(out_dir) / name for name in files]
    taken = [str(p) for p in paths if p.exists() or p.is_symlink()]
    if taken and not force:
        raise TunecostError(f"{', '.join(taken)}: already there; pass --force to replace")
    for path, text in zip(paths, files.values()):
        atomic_write_text(path, text)
        if path.suffix == ".sh":
            path.chmod(path.stat().st_mode | 0o111)
    return paths


def _cannot(target: str, why: str) -> TunecostError:
    return TunecostError(f"{target} recipe: cannot express this setup: {why}")


class _Dumper(yaml.SafeDumper):
    """YAML with multi-line strings (SkyPilot's setup and run) as literal blocks."""


_Dumper.add_representer(
    str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)
)


def _yaml(data: dict[str, Any], comments: list[str]) -> str:
    return "".join(f"# {c}\n" for c in comments) + yaml.dump(data, Dumper=_Dumper, sort_keys=False)


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2) + "\n"


class _Raw(str):
    """A shell word written as is (it expands a variable), not quoted."""


def _env(name: str, default: object) -> _Raw:
    return _Raw(f'"${{{name}:-{default}}}"')


def _cmd(*groups: Sequence[str]) -> str:
    """A command whose word groups go on continuation lines; words are shell-quoted unless `_Raw`."""
    return " \\\n    ".join(" ".join(w if isinstance(w, _Raw) else shlex.quote(w) for w in g) for g in groups if g)


def _script(comments: list[str], command: str) -> str:
    head = ["#!/usr/bin/env bash", *(f"# {c}" for c in comments), "set -euo pipefail", 'cd "$(dirname "$0")"']
    return "\n".join([*head, command]) + "\n"


def _peft_targets(job: LaunchJob) -> dict[str, Any]:
    """LoraConfig's target_modules / target_parameters: "all-linear" (every Linear but the output) for attention+MLP."""
    if set(job.targets) == {"attention", "mlp"}:
        return {"target_modules": "all-linear"}
    out: dict[str, Any] = {"target_modules": [m for t in job.targets for m in PEFT_MODULES.get(t, ())]}
    parameters = [p for t in job.targets for p in PEFT_PARAMETERS.get(t, ())]
    return out | ({"target_parameters": parameters} if parameters else {})


def _ds_config(job: LaunchJob, target: str) -> dict[str, Any]:
    """DeepSpeed's JSON: concrete batch sizes (DeepSpeed checks train_batch_size = micro x accum x world size; the HF
    Trainer checks them against its arguments) and ZeRO-Offload to the CPU as tunecost models it."""
    stage = ZERO_STAGES[job.strategy]
    zero: dict[str, Any] = {"stage": stage}
    if job.offload != "none":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if job.offload == "params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    config: dict[str, Any] = {
        "train_batch_size": job.global_batch,
        "train_micro_batch_size_per_gpu": job.micro_batch,
        "gradient_accumulation_steps": job.grad_accum,
        "gradient_clipping": MAX_GRAD_NORM,
        "bf16": {"enabled": job.dtype == "bf16"},
        "fp16": {"enabled": job.dtype == "fp16"},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,  # the client's optimizer (bitsandbytes 8-bit, SGD) under ZeRO
    }
    if job.offload != "none" and job.optimizer == "adamw-8bit":
        raise _cannot(target, "ZeRO-Offload steps the optimizer on the CPU; bitsandbytes' 8-bit AdamW runs on the GPU")
    if job.offload != "none" and job.optimizer == "adamw":  # DeepSpeed's CPU Adam; "auto": from the Trainer's args
        config["optimizer"] = {"type": "AdamW", "params": dict.fromkeys(("lr", "betas", "eps", "weight_decay"), "auto")}
    elif job.offload != "none":
        config["zero_force_ds_cpu_optimizer"] = False  # torch's SGD steps on the offloaded CPU tensors
    return config


def _accelerate_config(job: LaunchJob, *, fsdp_checkpointing: bool) -> dict[str, Any]:
    """accelerate's config file (commands/config/config_args.py ClusterConfig; fsdp_config as `accelerate config`
    writes it, commands/config/cluster.py)."""
    kind = "FSDP" if job.strategy in FSDP_STRATEGIES else "DEEPSPEED" if job.strategy in ZERO_STAGES else "MULTI_GPU"
    config: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "debug": False}
    config["distributed_type"] = "NO" if kind == "MULTI_GPU" and job.num_gpus == 1 else kind  # single, 1-GPU ddp
    if kind != "DEEPSPEED":  # with deepspeed_config_file accelerate refuses a mixed_precision of its own
        config["mixed_precision"] = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[job.dtype]
    config |= {"num_machines": job.num_nodes, "num_processes": job.num_gpus, "machine_rank": 0}
    config |= {"main_training_function": "main", "rdzv_backend": "static", "same_network": False, "use_cpu": False}
    if job.num_nodes > 1:
        config["main_process_port"] = MASTER_PORT  # main_process_ip and machine_rank: given per node by launch.sh
    if kind == "DEEPSPEED":
        ds = {"deepspeed_config_file": "ds_config.json", "zero3_init_flag": job.strategy == "zero3"}
        config["deepspeed_config"] = ds | ({"deepspeed_multinode_launcher": "standard"} if job.num_nodes > 1 else {})
    if kind != "FSDP":
        return config
    version = 1 if job.strategy == "fsdp1" else 2
    fsdp: dict[str, Any] = {"fsdp_version": version, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}
    # FSDP1: the sharding strategy (`accelerate config` writes it as reshard_after_forward, `accelerate launch` reads
    # fsdp_sharding_strategy: both given); FSDP2: whether to reshard after forward (False: SHARD_GRAD_OP)
    fsdp["fsdp_reshard_after_forward"] = "FULL_SHARD" if version == 1 else job.strategy != "fsdp2-shard-grad-op"
    fsdp |= {"fsdp_offload_params": job.offload == "params", "fsdp_cpu_ram_efficient_loading": True}
    fsdp |= {"fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_activation_checkpointing": fsdp_checkpointing}
    if version == 1:  # use_orig_params: frozen base weights and trainable adapters share a wrapped layer
        fsdp |= {"fsdp_sharding_strategy": "FULL_SHARD", "fsdp_sync_module_states": True, "fsdp_use_orig_params": True}
        fsdp |= {"fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_forward_prefetch": False}
    config["fsdp_config"] = fsdp
    if job.strategy == "hsdp":  # FSDP2 shards within a node and replicates across nodes
        config["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": job.num_nodes,
            "parallelism_config_dp_shard_size": job.gpus_on_node,
        }
    return config


def _accelerate_launch(job: LaunchJob, *script: str) -> str:
    """`accelerate launch` of `script`; on several nodes each node gives its rank and the first node's address."""
    ranks = ["--num_processes", _env("NUM_PROCESSES", job.num_gpus), "--machine_rank", _env("NODE_RANK", 0)]
    main = [
        "--main_process_ip",
        _env("MASTER_ADDR", "127.0.0.1"),
        "--main_process_port",
        _env("MASTER_PORT", MASTER_PORT),
    ]
    nodes = [ranks, main] if job.num_nodes > 1 else []
    return _cmd(["accelerate", "launch", "--config_file", "accelerate_config.yaml"], *nodes, list(script))


def _summary(job: LaunchJob) -> str:
    layout = f"{job.num_gpus} x {job.gpu} ({job.num_nodes} node{'s' if job.num_nodes > 1 else ''}), {job.strategy}"
    offload = f", offload {job.offload}" if job.offload != "none" else ""
    batch = f"micro-batch {job.micro_batch} x {job.grad_accum} accumulation"
    return f"tunecost plan: {job.method} of {job.model} on {layout}{offload}; {batch}"


def _nodes_note(job: LaunchJob) -> list[str]:
    return [] if job.num_nodes == 1 else ["run on every node with NODE_RANK, MASTER_ADDR (node 0's address) set"]


def _train_args(job: LaunchJob) -> dict[str, Any]:
    """What the user's train.py builds: from_pretrained kwargs, TrainingArguments, LoraConfig, BitsAndBytesConfig."""
    fsdp = job.strategy in FSDP_STRATEGIES  # FSDP checkpoints itself; the HF Trainer refuses both at once
    training = {"output_dir": "output", "per_device_train_batch_size": job.micro_batch}
    training |= {"gradient_accumulation_steps": job.grad_accum, "num_train_epochs": job.epochs}
    training |= {"bf16": job.dtype == "bf16", "fp16": job.dtype == "fp16", "optim": HF_OPTIM[job.optimizer]}
    training |= {"gradient_checkpointing": job.gradient_checkpointing and not fsdp, "max_grad_norm": MAX_GRAD_NORM}
    training |= {"logging_steps": 10, "report_to": "none"}
    if job.strategy == "ddp":
        training["ddp_find_unused_parameters"] = False
    out: dict[str, Any] = {"model": {"pretrained_model_name_or_path": job.model, "dtype": TORCH_DTYPES[job.dtype]}}
    out["model"]["attn_implementation"] = HF_ATTENTION[job.attention]
    out |= {"max_seq_length": job.seq_len, "dataset": job.dataset, "training_args": training}
    if job.method != "full":
        lora = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": job.rank, "lora_alpha": job.alpha}
        out["lora_config"] = lora | _peft_targets(job)
    if job.method == "qlora":
        bnb = {"load_in_4bit": True, "bnb_4bit_quant_type": job.quant_type}
        bnb |= {"bnb_4bit_use_double_quant": job.double_quant, "bnb_4bit_compute_dtype": TORCH_DTYPES[job.dtype]}
        if fsdp or job.strategy == "zero3":  # sharded 4-bit weights need a float storage dtype (FSDP/ZeRO-3 QLoRA)
            bnb["bnb_4bit_quant_storage"] = TORCH_DTYPES[job.dtype]
        out["quantization_config"] = bnb
    return out


def _accelerate(job: LaunchJob) -> dict[str, str]:
    config = _accelerate_config(job, fsdp_checkpointing=job.gradient_checkpointing)
    files = {"accelerate_config.yaml": _yaml(config, [_summary(job)])}
    if job.strategy in ZERO_STAGES:
        files["ds_config.json"] = _json(_ds_config(job, "accelerate"))
    files["train_args.json"] = _json(_train_args(job))
    note = [
        _summary(job),
        "train.py is your own training script (tunecost does not write it): it reads train_args.json:",
        "from_pretrained(**model), TrainingArguments(**training_args), LoraConfig(**lora_config),",
        "BitsAndBytesConfig(**quantization_config), max_seq_length and dataset.",
        *_nodes_note(job),
    ]
    files["launch.sh"] = _script(note, _accelerate_launch(job, "train.py", "train_args.json"))
    return files


# torchtune 0.6.1 (its last release): the configs of _recipe_registry.py for the lora/full recipes
TORCHTUNE_CONFIGS = frozenset(
    """
    llama2/7B_full_low_memory llama2/7B_full llama2/13B_full llama2/7B_lora_single_device llama2/7B_qlora_single_device
    llama2/13B_qlora_single_device llama2/7B_lora llama2/13B_lora llama2/70B_lora llama2/7B_qlora llama2/70B_qlora
    llama3/8B_full_single_device llama3/8B_full llama3/70B_full llama3/8B_lora_single_device
    llama3/8B_qlora_single_device llama3/8B_lora llama3/70B_lora llama3_1/8B_full_single_device llama3_1/8B_full
    llama3_1/70B_full llama3_1/8B_lora_single_device llama3_1/8B_qlora_single_device llama3_1/8B_lora
    llama3_1/70B_lora llama3_1/405B_qlora llama3_2/1B_full_single_device llama3_2/3B_full_single_device
    llama3_2/1B_full llama3_2/3B_full llama3_2/1B_lora_single_device llama3_2/3B_lora_single_device
    llama3_2/1B_qlora_single_device llama3_2/3B_qlora_single_device llama3_2/1B_lora llama3_2/3B_lora
    llama3_3/70B_full llama3_3/70B_lora llama3_3/70B_qlora mistral/7B_full_low_memory mistral/7B_full
    mistral/7B_lora_single_device mistral/7B_qlora_single_device mistral/7B_lora gemma/2B_full gemma/7B_full
    gemma/2B_lora_single_device gemma/2B_qlora_single_device gemma/7B_lora_single_device gemma/7B_qlora_single_device
    gemma/2B_lora gemma/7B_lora gemma2/2B_full gemma2/9B_full gemma2/27B_full gemma2/2B_lora_single_device
    gemma2/2B_qlora_single_device gemma2/9B_lora_single_device gemma2/9B_qlora_single_device
    gemma2/27B_lora_single_device gemma2/27B_qlora_single_device gemma2/2B_lora gemma2/9B_lora gemma2/27B_lora
    phi3/mini_full_low_memory phi3/mini_full phi3/mini_lora_single_device phi3/mini_qlora_single_device phi3/mini_lora
    phi4/14B_full_low_memory phi4/14B_full phi4/14B_lora_single_device phi4/14B_qlora_single_device phi4/14B_lora
    qwen2/0.5B_full_single_device qwen2/1.5B_full_single_device qwen2/7B_full_single_device qwen2/0.5B_full
    qwen2/1.5B_full qwen2/7B_full qwen2/0.5B_lora_single_device qwen2/1.5B_lora_single_device
    qwen2/7B_lora_single_device qwen2/0.5B_lora qwen2/1.5B_lora qwen2/7B_lora qwen2_5/0.5B_full_single_device
    qwen2_5/1.5B_full_single_device qwen2_5/3B_full_single_device qwen2_5/7B_full_single_device qwen2_5/0.5B_full
    qwen2_5/1.5B_full qwen2_5/3B_full qwen2_5/7B_full qwen2_5/0.5B_lora_single_device qwen2_5/1.5B_lora_single_device
    qwen2_5/3B_lora_single_device qwen2_5/7B_lora_single_device qwen2_5/14B_lora_single_device qwen2_5/0.5B_lora
    qwen2_5/1.5B_lora qwen2_5/3B_lora qwen2_5/7B_lora qwen2_5/32B_lora qwen2_5/72B_lora
    """.split()  # noqa: SIM905 (a word list reads and diffs better than 105 quoted strings)
)
# hub id (lower case) -> torchtune config prefix; the first match wins
TORCHTUNE_MODELS = (
    (r"llama-2-(\d+)b", "llama2/{}B"),
    (r"llama-3\.3-(\d+)b", "llama3_3/{}B"),
    (r"llama-3\.2-(\d+)b", "llama3_2/{}B"),
    (r"llama-3\.1-(\d+)b", "llama3_1/{}B"),
    (r"llama-3-(\d+)b", "llama3/{}B"),
    (r"mistral-(\d+)b", "mistral/{}B"),
    (r"gemma-2-(\d+)b", "gemma2/{}B"),
    (r"gemma-(\d+)b", "gemma/{}B"),
    (r"phi-3-(mini)", "phi3/{}"),
    (r"phi-4", "phi4/14B"),
    (r"qwen2\.5-([\d.]+)b", "qwen2_5/{}B"),
    (r"qwen2-([\d.]+)b", "qwen2/{}B"),
)
TORCHTUNE_PLACEHOLDER = "YOUR_CONFIG.yaml"
TORCHTUNE_OPTIMIZERS = {"adamw-8bit": "bitsandbytes.optim.PagedAdamW8bit", "sgd": "torch.optim.SGD"}
TORCHTUNE_ATTENTION = ["q_proj", "k_proj", "v_proj", "output_proj"]  # torchtune's LORA_ATTN_MODULES


TORCHTUNE_SUFFIXES = {  # (method, distributed) -> config name endings, in order of preference
    ("full", False): ("_full_single_device", "_full_low_memory"),
    ("full", True): ("_full",),
    ("lora", False): ("_lora_single_device",),
    ("lora", True): ("_lora",),
    ("qlora", False): ("_qlora_single_device",),
    ("qlora", True): ("_qlora",),
}


def torchtune_config(model: str, method: str, *, distributed: bool) -> str | None:
    """The torchtune config for a hub id, method and recipe (None: torchtune ships none)."""
    prefix = next((p.format(*m.groups()) for pat, p in TORCHTUNE_MODELS if (m := re.search(pat, model.lower()))), None)
    names = [f"{prefix}{end}" for end in TORCHTUNE_SUFFIXES[method, distributed]] if prefix else []
    return next((n for n in names if n in TORCHTUNE_CONFIGS), None)


def _torchtune_fused(config: str) -> bool:
    """Whether a 0.6.1 config sets optimizer.fused: every torch AdamW config does; the single-device full configs
    (bitsandbytes' paged AdamW) do not, except qwen2's and qwen2.5's 0.5B."""
    return not config.endswith(("_low_memory", "_full_single_device")) or "/0.5B_" in config


def _check_torchtune(job: LaunchJob) -> None:
    why = None
    if job.strategy not in ("single", "fsdp2", "fsdp2-shard-grad-op"):
        why = f"its distributed recipes shard with FSDP2 only (HSDP is newer than release 0.6.1), not {job.strategy}"
    elif job.dtype == "fp16":
        why = "its recipes refuse fp16; use bf16 or fp32"
    elif job.method == "qlora" and (job.quant_type != "nf4" or not job.double_quant):
        why = "its QLoRA is torchao's NF4 with double-quantized scales only"
    elif job.method != "full" and set(job.targets) - {"attention", "mlp"}:
        why = "its LoRA builders adapt attention and MLP projections, not MoE experts or routers"
    elif job.epochs != int(job.epochs):
        why = f"it counts whole epochs, not {job.epochs:g}"
    if why:
        raise _cannot("torchtune", why)


def _flat(tree: dict[str, Any], prefix: str = "") -> list[str]:
    """`key.sub=value` words as `tune run` takes them (OmegaConf dotlist: lists as [a,b], booleans as True/False)."""
    words = []
    for key, value in tree.items():
        if isinstance(value, dict):
            words += _flat(value, f"{prefix}{key}.")
        else:
            text = f"[{','.join(map(str, value))}]" if isinstance(value, list) else str(value)
            words.append(f"{prefix}{key}={text}")
    return words


def _torchtune(job: LaunchJob) -> dict[str, str]:
    _check_torchtune(job)
    distributed = job.strategy != "single"
    recipe = f"{'full' if job.method == 'full' else 'lora'}_finetune_" + (
        "distributed" if distributed else "single_device"
    )
    config = torchtune_config(job.model, job.method, distributed=distributed)
    over: dict[str, Any] = {"batch_size": job.micro_batch, "gradient_accumulation_steps": job.grad_accum}
    over |= {"epochs": int(job.epochs), "tokenizer": {"max_seq_len": job.seq_len}, "dtype": job.dtype}
    over["enable_activation_checkpointing"] = job.gradient_checkpointing
    if job.method != "full":
        attention = TORCHTUNE_ATTENTION if "attention" in job.targets else []
        over["model"] = {"lora_rank": job.rank, "lora_alpha": job.alpha, "lora_attn_modules": attention}
        over["model"]["apply_lora_to_mlp"] = "mlp" in job.targets
    if job.offload == "params":
        over["fsdp_cpu_offload"] = True
    if job.strategy == "fsdp2-shard-grad-op":
        over["fsdp_reshard_after_forward"] = False
    removals = []
    if job.optimizer in TORCHTUNE_OPTIMIZERS:
        over["optimizer"] = {"_component_": TORCHTUNE_OPTIMIZERS[job.optimizer]}
        if job.optimizer == "adamw-8bit" and config is not None and _torchtune_fused(config):
            removals.append("~optimizer.fused")  # bitsandbytes' optimizers take no `fused`
    notes = [_summary(job), f"first: tune download {job.model} --output-dir <the config's checkpointer.checkpoint_dir>"]
    if config is None:
        notes.append(f"torchtune 0.6.1 has no {recipe} config for {job.model}: `tune cp` the nearest (tune ls)")
        notes.append(f"to {TORCHTUNE_PLACEHOLDER} and set its model, tokenizer and checkpointer")
        notes += ["(and drop its optimizer.fused: bitsandbytes' optimizers take none)"] * (
            job.optimizer == "adamw-8bit"
        )
    if job.dataset:
        notes.append(f"dataset {job.dataset}: set the config's dataset component (torchtune builds datasets by format)")
    nodes = [["--nproc_per_node", str(job.gpus_on_node)]] if distributed else []
    if job.num_nodes > 1:
        endpoint = _Raw(f'"${{MASTER_ADDR:-127.0.0.1}}:${{MASTER_PORT:-{MASTER_PORT}}}"')
        nodes = [["--nnodes", str(job.num_nodes), *nodes[0], "--node_rank", _env("NODE_RANK", 0)]]
        nodes += [["--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint]]
    config = config or TORCHTUNE_PLACEHOLDER
    overrides = [[w] for w in _flat(over) + removals]  # one per line
    command = _cmd(["tune", "run"], *nodes, [recipe, "--config", config], *overrides)
    yaml_notes = [f"overrides of torchtune's {recipe} --config {config} (launch.sh gives them as key=value words)"]
    yaml_notes += [f"and remove {r[1:]} from the config" for r in removals]
    return {
        "launch.sh": _script(notes + _nodes_note(job), command),
        "torchtune_overrides.yaml": _yaml(over, [_summary(job), *yaml_notes]),
    }


LLAMAFACTORY_ATTENTION = {"flash": "fa2", "sdpa": "sdpa", "eager": "disabled"}  # extras/constants.py AttentionFunction


def _llamafactory(job: LaunchJob) -> dict[str, str]:
    """LLaMA-Factory's training YAML (hparams/*_args.py); FSDP through accelerate (examples/accelerate/)."""
    if job.method != "full" and set(job.targets) - {"attention", "mlp"}:
        raise _cannot(
            "llamafactory", "lora_target names Linear modules; transformers 5's MoE experts and routers are not"
        )
    if job.method != "full" and job.alpha != int(job.alpha):
        raise _cannot("llamafactory", f"lora_alpha is an integer there, not {job.alpha:g}")
    lf: dict[str, Any] = {"model_name_or_path": job.model, "stage": "sft", "do_train": True}
    lf["finetuning_type"] = "full" if job.method == "full" else "lora"
    if job.method != "full":
        names = [m for t in job.targets for m in PEFT_MODULES[t]]
        lf |= {"lora_rank": job.rank, "lora_alpha": int(job.alpha)}
        lf["lora_target"] = "all" if set(job.targets) == {"attention", "mlp"} else ",".join(names)
    if job.method == "qlora":
        lf |= {"quantization_bit": 4, "quantization_method": "bnb", "quantization_type": job.quant_type}
        lf["double_quantization"] = job.double_quant
    lf |= {"dataset": job.dataset or "CHANGE_ME", "cutoff_len": job.seq_len, "output_dir": "output"}
    lf |= {"per_device_train_batch_size": job.micro_batch, "gradient_accumulation_steps": job.grad_accum}
    lf |= {"num_train_epochs": job.epochs, "bf16": job.dtype == "bf16", "fp16": job.dtype == "fp16"}
    lf |= {"flash_attn": LLAMAFACTORY_ATTENTION[job.attention], "optim": HF_OPTIM[job.optimizer]}
    lf |= {"disable_gradient_checkpointing": not job.gradient_checkpointing, "max_grad_norm": MAX_GRAD_NORM}
    lf |= {"logging_steps": 10, "report_to": "none"}
    files: dict[str, str] = {}
    if job.strategy in ZERO_STAGES:
        lf["deepspeed"] = "ds_config.json"
        files["ds_config.json"] = _json(_ds_config(job, "llamafactory"))
    notes = [_summary(job), "dataset: a name in dataset_dir/dataset_info.json (LLaMA-Factory's data/ folder)"]
    files["llamafactory.yaml"] = _yaml(lf, notes)
    if job.strategy in FSDP_STRATEGIES:  # LLaMA-Factory checkpoints activations itself (disable_gradient_checkpointing)
        files["accelerate_config.yaml"] = _yaml(_accelerate_config(job, fsdp_checkpointing=False), [_summary(job)])
        command = _accelerate_launch(job, "-m", "llamafactory.launcher", "llamafactory.yaml")
    elif job.num_gpus == 1:
        one_gpu = _Raw('CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"')  # else it runs torchrun on every GPU
        command = _cmd([one_gpu, "llamafactory-cli", "train", "llamafactory.yaml"])
    else:  # llamafactory-cli runs torchrun with these (launcher.py)
        env = [_Raw("FORCE_TORCHRUN=1"), _Raw(f"NNODES={job.num_nodes}"), _Raw(f"NPROC_PER_NODE={job.gpus_on_node}")]
        env += [_Raw('NODE_RANK="${NODE_RANK:-0}"'), _Raw('MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"')]
        env += [_Raw(f'MASTER_PORT="${{MASTER_PORT:-{MASTER_PORT}}}"')]
        command = _cmd(env, ["llamafactory-cli", "train", "llamafactory.yaml"])
    files["launch.sh"] = _script([_summary(job), *_nodes_note(job)], command)
    return files


# tunecost GPU catalog name -> SkyPilot accelerator (skypilot-catalog catalogs/v8/common/accelerators.csv)
SKYPILOT_GPUS = {
    "A40-48GB": "A40", "A100-40GB": "A100", "A100-80GB-SXM": "A100-80GB", "A100-80GB-PCIE": "A100-80GB",
    "H100-80GB-SXM": "H100", "H100-80GB-PCIE": "H100", "H100-94GB-NVL": "H100-NVL", "H200-141GB": "H200",
    "GH200-96GB": "GH200", "B200-180GB": "B200", "B300-288GB": "B300", "MI300X-192GB": "MI300X",
    "L40S-48GB": "L40S", "L40-48GB": "L40", "L4-24GB": "L4", "A10G-24GB": "A10G", "A10-24GB": "A10", "A30-24GB": "A30",
    "A800-80GB-SXM": "A800", "A800-80GB-PCIE": "A800", "T4-16GB": "T4", "V100-16GB-SXM2": "V100",
    "V100-16GB-PCIE": "V100", "V100-32GB-SXM2": "V100-32GB", "V100-32GB-PCIE": "V100-32GB",
    "RTX3060-12GB": "RTX3060", "RTX3090-24GB": "RTX3090", "RTX4060-8GB": "RTX4060", "RTX4070-12GB": "RTX4070",
    "RTX4090-24GB": "RTX4090", "RTX5090-32GB": "RTX5090", "RTXA4000-16GB": "RTXA4000", "RTXA4500-20GB": "RTXA4500",
    "RTXA5000-24GB": "RTXA5000", "RTXA6000-48GB": "RTXA6000", "RTX6000ADA-48GB": "RTX6000-Ada",
    "RTXPRO6000-96GB": "RTXPRO6000",
}  # fmt: skip
# SkyPilot's clouds (sky/skylet/constants.py ALL_CLOUDS) and names tunecost's providers may use for them
SKYPILOT_CLOUDS = (
    "aws", "azure", "gcp", "ibm", "lambda", "scp", "oci", "kubernetes", "runpod", "vast", "vsphere", "cudo",
    "fluidstack", "paperspace", "primeintellect", "do", "nebius", "ssh", "slurm", "hyperbolic", "seeweb", "shadeform",
    "yotta", "mithril", "verda",
)  # fmt: skip
SKYPILOT_ALIASES = {"digitalocean": "do", "k8s": "kubernetes", "lambdalabs": "lambda", "datacrunch": "verda"}


def skypilot_cloud(provider: str) -> str | None:
    """SkyPilot's name for a provider ("runpod-secure" -> "runpod"), None where SkyPilot has no such cloud."""
    name = SKYPILOT_ALIASES.get(provider.lower(), provider.lower())
    head = re.split(r"[-_.]", name)[0]
    return name if name in SKYPILOT_CLOUDS else (head if head in SKYPILOT_CLOUDS else None)


def _skypilot(job: LaunchJob) -> dict[str, str]:
    """A SkyPilot task (sky/utils/schemas.py) whose run: starts the accelerate recipe written beside it."""
    gpu = resolve_gpu_name(job.gpu).gpu.name
    if gpu not in SKYPILOT_GPUS:
        raise _cannot("skypilot", f"SkyPilot's catalog has no accelerator for {gpu}")
    files = _accelerate(job)
    infra = {f"{c}/{region}" if region else c: None for p, region in job.clouds if (c := skypilot_cloud(p))}
    left_out = sorted({p for p, _ in job.clouds if skypilot_cloud(p) is None})
    resources: dict[str, Any] = {"accelerators": f"{SKYPILOT_GPUS[gpu]}:{job.gpus_on_node}"}
    resources["disk_size"] = job.disk_gb or SKYPILOT_DEFAULT_DISK_GB
    if infra:
        resources["any_of"] = [{"infra": i} for i in infra]
    packages = ["accelerate>=1.0", "transformers>=5.0,<6", "datasets>=3.0"]
    packages += ["peft>=0.17"] if job.method != "full" else []
    packages += ["bitsandbytes>=0.48"] if job.method == "qlora" or job.optimizer == "adamw-8bit" else []
    packages += ["deepspeed>=0.19"] if job.strategy in ZERO_STAGES else []
    run = ["set -e"]
    if job.num_nodes > 1:
        run += ['export NODE_RANK="$SKYPILOT_NODE_RANK"', f"export MASTER_PORT={MASTER_PORT}"]
        run += ['export MASTER_ADDR="$(echo "$SKYPILOT_NODE_IPS" | head -n1)"']
        run += ['export NUM_PROCESSES="$((SKYPILOT_NUM_NODES * SKYPILOT_NUM_GPUS_PER_NODE))"']
    task: dict[str, Any] = {
        "name": "tunecost-" + re.sub(r"[^a-z0-9]+", "-", job.model.lower()).strip("-"),
        "workdir": ".",
    }
    task |= {"num_nodes": job.num_nodes, "resources": resources}
    task["setup"] = f"pip install {' '.join(shlex.quote(p) for p in packages)}\n"
    task["run"] = "\n".join([*run, "bash launch.sh"]) + "\n"
    notes = [_summary(job), "workdir . (this folder and your train.py) goes to every node; run: starts launch.sh"]
    notes += [f"left out (no SkyPilot cloud): {', '.join(left_out)}"] if left_out else []
    files["sky.yaml"] = _yaml(task, notes)
    return files


RENDERERS: dict[str, Callable[[LaunchJob], dict[str, str]]] = {
    "accelerate": _accelerate,
    "torchtune": _torchtune,
    "llamafactory": _llamafactory,
    "skypilot": _skypilot,
}
