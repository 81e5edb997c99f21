"""What every recipe shares: the planned setup (`LaunchJob`), the targets, and YAML, JSON and shell writers."""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from tunecost.errors import TunecostError
from tunecost.models.projections import PROJECTIONS
from tunecost.workload.job import (
    ATTENTION_IMPLS,
    DEFAULT_DENSE_LORA_TARGETS,
    DTYPES,
    FP8_RECIPES,
    LORA_TARGETS,
    METHODS,
    OPTIMIZERS,
    PACKINGS,
)
from tunecost.workload.parallel import ParallelPlan

TARGETS = ("accelerate", "torchtune", "llamafactory", "skypilot")
FSDP_STRATEGIES = ("fsdp1", "fsdp2", "fsdp2-shard-grad-op", "hsdp")
ZERO_STAGES = {"zero1": 1, "zero2": 2, "zero3": 3}
DEFAULT_LORA_RANK = 16  # workload.job.LoraConfig's default (the paper's)
MAX_GRAD_NORM = 1.0  # TrainingArguments' default; the HF Trainer checks DeepSpeed's gradient_clipping against it
MASTER_PORT = 29500
SKYPILOT_DEFAULT_DISK_GB = 256  # sky/resources.py DEFAULT_DISK_SIZE_GB
LAUNCH_QUANT_TYPES = ("nf4", "fp4", "int8")  # the bitsandbytes base weights a recipe loads (qlora)
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
HF_OPTIM = {
    "adamw": "adamw_torch",
    "adamw-8bit": "paged_adamw_8bit",
    "adamw-4bit": "adamw_torch_4bit",
    "sgd": "sgd",
}  # transformers OptimizerNames
HF_ATTENTION = {"flash": "flash_attention_2", "sdpa": "sdpa", "eager": "eager"}  # from_pretrained attn_implementation
# LoRA targets as Llama-style module names (transformers 5: q/k/v/o_proj, gate/up/down_proj); MoE experts are fused
# 3-D parameters and the router a TopKRouter, so PEFT reaches them with target_parameters (as tunecost.moe does).
PEFT_MODULES = {**PROJECTIONS, **{name: (name,) for names in PROJECTIONS.values() for name in names}}
PEFT_PARAMETERS = {"experts": ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"), "router": ("mlp.gate.weight",)}


@dataclass(frozen=True, kw_only=True)
class LaunchJob:
    """The planned setup a recipe launches."""

    model: str  # hub id, e.g. "meta-llama/Llama-2-70b-hf"
    method: str  # full | lora | qlora
    lora_rank: int | None = None  # None: DEFAULT_LORA_RANK
    lora_alpha: float | None = None  # None: 2 x rank
    lora_dropout: float = 0.0  # PEFT's lora_dropout (its mask and dropped copy are in the planned memory)
    lora_targets: tuple[str, ...] = ()  # tunecost's LORA_TARGETS (groups or projections); (): attention + mlp
    quant_type: str = "nf4"  # qlora: nf4 | fp4 (4-bit) | int8 (LLM.int8, load_in_8bit)
    double_quant: bool = True
    dtype: str = "bf16"  # bf16 | fp16 | fp32
    fp32_params: bool = False  # full fine-tune: fp32 parameters under `dtype` autocast (torch AMP)
    gradient_checkpointing: bool = True
    attention: str = "sdpa"  # flash | sdpa | eager
    optimizer: str = "adamw"  # adamw | adamw-8bit | adamw-4bit | sgd
    packing: str = "none"  # none | per-document | cross-document: queries packed into rows of seq_len tokens
    torch_compile: bool = False  # the step under torch.compile
    liger_kernel: bool = False  # Liger's kernels (use_liger_kernel)
    fp8: str = "none"  # FP8 linears (workload.job.FP8_RECIPES); LLaMA-Factory's recipe writes rowwise and te-delayed
    seq_len: int
    micro_batch: int  # per GPU
    grad_accum: int = 1
    epochs: float = 1.0
    max_steps: int | None = None  # optimizer steps, where the plan priced a run given in steps (None: epochs)
    dataset: str | None = None  # a name or a local file
    gpu: str  # tunecost catalog GPU name, e.g. "H100-80GB-SXM"
    num_gpus: int = 1
    gpus_per_node: int = 8
    strategy: str = "single"  # single | ddp | fsdp1 | fsdp2 | fsdp2-shard-grad-op | hsdp | zero1 | zero2 | zero3
    offload: str = "none"  # none | optimizer (zero1-3) | params (zero3, fsdp1, fsdp2): CPU offload
    clouds: tuple[tuple[str, str], ...] = ()  # (provider, region) of the price rows the plan used; region may be ""
    disk_gb: int = 0  # disk for the weights (0: the recipe picks SkyPilot's default)
    fused_adamw: bool = False  # torch's fused AdamW (the HF Trainer's adamw_torch_fused), as the plan priced it
    base: Mapping[str, Any] = field(default_factory=dict)  # the user's config of the target framework to start from
    base_path: str = ""  # the file `base` was read from

    def __post_init__(self) -> None:
        choices = [("method", self.method, METHODS), ("quantization type", self.quant_type, LAUNCH_QUANT_TYPES)]
        choices += [("dtype", self.dtype, DTYPES), ("attention", self.attention, ATTENTION_IMPLS)]
        choices += [("optimizer", self.optimizer, OPTIMIZERS), ("packing", self.packing, PACKINGS)]
        choices += [("FP8 recipe", self.fp8, FP8_RECIPES)]
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


def _summary(job: LaunchJob) -> str:
    layout = f"{job.num_gpus} x {job.gpu} ({job.num_nodes} node{'s' if job.num_nodes > 1 else ''}), {job.strategy}"
    offload = f", offload {job.offload}" if job.offload != "none" else ""
    batch = f"micro-batch {job.micro_batch} x {job.grad_accum} accumulation"
    fp8 = f", FP8 {job.fp8}" if job.fp8 != "none" else ""
    return f"tunecost plan: {job.method}{fp8} of {job.model} on {layout}{offload}; {batch}"


def _nodes_note(job: LaunchJob) -> list[str]:
    return [] if job.num_nodes == 1 else ["run on every node with NODE_RANK, MASTER_ADDR (node 0's address) set"]
