"""Throughput rows: a roofline step time per row, its one efficiency calibrated on one row per (stack, GPU).

    flops_per_token = passes_mm * N_mm + passes_attn * 2 * seq_len * hidden * layers
        N_mm: parameters used per token in matrix multiplies (active parameters without the embedding tables,
        plus the output head, which is a matmul even when tied);
        passes_mm: forward 2 + backward 4 (input and weight gradients) for a full fine-tune; forward 2 +
        backward 2 (input gradients only) for the frozen base of LoRA/QLoRA; + 2 with gradient checkpointing
        (the forward recomputed). The adapters' own FLOPs (rank x (in + out) per target) are not counted;
        attention: QK^T and PV, causal (half the L x L), forward 1 + backward 2 (+ 1 recomputed) passes.
    micro_s = tokens * flops_per_token / (efficiency * peak_bf16) + dequant_bytes / bandwidth
        dequant_bytes (QLoRA): each pass over the 4-bit weights reads 0.5 and writes 2 bytes per parameter,
        once in the forward, once in the backward, once more when recomputed;
    step_s = grad_accum * micro_s + optimizer_bytes / bandwidth
        optimizer_bytes (full fine-tune): AdamW reads parameter, gradient and both fp32 moments and writes
        parameter and moments: 7 x 4 bytes per trained parameter. LoRA's optimizer step is not counted.

`efficiency` is the one shared parameter of a (stack, GPU): the fraction of the GPU's datasheet bf16 tensor
rate the stack reaches. It is solved from one calibration row per (stack, GPU): the group's row with the most
tokens per optimizer step (the one least dominated by host overheads; the first in file order on a tie), a
rule fixed before any error is computed. Every other row of the group is predicted with it. Host overheads
(kernel launches, the trainer loop) are not modelled, so rows with few tokens per step are predicted too fast.
Quantities: s_per_step = step_s; tokens_per_s_per_gpu = grad_accum * batch * seq_len / step_s;
samples_per_s = grad_accum * batch / step_s (one GPU).

The step time is the throughput model's (`tunecost.estimate.throughput.model.step_time`), restricted to what these
rows can calibrate: the FLOPs as one tensor-core class and the bytes as one memory class, the GPU as its
datasheet (bf16 tensor peak, memory bandwidth), and stack parameters with `efficiency` as the GEMM efficiency,
no small-GEMM penalty, the full bandwidth and no launch or host overheads. A class is either compute or memory
work, so the model's per-class roofline reduces to the sum above.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tunecost.catalog.gpus import GPU
from tunecost.estimate.throughput.counts import TENSOR_CORE, AnalyticStepCounts
from tunecost.estimate.throughput.gpu_terms import GpuTerms
from tunecost.estimate.throughput.lengths import fixed_lengths
from tunecost.estimate.throughput.model import StackParams, StepTime, step_time
from tunecost.validate.mapping import MappedRow

CALIBRATION_REASON = "calibration row"
COMPUTE_CLASS = "dense_matmul"  # the op class that carries every FLOP of a row's step (matmuls and attention)
NF4_BYTES_PER_PARAM = 0.5
DEQUANT_WRITTEN_BYTES_PER_PARAM = 2.0  # bf16 weight written for the matmul
ADAMW_BYTES_PER_TRAINED_PARAM = 7 * 4  # read p, g, m, v; write p, m, v (fp32)


@dataclass(frozen=True, kw_only=True)
class ModelCounts:
    """What the step time needs from a model: parameters in matmuls, quantized, and the attention shape."""

    matmul_params: int  # per token (active), including the output head
    quantizable_params: int  # the decoder's linear weights (4-bit under QLoRA): matmul_params - head
    trained_params_full: int  # every parameter (a full fine-tune trains them all)
    hidden_size: int
    num_layers: int


@dataclass(frozen=True, kw_only=True)
class StepWork:
    """One optimizer step's work: FLOPs to run at the stack's efficiency, bytes at the GPU's bandwidth."""

    flops: float
    bytes: float
    bytes_class: str = "elementwise"  # the op class of the bytes: dequant (QLoRA), optimizer (full fine-tune)
    batch: int = 1  # sequences per optimizer step (all micro-batches)
    seq_len: int = 1

    def step_counts(self) -> AnalyticStepCounts:
        """This work as the throughput model's step counts: one compute class and one memory class."""
        return AnalyticStepCounts(
            flops_by_class={COMPUTE_CLASS: self.flops},
            bytes_by_class={self.bytes_class: self.bytes},
            kernels_by_class={},
            gemm_rows_by_class={},  # no small-GEMM penalty: the efficiency is calibrated as a whole
            peak_by_class={COMPUTE_CLASS: TENSOR_CORE},
            batch_size=self.batch,
            tokens_per_step=float(self.batch * self.seq_len),
            lengths=fixed_lengths(self.seq_len, self.batch),
            source="validate: FLOPs per token and bytes per step (module docstring)",
        )


def flops_per_token(counts: ModelCounts, *, method: str, seq_len: int, gradient_checkpointing: bool) -> float:
    recompute = 1 if gradient_checkpointing else 0
    mm_passes = (6 if method == "full" else 4) + 2 * recompute
    attention_fwd = 2.0 * seq_len * counts.hidden_size * counts.num_layers  # causal: half of 4 * L * d
    return mm_passes * counts.matmul_params + (3 + recompute) * attention_fwd


def step_work(
    counts: ModelCounts, *, method: str, batch: int, seq_len: int, grad_accum: int, gradient_checkpointing: bool
) -> StepWork:
    tokens = batch * seq_len * grad_accum
    flops = tokens * flops_per_token(
        counts, method=method, seq_len=seq_len, gradient_checkpointing=gradient_checkpointing
    )
    byte_count, bytes_class = 0.0, "elementwise"
    if method == "qlora":
        passes = 2 + (1 if gradient_checkpointing else 0)
        per_pass = counts.quantizable_params * (NF4_BYTES_PER_PARAM + DEQUANT_WRITTEN_BYTES_PER_PARAM)
        byte_count, bytes_class = grad_accum * passes * per_pass, "dequant"
    elif method == "full":
        byte_count, bytes_class = float(counts.trained_params_full * ADAMW_BYTES_PER_TRAINED_PARAM), "optimizer"
    return StepWork(
        flops=float(flops), bytes=byte_count, bytes_class=bytes_class, batch=batch * grad_accum, seq_len=seq_len
    )


def datasheet_terms(gpu: GPU) -> GpuTerms:
    """The GPU as these rows see it: its datasheet bf16 tensor peak and memory bandwidth."""
    return GpuTerms(
        name=gpu.name,
        matmul_flops_per_s=gpu.bf16_tensor_flops_per_s,
        fp32_flops_per_s=gpu.fp32_flops_per_s,
        memory_bytes_per_s=gpu.mem_bandwidth_bytes_per_s,
        source=f"catalog datasheet ({gpu.as_of})",
    )


def _step_time(work: StepWork, gpu: GPU, efficiency: float) -> StepTime:
    params = StackParams(
        gemm_efficiency=efficiency,
        gemm_half_rows=0.0,
        memory_efficiency=1.0,
        kernel_overhead_s=0.0,
        step_overhead_s=0.0,
    )
    return step_time(work.step_counts(), datasheet_terms(gpu), params)


def step_seconds(work: StepWork, gpu: GPU, efficiency: float) -> float:
    return _step_time(work, gpu, efficiency).step_s


def efficiency_from(work: StepWork, gpu: GPU, measured_step_s: float) -> float | None:
    """The efficiency that reproduces a measured step (None when the bytes alone take longer)."""
    at_peak = _step_time(work, gpu, 1.0)  # efficiency 1: the compute class at the full datasheet peak
    compute_at_peak_s = at_peak.class_s.get(COMPUTE_CLASS, 0.0)
    compute_s = measured_step_s - sum(s for cls, s in at_peak.class_s.items() if cls != COMPUTE_CLASS)
    if compute_s <= 0:
        return None
    eff = compute_at_peak_s / compute_s
    return eff if 0 < eff <= 1 else None


def tokens_per_step(batch: int, seq_len: int, grad_accum: int) -> int:
    return batch * seq_len * grad_accum


def to_step_seconds(quantity: str, value: float, *, batch: int, seq_len: int, grad_accum: int) -> float:
    """A measured throughput figure as seconds per optimizer step (one GPU)."""
    if quantity == "s_per_step":
        return value
    if quantity == "tokens_per_s_per_gpu":
        return tokens_per_step(batch, seq_len, grad_accum) / value
    if quantity == "samples_per_s":
        return batch * grad_accum / value
    raise ValueError(quantity)


def from_step_seconds(quantity: str, step_s: float, *, batch: int, seq_len: int, grad_accum: int) -> float:
    """Seconds per optimizer step as the row's quantity (the inverse of `to_step_seconds`)."""
    return to_step_seconds(quantity, step_s, batch=batch, seq_len=seq_len, grad_accum=grad_accum)


def model_counts(mapped: MappedRow) -> ModelCounts:
    from tunecost.catalog.models import resolve_model
    from tunecost.models.params import count_parameters

    spec = resolve_model(mapped.job.model)
    pc = count_parameters(spec)
    head = spec.vocab_size * spec.hidden_size
    decoder = pc.active - pc.embedding
    return ModelCounts(
        matmul_params=decoder + head,
        quantizable_params=decoder,
        trained_params_full=pc.total,
        hidden_size=spec.hidden_size,
        num_layers=spec.num_layers,
    )


CountsFn = Callable[[MappedRow], ModelCounts]
