"""Work per training step, split by op class: FLOPs, bytes moved, kernel launches, GEMM problem size (sources and
derivations: docs/throughput-model.md, section `tunecost.estimate.throughput.counts`)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from tunecost.errors import TunecostError
from tunecost.estimate.throughput.fp8 import fp8_cast_bytes, fp8_cast_kernels
from tunecost.estimate.throughput.lengths import SeqLengths, empirical_lengths, fixed_lengths
from tunecost.estimate.throughput.lora_counts import adapter_params, add_lora, saved_modules
from tunecost.estimate.throughput.mixers import BWD_BYTES_PER_FWD_BYTE, BWD_KERNELS_PER_FWD_KERNEL, add_mixers
from tunecost.estimate.throughput.packing import job_packed_lengths
from tunecost.estimate.throughput.quant_counts import add_dequant, add_int8
from tunecost.models.arch import Arch
from tunecost.models.catalog import ModelSpec
from tunecost.models.families import arch_of
from tunecost.workload.job import TORCHAO_FP8_RECIPES, FineTuneJob
from tunecost.workload.liger import flce_chunk_rows, liger_loss_applies, liger_patches
from tunecost.workload.op_classes import OP_CLASSES

GEMM_CLASSES = ("expert_matmul", "dense_matmul", "lm_head", "router", "lora")
TENSOR_CORE = "bf16_tensor"
FP8_TENSOR_CORE = "fp8_tensor"  # the linear layers' GEMMs under --fp8 (docs/fp8.md)
CUDA_CORE = "fp32"

EXPERT_ACT_BYTES_PER_FFN = 10  # act(gate) and gate * up on the expert's tokens
EXPERT_DISPATCH_BYTES_PER_HIDDEN = 14  # gather tokens, * routing weight, index_add back
EXPERT_DISPATCH_KERNELS = 9  # where (nonzero: a host sync), index, act, mul, weight index + mul, index_add, cast
ROUTER_KERNELS = 10  # softmax in fp32, topk, renormalise, cast, one_hot, permute
ROUTER_FLOPS_PER_LOGIT = 10  # softmax, top-k, renormalisation
LOSS_BYTES_PER_VOCAB = 26  # logits upcast to fp32, log-softmax, NLL, and their backward
LOSS_KERNELS = 12
# Liger's fused linear cross-entropy: per chunk of `flce_chunk_rows` tokens, the logits GEMM, one kernel that reads
# the logits and writes their gradient over them (bf16: 2 + 2 bytes), the grad-input GEMM (+ grad-weight GEMM)
FLCE_BYTES_PER_VOCAB = 4
FLCE_KERNELS_PER_CHUNK = 2  # the cross-entropy kernel and the slice copy of the chunk's loss
ADAMW_ACCESSES_PER_PARAM = 20  # foreach AdamW: lerp m, v*b2 + g^2, sqrt/div/add eps, decay, addcdiv (reads+writes)
CLIP_ACCESSES_PER_PARAM = 3  # gradient-norm clipping: norm (read), scale (read + write)
ADAMW_FOREACH_OPS = 12
FOREACH_TENSORS_PER_LAUNCH = 32
ADAMW_FLOPS_PER_PARAM = 15
# Where the host waits for the GPU (see `throughput.model.step_time`): in every MoE layer of an eager routed-expert
# loop (`torch.where`/`nonzero` on the routing results reads token counts back), so host and GPU time add; or
# only between micro-steps (a dense forward/backward never reads a GPU value; the trainer's loss check does).
SYNC_PER_MOE_LAYER = "per MoE layer"
SYNC_PER_MICRO_STEP = "per micro-step"
# LLM.int8's outlier check (`if outliers.any()`) reads a GPU value in every quantized linear's forward
SYNC_PER_QUANT_LINEAR = "per 8-bit linear"


@dataclass(frozen=True, kw_only=True)
class AnalyticStepCounts:
    """One training step's work per op class (see OP_CLASSES); all values are per step."""

    flops_by_class: Mapping[str, float]
    bytes_by_class: Mapping[str, float]
    kernels_by_class: Mapping[str, float]
    gemm_rows_by_class: Mapping[str, float]  # problem size: rows (tokens) per GEMM/attention call
    peak_by_class: Mapping[str, str]  # which peak bounds the class's FLOPs: TENSOR_CORE or CUDA_CORE
    batch_size: int
    tokens_per_step: float
    lengths: SeqLengths
    source: str = "analytic"
    notes: tuple[str, ...] = field(default_factory=tuple)
    host_sync: str = SYNC_PER_MOE_LAYER  # where the host waits for the GPU: SYNC_PER_MOE_LAYER or _PER_MICRO_STEP

    @property
    def queries_per_step(self) -> float:
        """Queries one step trains: a query per row, or the queries a packed row holds."""
        return self.batch_size * self.lengths.queries_per_row

    @property
    def total_flops(self) -> float:
        return sum(self.flops_by_class.values())

    @property
    def total_bytes(self) -> float:
        return sum(self.bytes_by_class.values())

    @property
    def total_kernels(self) -> float:
        return sum(self.kernels_by_class.values())


def lengths_of_job(job: FineTuneJob) -> SeqLengths:
    """The job's own lengths: its packed rows, else its fixed seq_len, else its dataset lengths (padded to the
    longest per batch)."""
    if job.packing != "none":
        return job_packed_lengths(job)
    if job.seq_len is not None:
        return fixed_lengths(job.seq_len, job.batch_size)
    assert job.lengths
    return empirical_lengths(job.lengths, job.batch_size, source=f"{job.dataset or 'dataset'} lengths")


def experts_hit(num_experts: int, experts_per_token: int, tokens: float) -> float:
    """Expected experts with at least one token in a layer under uniform top-k routing."""
    if num_experts <= 1:
        return 1.0
    return num_experts * (1.0 - (1.0 - experts_per_token / num_experts) ** tokens)


class OpTally:
    """FLOPs, bytes and kernels per op class, added up term by term."""

    def __init__(self) -> None:
        self.flops: dict[str, float] = defaultdict(float)
        self.bytes: dict[str, float] = defaultdict(float)
        self.kernels: dict[str, float] = defaultdict(float)

    def add(self, cls: str, *, flops: float = 0.0, bytes_: float = 0.0, kernels: float = 0.0) -> None:
        self.flops[cls] += flops
        self.bytes[cls] += bytes_
        self.kernels[cls] += kernels


def analytic_step_counts(
    spec: ModelSpec,
    job: FineTuneJob,
    lengths: SeqLengths | None = None,
    *,
    te_layers: bool = False,
    lora_compute_dtype: bool = False,
) -> AnalyticStepCounts:
    """Count one step of `job` on `spec` (see docs/throughput-model.md for the stack it describes; `te_layers`:
    the element-wise work of Megatron Core's Transformer Engine layers instead of transformers' eager ones;
    `lora_compute_dtype`: LoRA adapters in the compute dtype instead of PEFT's fp32 ones)."""
    arch = arch_of(spec)
    lengths = lengths or lengths_of_job(job)
    if lengths.batch_size != job.batch_size:
        raise TunecostError(f"lengths are for batch {lengths.batch_size}, the job for batch {job.batch_size}")
    k = spec.top_k(job.experts_per_token)
    if arch.num_experts > 1 and not 1 <= k <= arch.num_experts:
        raise TunecostError(f"{spec.name}: experts per token must be in 1..{arch.num_experts}, got {k}")
    tokens = lengths.tokens_per_step
    acc = OpTally()
    gc = job.recomputed_share(spec.num_layers)  # the share of the layers whose forward runs again
    full = job.method == "full"
    w_bytes = job.compute_bytes_per_element
    frozen_passes = 1.0 + gc + 1.0  # forward, recompute, grad-input
    base_passes = frozen_passes + (1.0 if full else 0.0)  # + grad-weight when the base weights train
    fwd_passes = 1.0 + gc  # element-wise and dispatch ops run forward again under recompute
    hit = experts_hit(arch.num_experts, k, tokens) if arch.num_experts > 1 else 0.0
    rows_expert = tokens * k / hit if hit else 0.0
    if arch.num_experts > 1:
        _add_experts(acc, arch, tokens=tokens, k=k, hit=hit, w_bytes=w_bytes, passes=(base_passes, fwd_passes))

    # Liger's fused linear cross-entropy: the head's GEMMs per chunk of this many tokens (None: the whole step)
    head_rows = (
        flce_chunk_rows(math.ceil(tokens), arch.hidden, spec.vocab_size)
        if job.liger_kernel and liger_loss_applies(spec.family)
        else None
    )
    _add_dense_and_head(acc, arch, spec, job, tokens=tokens, w_bytes=w_bytes, frozen_passes=frozen_passes,
                        chunk_rows=head_rows)  # fmt: skip
    if job.base_quant == "int8":
        if arch.num_experts > 1:
            raise TunecostError(f"{spec.name}: 8-bit (LLM.int8) base weights are modelled for dense models")
        add_int8(acc, arch, tokens=tokens, w_bytes=w_bytes, passes=(frozen_passes, fwd_passes))
    elif job.base_quant is not None:
        add_dequant(acc, arch, job, hit=hit, w_bytes=w_bytes, passes=(frozen_passes, fwd_passes))
    add_lora(acc, arch, job, tokens=tokens, k=k, hit=hit, gc=gc, compute_dtype=lora_compute_dtype)
    eager, selective = job.attention == "eager", job.selective_recompute
    fused = te_layers or job.torch_compile  # Inductor fuses each norm, rotary and residual chain as TE's layers do
    liger = job.liger_kernel and liger_patches(spec.family) and not fused  # Liger's norm and rotary kernels
    add_mixers(acc, arch, lengths, gc=gc, w_bytes=w_bytes, fused=fused, liger=liger, selective=selective, eager=eager)
    _add_optimizer(acc, arch, job, lora_compute_dtype)
    if job.fp32_params:
        _add_amp_casts(acc, arch, job)
    if job.fp8 != "none":
        _add_fp8_casts(acc, arch, job, tokens=tokens, k=k, hit=hit, gc=gc)
    lora_rows = rows_expert if "experts" in job.lora.targets and arch.num_experts > 1 else tokens
    rows = {
        "expert_matmul": rows_expert,
        "dense_matmul": tokens,
        "lm_head": min(tokens, head_rows) if head_rows else tokens,
        "router": tokens,
        "lora": lora_rows,
        "attention": lengths.padded_len_tokens,
        "ssm_scan": tokens,
    }
    return AnalyticStepCounts(
        flops_by_class=MappingProxyType({c: acc.flops.get(c, 0.0) for c in OP_CLASSES}),
        bytes_by_class=MappingProxyType({c: acc.bytes.get(c, 0.0) for c in OP_CLASSES}),
        kernels_by_class=MappingProxyType({c: acc.kernels.get(c, 0.0) for c in OP_CLASSES}),
        gemm_rows_by_class=MappingProxyType(rows),
        peak_by_class=MappingProxyType(peaks_of(job.fp8, job.compute_dtype)),
        batch_size=job.batch_size,
        tokens_per_step=tokens,
        lengths=lengths,
        source="analytic",
        host_sync=_host_sync(arch, job),
    )


def _add_dense_and_head(
    acc: OpTally,
    arch: Arch,
    spec: ModelSpec,
    job: FineTuneJob,
    *,
    tokens: float,
    w_bytes: int,
    frozen_passes: float,
    chunk_rows: int | None = None,
) -> None:
    """The matmuls outside the experts, the output head and the loss (`chunk_rows`: Liger's fused linear
    cross-entropy, the head's GEMMs per chunk of that many tokens, each re-reading the head's weight)."""
    full = job.method == "full"
    # Every other matmul weight (attention or Mamba projections, shared experts, dense MLPs); torchao's Float8Linear
    # runs the grad-weight GEMM of a frozen weight too (docs/fp8.md).
    dense_passes = frozen_passes + (1.0 if full or job.fp8 in TORCHAO_FP8_RECIPES else 0.0)
    acc.add(
        "dense_matmul",
        flops=dense_passes * 2.0 * tokens * arch.dense_params,
        bytes_=dense_passes * (arch.dense_params * w_bytes + tokens * arch.dense_in_out * w_bytes),
        kernels=dense_passes * arch.num_dense_matrices,
    )
    # Output head (not recomputed; tied to the embedding in BlackMamba, which trains under full FT).
    head_passes = 2.0 + (1.0 if full or saved_modules(job)[1] else 0.0)
    chunks = math.ceil(tokens / chunk_rows) if chunk_rows else 1
    acc.add(
        "lm_head",
        flops=head_passes * 2.0 * tokens * arch.lm_head_params,
        bytes_=head_passes
        * (chunks * arch.lm_head_params * w_bytes + tokens * (arch.hidden + spec.vocab_size) * w_bytes),
        kernels=head_passes * chunks,
    )
    if chunk_rows:
        acc.add(
            "elementwise",
            bytes_=tokens * spec.vocab_size * FLCE_BYTES_PER_VOCAB,
            kernels=chunks * FLCE_KERNELS_PER_CHUNK,
        )
    else:
        acc.add("elementwise", bytes_=tokens * spec.vocab_size * LOSS_BYTES_PER_VOCAB, kernels=LOSS_KERNELS)


def peaks_of(fp8: str, compute_dtype: str = "bf16") -> dict[str, str]:
    """Which peak bounds each op class's FLOPs: the tensor cores for GEMMs and attention (FP8 ones for the linear
    layers' GEMMs under an FP8 recipe), the fp32 rate for the rest and for every class of an fp32 step (torch's
    matmuls do not use TF32 unless allowed)."""
    tensor = () if compute_dtype == "fp32" else ("expert_matmul", "dense_matmul", "lm_head", "router", "attention")
    peaks = {c: (TENSOR_CORE if c in tensor else CUDA_CORE) for c in OP_CLASSES}
    if fp8 != "none":
        peaks.update({c: FP8_TENSOR_CORE for c in fp8_classes(fp8)})
    return peaks


def _add_experts(
    acc: OpTally, arch: Arch, *, tokens: float, k: int, hit: float, w_bytes: int, passes: tuple[float, float]
) -> None:
    """Routed experts: one GEMM per expert matrix per hit expert, weights re-read on every pass; the router and
    the dispatch around them."""
    base_passes, fwd_passes = passes
    acc.add(
        "expert_matmul",
        flops=base_passes * 2.0 * tokens * k * arch.expert_params * arch.num_moe_layers,
        bytes_=base_passes
        * arch.num_moe_layers
        * (hit * arch.expert_params * w_bytes + tokens * k * arch.expert_in_out * w_bytes),
        kernels=base_passes * arch.num_moe_layers * hit * arch.num_expert_matrices,
    )
    router_params = arch.num_moe_layers * arch.router_params_per_layer
    acc.add(
        "router",
        flops=base_passes * 2.0 * tokens * router_params
        + fwd_passes * arch.num_moe_layers * tokens * arch.num_experts * ROUTER_FLOPS_PER_LOGIT,
        bytes_=base_passes * (router_params * w_bytes + arch.num_moe_layers * tokens * arch.hidden * w_bytes)
        + (fwd_passes + BWD_BYTES_PER_FWD_BYTE)
        * arch.num_moe_layers
        * tokens
        * k
        * arch.hidden
        * EXPERT_DISPATCH_BYTES_PER_HIDDEN,
        kernels=base_passes * arch.num_moe_layers
        + (fwd_passes + BWD_KERNELS_PER_FWD_KERNEL)
        * arch.num_moe_layers
        * (ROUTER_KERNELS + hit * EXPERT_DISPATCH_KERNELS),
    )
    acc.add(
        "elementwise",
        bytes_=(fwd_passes + BWD_BYTES_PER_FWD_BYTE)
        * arch.num_moe_layers
        * tokens
        * k
        * arch.expert_ffn
        * EXPERT_ACT_BYTES_PER_FFN,
    )


def _host_sync(arch: Arch, job: FineTuneJob) -> str:
    if arch.num_experts > 1:
        return SYNC_PER_MOE_LAYER
    return SYNC_PER_QUANT_LINEAR if job.base_quant == "int8" else SYNC_PER_MICRO_STEP


def fp8_classes(recipe: str) -> tuple[str, ...]:
    """Op classes whose GEMMs run in FP8: the dense linears (torchao's Float8Linear swaps nn.Linear only), and the
    routed experts under Transformer Engine (Megatron's grouped linears); never the head, router, LoRA factors or
    attention's BMMs."""
    return ("dense_matmul", "expert_matmul") if recipe == "te-delayed" else ("dense_matmul",)


def _add_fp8_casts(acc: OpTally, arch: Arch, job: FineTuneJob, *, tokens: float, k: int, hit: float, gc: float) -> None:
    """The casts around the FP8 GEMMs (`fp8_classes`): the dense linears, and under Transformer Engine the routed
    experts; input and grad-output elements split evenly between a linear's in and out sides (docs/fp8.md)."""
    experts = float("expert_matmul" in fp8_classes(job.fp8))
    # FP8 primary weights are FP8 already: no weight cast
    weight_elems = (
        0.0 if job.fp8_params else arch.dense_params + experts * arch.num_moe_layers * hit * arch.expert_params
    )
    token_io = tokens * arch.dense_in_out + experts * tokens * k * arch.num_moe_layers * arch.expert_in_out
    num_linears = arch.num_dense_matrices + experts * arch.num_moe_layers * hit * arch.num_expert_matrices
    fwd_passes, trains = 1.0 + gc, job.method == "full" or job.fp8 in TORCHAO_FP8_RECIPES
    moved = fp8_cast_bytes(
        job.fp8,
        weight_elems=weight_elems,
        input_elems=token_io / 2,
        grad_out_elems=token_io / 2,
        fwd_passes=fwd_passes,
        trains_weight=trains,
    )
    kernels = fp8_cast_kernels(job.fp8, num_linears=num_linears, fwd_passes=fwd_passes, trains_weight=trains)
    acc.add("elementwise", bytes_=moved, kernels=kernels)


def _add_optimizer(acc: OpTally, arch: Arch, job: FineTuneJob, lora_compute_dtype: bool) -> None:
    """AdamW (foreach) with gradient clipping over the trainable parameters, the modules saved beside LoRA
    included; the embedding's gradient where it trains."""
    w_bytes = job.compute_bytes_per_element
    trainable_params, trainable_tensors, param_bytes = _trainable(arch, job, lora_compute_dtype)
    _add_adamw(acc, trainable_params, param_bytes, launches=-(-trainable_tensors // FOREACH_TENSORS_PER_LAUNCH))
    embedding_saved, head_saved = saved_modules(job)  # PEFT's copies, in the model's dtype
    saved_params = arch.embedding_params * embedding_saved + arch.lm_head_params * head_saved
    if saved_params:
        _add_adamw(acc, saved_params, w_bytes, launches=1)
    if job.method == "full" or embedding_saved:  # embedding gradient: zero-fill + scatter into vocab x hidden
        grad_bytes = job.param_bytes_per_element if job.method == "full" else w_bytes
        acc.add("elementwise", bytes_=2.0 * arch.embedding_params * grad_bytes, kernels=3)


def _add_amp_casts(acc: OpTally, arch: Arch, job: FineTuneJob) -> None:
    """torch AMP over fp32 weights: every matmul weight (all but the embedding and the norms) cast to the compute
    dtype once per forward and once per recomputed layer, and a trained one's gradient cast to fp32 in backward."""
    cast = arch.total_params - arch.embedding_params + (arch.lm_head_params if arch.tied_embedding else 0)
    passes = 1.0 + job.recomputed_share(arch.num_layers) + (job.method == "full")  # forward, recompute, gradient
    bytes_ = cast * (4 + job.compute_bytes_per_element) * passes
    acc.add("elementwise", bytes_=bytes_, kernels=_weight_tensors(arch) * passes)


def _add_adamw(acc: OpTally, params: float, param_bytes: int, *, launches: int) -> None:
    """Foreach AdamW with gradient clipping over `params` parameters of `param_bytes` each, in `launches` launches
    of its ops."""
    acc.add(
        "optimizer",
        flops=params * ADAMW_FLOPS_PER_PARAM,
        bytes_=params * param_bytes * (ADAMW_ACCESSES_PER_PARAM + CLIP_ACCESSES_PER_PARAM),
        kernels=(ADAMW_FOREACH_OPS + 4) * launches,
    )


def accumulated(counts: AnalyticStepCounts, grad_accum: int) -> AnalyticStepCounts:
    """One optimizer step of `grad_accum` micro-batches of `counts` (one micro-batch with its optimizer step):
    every class runs once per micro-batch but the optimizer's (AdamW and gradient clipping), which runs once.
    GEMM problem sizes and `lengths` stay a micro-batch's; batch and tokens count every micro-batch."""
    if grad_accum < 1:
        raise TunecostError(f"gradient accumulation must be >= 1, got {grad_accum}")

    def scaled(by_class: Mapping[str, float]) -> Mapping[str, float]:
        return MappingProxyType({c: v * (1 if c == "optimizer" else grad_accum) for c, v in by_class.items()})

    return replace(
        counts,
        flops_by_class=scaled(counts.flops_by_class),
        bytes_by_class=scaled(counts.bytes_by_class),
        kernels_by_class=scaled(counts.kernels_by_class),
        batch_size=counts.batch_size * grad_accum,
        tokens_per_step=counts.tokens_per_step * grad_accum,
        notes=(*counts.notes, f"{grad_accum} accumulated micro-batches per optimizer step"),
    )


def _weight_tensors(arch: Arch) -> int:
    """Expert matrices and routers, dense matrices, two norms a layer, embedding, final norm and head."""
    experts = arch.num_moe_layers * (arch.num_experts * arch.num_expert_matrices + 1)
    return experts + arch.num_dense_matrices + 2 * arch.num_layers + 3


def _trainable(arch: Arch, job: FineTuneJob, lora_compute_dtype: bool) -> tuple[float, int, int]:
    """(trainable parameters, trainable tensors, bytes per trainable parameter)."""
    if job.method == "full":
        return float(arch.total_params), _weight_tensors(arch), job.param_bytes_per_element
    return adapter_params(arch, job, lora_compute_dtype)
