"""Base-weight quantization's work per step: bitsandbytes 4-bit and GPTQ de-quantization, LLM.int8's quantization
around each GEMM. Derivations: docs/throughput-model.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunecost.models.arch import Arch
from tunecost.workload.job import FineTuneJob

if TYPE_CHECKING:
    from tunecost.estimate.throughput.counts import OpTally

NF4_BYTES_PER_PARAM = 0.5 + 1 / 64  # 4-bit codes + 8-bit absmax per 64-block (double quantization)
DEQUANT_KERNELS_PER_CALL = 2  # absmax dequantization, then the weights (bnb double quantization)
DEQUANT_FLOPS_PER_PARAM = 2  # table lookup + scale
# auto-gptq's QuantLinear (cuda-old) on its torch path ("torch" GPTQ kernel; qlinear_cuda_old.py `forward`, 4 bits),
# per weight element: bitwise_right_shift of the expanded int32 qweight (read 0.5, write an int32: 4), .to(int8)
# (4 + 1), bitwise_and in place (1 + 1), weight - zeros (int8: 1 + 1), scales * (...) (fp16: 1 + 2); the zeros
# and scales are per group (negligible). The fp16 weight then meets a plain torch.matmul, which keeps it for
# the input gradient: de-quantized on forward and recompute only, not again in backward.
GPTQ_TORCH_DEQUANT_BYTES_PER_PARAM = 0.5 + 4 + (4 + 1) + (1 + 1) + (1 + 1) + (1 + 2)
GPTQ_TORCH_DEQUANT_KERNELS_PER_CALL = 9  # weight: shift, cast, and, sub, mul; zeros: shift, cast, and, + 1
# LLM.int8 (bitsandbytes MatMul8bitLt, outlier threshold 6), per linear and forward pass. Per input element: cast
# to fp16 (w + 2), |x| (2 + 2), >= threshold (2 + 1), the mask's column any (1), row quantization (2 + 1), the int8
# GEMM's read (1); per output element: the GEMM's int32 product (4), its de-quantization to fp16 (4 + 2), the cast
# back (2 + w). Input and output elements are split evenly over a linear's in and out sides (as for FP8).
INT8_FWD_BYTES_PER_IO = (14 + 12) / 2  # + w_bytes
INT8_FWD_KERNELS_PER_CALL = 9  # cast, abs, ge, any, any(dim 0), argwhere, quantize, de-quantize, cast
# backward (input gradient): `CB.to(dtype, copy=True).mul_(SCB / 127)`: codes read, copy written, read and written
INT8_BWD_DEQUANT_BYTES_PER_PARAM = 1  # + 3 w_bytes
INT8_BWD_DEQUANT_KERNELS_PER_CALL = 3


def add_int8(acc: OpTally, arch: Arch, *, tokens: float, w_bytes: int, passes: tuple[float, float]) -> None:
    """LLM.int8 weights (dense models): the input's quantization and the product's de-quantization around each
    forward GEMM (forward and recompute), the weight de-quantized for the input gradient. The int8 GEMMs count
    with the dense matmuls, at the bf16 tensor-core rate (the catalog has no int8 rate)."""
    frozen_passes, fwd_passes = passes
    bwd_passes = frozen_passes - fwd_passes
    acc.add(
        "dequant",
        flops=bwd_passes * arch.dense_params * DEQUANT_FLOPS_PER_PARAM,
        bytes_=fwd_passes * tokens * arch.dense_in_out * (INT8_FWD_BYTES_PER_IO + w_bytes)
        + bwd_passes * arch.dense_params * (INT8_BWD_DEQUANT_BYTES_PER_PARAM + 3 * w_bytes),
        kernels=arch.num_dense_matrices
        * (fwd_passes * INT8_FWD_KERNELS_PER_CALL + bwd_passes * INT8_BWD_DEQUANT_KERNELS_PER_CALL),
    )


def add_dequant(
    acc: OpTally, arch: Arch, job: FineTuneJob, *, hit: float, w_bytes: int, passes: tuple[float, float]
) -> None:
    """4-bit weights (every Linear but the head under QLoRA) are dequantized on forward, recompute, backward
    (bitsandbytes, and GPTQ's triton kernel, which de-quantizes again in backward); GPTQ's torch path on
    forward and recompute only, with its un-fused traffic."""
    frozen_passes, fwd_passes = passes
    quant_params: float = arch.dense_params + arch.num_moe_layers * arch.router_params_per_layer
    quant_calls: float = arch.num_dense_matrices + arch.num_moe_layers  # + one router per MoE layer
    if arch.num_experts > 1:
        quant_params += arch.num_moe_layers * hit * arch.expert_params
        quant_calls += arch.num_moe_layers * hit * arch.num_expert_matrices
    gptq_torch = job.quant_type == "gptq" and job.gptq_kernel == "torch"
    dequant_passes = fwd_passes if gptq_torch else frozen_passes
    per_param = GPTQ_TORCH_DEQUANT_BYTES_PER_PARAM if gptq_torch else NF4_BYTES_PER_PARAM + w_bytes
    per_call = GPTQ_TORCH_DEQUANT_KERNELS_PER_CALL if gptq_torch else DEQUANT_KERNELS_PER_CALL
    acc.add(
        "dequant",
        flops=dequant_passes * quant_params * DEQUANT_FLOPS_PER_PARAM,
        bytes_=dequant_passes * quant_params * per_param,
        kernels=dequant_passes * quant_calls * per_call,
    )
