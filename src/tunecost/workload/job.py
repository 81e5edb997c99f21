"""What job is being costed or measured: a frozen, keyword-only description that validates itself.

Defaults follow the paper's Mixtral setup (§III and the artifact): QLoRA with 4-bit nf4 experts and double
quantization, LoRA rank 16 (alpha 32) on the experts and the router, bf16 compute, FlashAttention-2,
gradient checkpointing, AdamW.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from tunecost.errors import TunecostError
from tunecost.limits import MAX_GRAD_ACCUM, MAX_LORA_ALPHA, check_count
from tunecost.models.projections import PROJECTIONS
from tunecost.workload.parallel import ParallelPlan
from tunecost.workload.stacks import STACK_SPECS, StackSpec

Method = Literal["full", "lora", "qlora"]
METHODS: tuple[str, ...] = ("full", "lora", "qlora")
# Parts of a model that can get LoRA adapters: four groups, or single projections of the attention and dense MLP
# groups (`PROJECTIONS`). The simulator models all; the MoE installer that a profile uses (tunecost.moe) puts
# adapters on the MoE layers only, so it accepts the MOE_LORA_TARGETS subset.
LORA_TARGETS = ("attention", "experts", "router", "mlp", *PROJECTIONS["attention"], *PROJECTIONS["mlp"])
MOE_LORA_TARGETS: tuple[str, ...] = ("experts", "router")
# LoRA targets when none are named: the paper's for an MoE model (its experts and router), and what PEFT users
# adapt in a dense model (the attention projections q, k, v, o and the MLP's gate, up, down).
DEFAULT_MOE_LORA_TARGETS: tuple[str, ...] = MOE_LORA_TARGETS
DEFAULT_DENSE_LORA_TARGETS: tuple[str, ...] = ("attention", "mlp")
# Named software stacks the step simulator reproduces (`workload.stacks`)
STACKS: tuple[str, ...] = tuple(STACK_SPECS)
DEFAULT_STACK = "tunecost"
DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp32")
# bitsandbytes nf4/fp4; GPTQ int4 (auto-gptq layout); bitsandbytes LLM.int8 (load_in_8bit: 8-bit LoRA)
QUANT_TYPES: tuple[str, ...] = ("nf4", "fp4", "gptq", "int8")
# How a GPTQ checkpoint's int4 weights meet the matmul (see tunecost.simulate.gptq): "triton-v2" de-quantizes each
# matrix into a temporary freed after the matmul (forward and backward); "torch" is auto-gptq's un-fused torch path
# (QuantLinear cuda-old without a CUDA kernel), whose de-quantized fp16 weight the matmul keeps for backward.
GPTQ_KERNELS: tuple[str, ...] = ("triton-v2", "torch")
ATTENTION_IMPLS: tuple[str, ...] = ("flash", "sdpa", "eager")
OPTIMIZERS: tuple[str, ...] = ("adamw", "adamw-8bit", "adamw-4bit", "sgd")
LOW_BIT_ADAMW: tuple[str, ...] = ("adamw-8bit", "adamw-4bit")  # bitsandbytes' 8-bit, torchao's 4-bit: GPU-only steps
# FP8 training of the linear layers' GEMMs (docs/fp8.md): "none"; torchao float8 with dynamic scaling, one scale
# per tensor ("tensorwise", torchao's and torchtitan's default) or per row ("rowwise"); Transformer Engine's
# per-tensor delayed scaling ("te-delayed", NeMo/Megatron's default FP8 recipe: FP8 weight copies cached per linear).
FP8_RECIPES: tuple[str, ...] = ("none", "tensorwise", "rowwise", "te-delayed")
TORCHAO_FP8_RECIPES: tuple[str, ...] = ("tensorwise", "rowwise")  # torchao Float8Linear (float8_linear.py)
# Queries concatenated into rows of seq_len tokens (docs/throughput-model.md, packing): "none" (each query its own
# row, padded); "per-document" (attention within each query: flash-attn varlen, flex or block masks);
# "cross-document" (one causal mask over the whole row).
PACKINGS: tuple[str, ...] = ("none", "per-document", "cross-document")
BYTES_PER_DTYPE = {"bf16": 2, "fp16": 2, "fp32": 4}
AMP_STRATEGIES = ("single", "ddp")  # the layouts a step under autocast with fp32 parameters runs on
# FSDP over fp32 parameters whose gathered copies compute in the compute dtype (MixedPrecisionPolicy param_dtype):
# fp32 shards (a full fine-tune's gradients and AdamW states too), no autocast (docs/memory-model.md)
FSDP_FP32_STRATEGIES = ("fsdp2", "fsdp1", "hsdp", "fsdp2-shard-grad-op")
RECORD_KEYS = ("model", "method", "experts_per_token", "seq_len", "dataset")  # FineTuneJob.record_keys


def _check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
        hint = f" did you mean {close[0]!r}?" if close else ""
        raise TunecostError(f"unsupported {what} {value!r};{hint} supported: {', '.join(choices)}")


def fp32_strategies(method: str) -> tuple[str, ...]:
    """The strategies that keep a job's parameters in fp32 (`FineTuneJob.fp32_params`): autocast on one GPU or
    DDP, FSDP's mixed precision (full fine-tune and LoRA; QLoRA's base weights are 4-bit)."""
    return () if method == "qlora" else (*AMP_STRATEGIES, *FSDP_FP32_STRATEGIES)


def default_gradient_checkpointing(method: str, selective_recompute: bool = False) -> bool:
    """Checkpointing when the user does not say: on for LoRA and QLoRA, off for a full fine-tune (the paper's
    Mixtral QLoRA and BlackMamba full runs), and off beside selective recomputation."""
    return method != "full" and not selective_recompute


def default_lora_targets(*, is_moe: bool) -> tuple[str, ...]:
    """The LoRA targets of a model's anatomy when the user names none (see DEFAULT_*_LORA_TARGETS)."""
    return DEFAULT_MOE_LORA_TARGETS if is_moe else DEFAULT_DENSE_LORA_TARGETS


def check_lora_targets(targets: tuple[str, ...], *, model: str, is_moe: bool) -> None:
    """A dense model has no experts or router to adapt."""
    moe_only = sorted(set(targets) & set(MOE_LORA_TARGETS))
    if moe_only and not is_moe:
        raise TunecostError(
            f"LoRA target(s) {', '.join(moe_only)} do not apply to {model}: it is a dense model with no MoE layers; "
            f"use --lora-targets {','.join(DEFAULT_DENSE_LORA_TARGETS)}"
        )


def quant_defaults(model: str, quant_type: str | None, gptq_group_size: int | None) -> tuple[str, int]:
    """The 4-bit storage type and GPTQ group size of a QLoRA job on `model` when not given: a GPTQ checkpoint of
    the catalog (e.g. TheBloke/Mistral-7B-v0.1-GPTQ) is gptq with its quantize_config's group size, any other model
    nf4 (group size 128, unused)."""
    from tunecost.models.catalog import gptq_checkpoint

    checkpoint = gptq_checkpoint(model)
    kind = quant_type or ("gptq" if checkpoint is not None else "nf4")
    group = gptq_group_size if gptq_group_size is not None else (checkpoint.group_size if checkpoint else 128)
    return kind, group


def parse_names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names ("embed_tokens,lm_head"), empty entries dropped."""
    return tuple(t.strip() for t in text.split(",") if t.strip())


def parse_lora_targets(text: str) -> tuple[str, ...]:
    """A comma-separated list of LoRA targets ("attention,mlp"), each checked, none twice."""
    targets = tuple(t.strip() for t in text.split(",") if t.strip())
    if not targets:
        raise TunecostError(f"LoRA needs at least one target ({', '.join(LORA_TARGETS)})")
    for t in targets:
        _check_choice("LoRA target", t, LORA_TARGETS)
    if len(set(targets)) != len(targets):
        raise TunecostError(f"a LoRA target is named twice: {', '.join(targets)}")
    _check_groups(targets)
    return targets


def group_targets(group: str, names: set[str]) -> tuple[str, ...]:
    """The LoRA targets for module names of one group as a config lists them: none for no names; those projections
    where each is one of the group's Llama-style projections (`PROJECTIONS`) and they are not all of them; else the
    whole group."""
    own = PROJECTIONS.get(group, ())
    if not names:
        return ()
    return tuple(n for n in own if n in names) if names < set(own) else (group,)


def targets_text(targets: Collection[str]) -> str:
    """LoRA targets as the --lora-targets value: groups first (attention, mlp, experts, router), then projections."""
    order = ("attention", "mlp", "experts", "router", *PROJECTIONS["attention"], *PROJECTIONS["mlp"])
    return ",".join(t for t in order if t in targets)


def _check_groups(targets: tuple[str, ...]) -> None:
    for group, names in PROJECTIONS.items():
        inside = [t for t in targets if t in names]
        if group in targets and inside:
            raise TunecostError(f"LoRA target {inside[0]} is part of {group}, named too: {', '.join(targets)}")


@dataclass(frozen=True, kw_only=True)
class LoraConfig:
    """LoRA adapters: rank, scaling alpha, which parts of the model get them, and the dropout on their input."""

    rank: int = 16
    alpha: float = 32.0
    targets: tuple[str, ...] = ("experts", "router")
    dropout: float = 0.0  # PEFT's lora_dropout: a mask and a dropped copy of each adapter's input

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise TunecostError(f"LoRA rank must be >= 1, got {self.rank}")
        if not (math.isfinite(self.alpha) and 0 < self.alpha <= MAX_LORA_ALPHA):
            raise TunecostError(f"LoRA alpha must be a positive number at most {MAX_LORA_ALPHA:g}, got {self.alpha!r}")
        if not self.targets:
            raise TunecostError("LoRA needs at least one target (attention, experts, router, mlp)")
        if not (math.isfinite(self.dropout) and 0 <= self.dropout < 1):
            raise TunecostError(f"LoRA dropout (--lora-dropout) must be at least 0 and below 1, got {self.dropout!r}")
        for t in self.targets:
            _check_choice("LoRA target", t, LORA_TARGETS)
        _check_groups(self.targets)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def adapted(self, group: str) -> tuple[str, ...]:
        """The projections of `group` (attention, mlp) that get adapters: all of them when the group is a target."""
        names = PROJECTIONS[group]
        return names if group in self.targets else tuple(n for n in names if n in self.targets)


@dataclass(frozen=True, kw_only=True)
class FineTuneJob:
    """One fine-tuning configuration of one model at one batch shape.

    Sequence length: either a fixed `seq_len` (every query padded or cut to it, as the paper's latency runs)
    or the lengths of a dataset (`lengths`, tokens per query), batched by padding to the longest in batch, or
    (for the throughput model) only the name of a dataset whose length distribution the catalog describes.
    Several GPUs and how the job is spread over them are the job's `parallel` layout (one GPU by default).
    """

    model: str  # catalog name, local config path or cached hub id (see tunecost.models.catalog)
    method: Method = "qlora"
    lora: LoraConfig = field(default_factory=LoraConfig)
    experts_per_token: int | None = None  # None: the model's own top-k; num_experts: dense
    compute_dtype: str = "bf16"
    # the model's weights in fp32 (a full fine-tune's gradients and AdamW states too), the step under autocast in
    # compute_dtype (torch AMP: LLaMA-Factory's upcast without pure_bf16, TRL's fp32 load, litgpt's bf16-mixed)
    fp32_params: bool = False
    quant_type: str = "nf4"  # base weights of qlora: nf4 / fp4 (bitsandbytes), gptq (a checkpoint), int8 (LLM.int8)
    double_quant: bool = True  # bitsandbytes only
    gptq_group_size: int = 128  # gptq only: inputs per scale/zero group (-1: one group over all inputs)
    gptq_kernel: str = "triton-v2"  # gptq only: one of GPTQ_KERNELS
    gradient_checkpointing: bool = True
    attention: str = "flash"
    optimizer: str = "adamw"
    batch_size: int = 1
    # micro-batches accumulated per optimizer step: the step's time counts the optimizer once per grad_accum of them
    grad_accum: int = 1
    seq_len: int | None = 512
    lengths: tuple[int, ...] | None = None  # per-query token counts of a dataset
    dataset: str | None = None  # name of the dataset (the lengths came from, or whose length distribution applies)
    parallel: ParallelPlan = field(default_factory=ParallelPlan)  # GPUs, GPUs per node, strategy
    stack: str = DEFAULT_STACK  # the named software stack, one of STACKS
    # Modules trained fully beside LoRA (PEFT's modules_to_save, e.g. ("embed_tokens", "lm_head")): each keeps
    # its frozen original and gets a trainable copy with its gradient and optimizer states.
    modules_to_save: tuple[str, ...] = ()
    fp8: str = "none"  # FP8 linear GEMMs, one of FP8_RECIPES (the GPU needs FP8 tensor cores)
    fp8_params: bool = False  # te-delayed: the linears' weights kept in FP8 only (TE fp8_model_init)
    # the core attention recomputed in backward (Megatron's selective recomputation), the rest of each layer kept
    selective_recompute: bool = False
    # under gradient checkpointing, how many decoder layers recompute their forward (Megatron's block method,
    # torchtitan's every-Nth-layer); None: every layer
    recompute_layers: int | None = None
    packing: str = "none"  # one of PACKINGS: rows of seq_len tokens, each holding several queries
    # the step under torch.compile (Inductor): the throughput model fuses the element-wise work; memory is eager's
    torch_compile: bool = False
    # Liger's kernels as use_liger_kernel applies them (RMSNorm, SwiGLU/GEGLU, RoPE, fused linear cross-entropy)
    liger_kernel: bool = False

    def __post_init__(self) -> None:
        _check_choice("method", self.method, METHODS)
        _check_choice("compute dtype", self.compute_dtype, DTYPES)
        _check_choice("quantization type", self.quant_type, QUANT_TYPES)
        _check_choice("attention implementation", self.attention, ATTENTION_IMPLS)
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        if self.batch_size < 1:
            raise TunecostError(f"batch size must be >= 1, got {self.batch_size}")
        check_count("gradient accumulation (--grad-accum)", self.grad_accum, MAX_GRAD_ACCUM)
        if self.seq_len is None and not self.lengths and self.dataset is None:
            raise TunecostError("give a sequence length, a dataset's lengths or a dataset")
        if self.seq_len is not None and self.seq_len < 1:
            raise TunecostError(f"sequence length must be >= 1, got {self.seq_len}")
        if self.lengths is not None and any(n < 1 for n in self.lengths):
            raise TunecostError("every query length must be >= 1 token")
        if self.experts_per_token is not None and self.experts_per_token < 1:
            raise TunecostError(f"experts per token must be >= 1, got {self.experts_per_token}")
        _check_choice("software stack", self.stack, STACKS)
        _check_choice("GPTQ kernel", self.gptq_kernel, GPTQ_KERNELS)
        if self.gptq_group_size != -1 and self.gptq_group_size < 1:
            raise TunecostError(f"GPTQ group size must be >= 1 or -1 (one group), got {self.gptq_group_size}")
        if self.quant_type == "gptq" and self.method == "qlora" and self.compute_dtype != "fp16":
            raise TunecostError(
                f"GPTQ int4 weights compute in fp16 (auto-gptq's kernels), not {self.compute_dtype}; use --dtype fp16"
            )
        _check_choice("FP8 recipe (--fp8)", self.fp8, FP8_RECIPES)
        if self.fp8 != "none" and self.method == "qlora":
            raise TunecostError(
                "--fp8: FP8 training does not apply to QLoRA (quantized base weights); use lora or full"
            )
        if self.liger_kernel and not self.stack_spec.liger:
            raise TunecostError(
                f"--liger-kernel: Liger's kernels are applied by the HF Trainer (TRL, axolotl, LLaMA-Factory), not "
                f"stack {self.stack}"
            )
        if self.fp8_params and self.fp8 != "te-delayed":
            raise TunecostError("--fp8-params: FP8 primary weights are Transformer Engine's; use --fp8 te-delayed")
        if self.fp8 != "none" and self.compute_dtype == "fp32":
            raise TunecostError("--fp8: FP8 training runs beside bf16/fp16 compute, not fp32; use --dtype bf16")
        self._check_fp32_params()
        if self.selective_recompute and self.gradient_checkpointing:
            raise TunecostError(
                "--selective-recompute recomputes the core attention only; gradient checkpointing already recomputes "
                "the whole layer: give one (--no-gradient-checkpointing)"
            )
        if self.recompute_layers is not None:
            if self.recompute_layers < 1:
                raise TunecostError(f"--recompute-layers must be >= 1, got {self.recompute_layers}")
            if not self.gradient_checkpointing:
                raise TunecostError(
                    "--recompute-layers counts the checkpointed layers: it needs gradient checkpointing"
                )
        _check_choice("packing (--packing)", self.packing, PACKINGS)
        if self.packing != "none" and self.seq_len is None:
            raise TunecostError("--packing packs queries into rows of --seq-len tokens: give --seq-len")
        if self.modules_to_save and self.method == "full":
            raise TunecostError("modules_to_save applies beside LoRA; a full fine-tune already trains every module")
        if len(set(self.modules_to_save)) != len(self.modules_to_save):
            raise TunecostError(f"a module to save is named twice: {', '.join(self.modules_to_save)}")

    def _check_fp32_params(self) -> None:
        if not self.fp32_params:
            return
        if self.method == "qlora":
            raise TunecostError("--fp32-params keeps the model's weights in fp32; QLoRA's base weights are 4-bit: "
                                "use --method full or lora")  # fmt: skip
        if self.compute_dtype == "fp32" or self.fp8 != "none":
            raise TunecostError("--fp32-params runs the step under bf16 or fp16 autocast: use --dtype bf16 or fp16, "
                                "without --fp8")  # fmt: skip
        plan = self.parallel
        if plan.strategy not in fp32_strategies(self.method):
            raise TunecostError(
                f"--fp32-params with layout {plan.layout_name}: DeepSpeed and Megatron keep their own fp32 copy beside "
                "compute-dtype parameters; --fp32-params is one GPU, DDP or FSDP"
            )
        if plan.tp * plan.pp * plan.cp * plan.expert_parallel > 1:
            raise TunecostError(
                f"--fp32-params with layout {plan.layout_name}: fp32 parameters beside TP, PP, CP or expert "
                "parallelism are not modelled; drop --fp32-params (--dtype fp32 bounds them)"
            )

    def recomputed_share(self, num_layers: int) -> float:
        """The share of the model's `num_layers` decoder layers whose forward runs again in backward."""
        if not self.gradient_checkpointing:
            return 0.0
        if self.recompute_layers is None:
            return 1.0
        if self.recompute_layers > num_layers:
            raise TunecostError(
                f"--recompute-layers {self.recompute_layers}: the model has {num_layers} layers; give at most that"
            )
        return self.recompute_layers / num_layers

    @property
    def base_quant(self) -> str | None:
        """How the frozen base weights are stored: the quantization type under qlora, None otherwise."""
        return self.quant_type if self.method == "qlora" else None

    @property
    def stack_spec(self) -> StackSpec:
        """What the job's software stack does differently (`workload.stacks`)."""
        return STACK_SPECS[self.stack]

    @property
    def compute_bytes_per_element(self) -> int:
        return BYTES_PER_DTYPE[self.compute_dtype]

    @property
    def param_bytes_per_element(self) -> int:
        """Bytes per trained parameter (and its gradient and each AdamW state) of a full fine-tune."""
        return BYTES_PER_DTYPE["fp32"] if self.fp32_params else self.compute_bytes_per_element

    @property
    def worst_case_seq_len(self) -> int:
        """The padded length of the longest batch: what decides whether a batch fits in memory."""
        if self.seq_len is not None:
            return self.seq_len
        if not self.lengths:
            raise TunecostError(
                f"{self.model}: the dataset {self.dataset} gives no longest query; give a sequence length or the "
                "dataset's lengths"
            )
        return max(self.lengths)

    def with_(self, **changes: Any) -> FineTuneJob:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The job as plain JSON-able values (`from_dict` reads it back)."""
        return asdict(self)

    def record_keys(self) -> dict[str, Any]:
        """The keys that a measurement or an estimate of this job is recorded under (docs/dev/records.md)."""
        return {name: getattr(self, name) for name in RECORD_KEYS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FineTuneJob:
        """The job `to_dict` wrote, also after a JSON round trip (lists back to tuples); an unknown field is an
        error."""
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise TunecostError(f"unknown job field(s) {', '.join(unknown)}")
        values = dict(data)
        if isinstance(values.get("lora"), Mapping):
            lora = dict(values["lora"])
            values["lora"] = LoraConfig(**{**lora, "targets": tuple(lora.get("targets", LoraConfig().targets))})
        if isinstance(values.get("parallel"), Mapping):
            values["parallel"] = ParallelPlan(**values["parallel"])
        if values.get("lengths") is not None:
            values["lengths"] = tuple(values["lengths"])
        if values.get("modules_to_save") is not None:
            values["modules_to_save"] = tuple(values["modules_to_save"])
        return cls(**values)
