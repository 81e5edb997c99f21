"""GPTQ int4 weights in auto-gptq's `QuantLinear` layout, on fake tensors as well as real ones.

Sources and derivations: docs/memory-model.md, section `tunecost.simulate.gptq`.
"""

from __future__ import annotations

import math

import torch

from tunecost.errors import TunecostError
from tunecost.simulate.counts import op_class_scope

BITS = 4
CODES_PER_INT32 = 32 // BITS  # 8
MAXQ = 2**BITS - 1  # 15


def num_groups(in_features: int, group_size: int) -> int:
    return 1 if group_size == -1 else math.ceil(in_features / group_size)


def check_shape(out_features: int, in_features: int, group_size: int) -> None:
    """auto-gptq packs 8 codes per int32 along both dimensions: each must be a multiple of 8."""
    if in_features % CODES_PER_INT32 or out_features % CODES_PER_INT32:
        raise TunecostError(
            f"GPTQ int4 packs {CODES_PER_INT32} codes per int32: a ({out_features}, {in_features}) linear layer "
            f"cannot be stored (both sizes must be multiples of {CODES_PER_INT32})"
        )
    if group_size != -1 and in_features % group_size:
        raise TunecostError(
            f"GPTQ group size {group_size} (--gptq-group-size) does not divide the {in_features} inputs of a layer"
        )


def buffer_shapes(
    out_features: int, in_features: int, group_size: int
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shape and dtype of each `QuantLinear` buffer of one matrix (the bias excluded)."""
    groups = num_groups(in_features, group_size)
    return {
        "qweight": ((in_features // CODES_PER_INT32, out_features), torch.int32),
        "qzeros": ((groups, out_features // CODES_PER_INT32), torch.int32),
        "scales": ((groups, out_features), torch.float16),
        "g_idx": ((in_features,), torch.int32),
    }


def storage_bytes(out_features: int, in_features: int, group_size: int) -> int:
    """Bytes of one matrix's GPTQ buffers: 4 * in * out / 8 + 4 * groups * out / 8 + 2 * groups * out + 4 * in."""
    return sum(
        math.prod(shape) * dtype.itemsize
        for shape, dtype in buffer_shapes(out_features, in_features, group_size).values()
    )


def _pack_along(codes: torch.Tensor, dim: int) -> torch.Tensor:
    """int codes 0..15 -> int32 words, 8 consecutive codes along `dim` per word (code j in bits 4j..4j+3)."""
    moved = codes.movedim(dim, 0).to(torch.int64)
    words = moved.reshape(moved.shape[0] // CODES_PER_INT32, CODES_PER_INT32, *moved.shape[1:])
    shifts = torch.arange(0, 32, BITS, device=codes.device).view(1, -1, *([1] * (moved.dim() - 1)))
    packed = (words << shifts).sum(dim=1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)  # the uint32 bits as int32
    return packed.movedim(0, dim)


@torch.no_grad()
def quantize_rtn(weight: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """Real weights (out, in) -> GPTQ buffers by asymmetric round-to-nearest per group (the layout GPTQ writes;
    GPTQ's error-compensating rounding changes code values, not sizes)."""
    out_features, in_features = weight.shape
    group = in_features if group_size == -1 else group_size
    w = weight.float().reshape(out_features, in_features // group, group)
    lo = w.amin(dim=-1).clamp(max=0.0)
    hi = w.amax(dim=-1).clamp(min=0.0)
    scale = ((hi - lo) / MAXQ).clamp(min=1e-8)  # (out, groups)
    zero = torch.round(-lo / scale).clamp(1, MAXQ)  # >= 1: stored minus one, it stays a 4-bit code
    codes = torch.clamp(torch.round(w / scale[..., None]) + zero[..., None], 0, MAXQ).reshape(out_features, -1)
    return {
        "qweight": _pack_along(codes.t(), 0),  # (in / 8, out)
        "qzeros": _pack_along((zero - 1).t(), 1),  # (groups, out / 8), stored minus one
        "scales": scale.t().to(torch.float16).contiguous(),
        "g_idx": torch.arange(in_features, dtype=torch.int32, device=weight.device) // group,
    }


def unpack_weight(qweight, qzeros, scales, g_idx) -> torch.Tensor:
    """The fp16 (in, out) weight, by auto-gptq's torch path: every allocation it makes happens here too (int32
    shift result, int8 codes, int8 codes minus zeros, fp16 product), so fake tensors see the same temporaries."""
    del g_idx  # groups are contiguous runs of inputs here; an act-order g_idx only permutes which inputs
    groups, out_features = scales.shape
    shifts = torch.arange(0, 32, BITS, dtype=torch.int32, device=qweight.device).unsqueeze(0)  # (1, 8)
    zeros = torch.bitwise_right_shift(qzeros.unsqueeze(2).expand(-1, -1, CODES_PER_INT32), shifts.unsqueeze(0))
    zeros = zeros.to(torch.int8)
    torch.bitwise_and(zeros, MAXQ, out=zeros)
    zeros = (zeros + 1).reshape(groups, 1, out_features)
    codes = torch.bitwise_right_shift(qweight.unsqueeze(1).expand(-1, CODES_PER_INT32, -1), shifts.unsqueeze(-1))
    codes = codes.to(torch.int8)  # the int32 shift result is freed here
    torch.bitwise_and(codes, MAXQ, out=codes)
    codes = codes.reshape(groups, -1, out_features)
    weight = scales.reshape(groups, 1, out_features) * (codes - zeros)
    return weight.reshape(-1, out_features)


def matmul_torch_path(x: torch.Tensor, qweight, qzeros, scales, g_idx) -> torch.Tensor:
    """y = x @ W with W unpacked by auto-gptq's torch path; autograd keeps W (fp16) for the input gradient."""
    with torch.no_grad(), op_class_scope("dequant"):
        weight = unpack_weight(qweight, qzeros, scales, g_idx)
    return torch.matmul(x, weight)
