"""LLM.int8 frozen weights (bitsandbytes `Linear8bitLt`, transformers' `load_in_8bit`) on fake and real tensors.

Sources and derivations: docs/memory-model.md, section `tunecost.simulate.int8`.
"""

from __future__ import annotations

import torch

from tunecost.simulate.counts import op_class_scope

THRESHOLD = 6.0  # transformers' BitsAndBytesConfig llm_int8_threshold default: |x| >= 6 marks an outlier column
_SCALE = 1.0 / 127.0
_CHUNK_ROWS = 64  # real-kernel scratch bound: rows quantized or de-quantized at a time


def buffer_shapes(rows: int, cols: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """`Int8Params` of one (out, in) matrix: int8 codes `CB` and one fp32 absmax per output row `SCB`."""
    return {"CB": ((rows, cols), torch.int8), "SCB": ((rows,), torch.float32)}


def _quantize_rows_cpu(a: torch.Tensor, ca: torch.Tensor, sca: torch.Tensor, threshold: float) -> None:
    """bitsandbytes' `int8_vectorwise_quant` in place: per row, absmax over the non-outlier values, codes
    round(127 x / absmax), outliers (|x| >= threshold) coded 0."""
    for start in range(0, a.shape[0], _CHUNK_ROWS):
        x = a[start : start + _CHUNK_ROWS].float()
        if threshold > 0:
            x = x.masked_fill(x.abs() >= threshold, 0.0)
        absmax = x.abs().amax(dim=1)
        sca[start : start + _CHUNK_ROWS] = absmax
        ca[start : start + _CHUNK_ROWS] = torch.round(x * (127.0 / absmax.clamp_min(1e-30)[:, None])).to(torch.int8)


def _mm_dequant_cpu(acc: torch.Tensor, sca: torch.Tensor, scb: torch.Tensor) -> torch.Tensor:
    """bitsandbytes' `int8_mm_dequant`: int32 products x row absmax x column absmax / 127^2, in fp16."""
    out = torch.empty(acc.shape, dtype=torch.float16, device=acc.device)
    for start in range(0, acc.shape[0], _CHUNK_ROWS):
        part = acc[start : start + _CHUNK_ROWS].float() * sca[start : start + _CHUNK_ROWS, None] * scb[None, :]
        out[start : start + _CHUNK_ROWS] = (part * (_SCALE * _SCALE)).to(torch.float16)
    return out


_LIB = torch.library.Library("tunecost", "FRAGMENT")
_LIB.define("int8_quantize_rows(Tensor a, Tensor(a!) ca, Tensor(b!) sca, float threshold) -> ()")
_LIB.define("int8_mm_dequant(Tensor acc, Tensor sca, Tensor scb) -> Tensor")
for _key in ("CPU", "CUDA"):
    _LIB.impl("int8_quantize_rows", _quantize_rows_cpu, _key)
    _LIB.impl("int8_mm_dequant", _mm_dequant_cpu, _key)
_LIB.impl("int8_quantize_rows", lambda a, ca, sca, threshold: None, "Meta")
_LIB.impl("int8_mm_dequant", lambda acc, sca, scb: acc.new_empty(acc.shape, dtype=torch.float16), "Meta")


def dequantize(cb: torch.Tensor, scb: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The (out, in) weight in `dtype`, as `MatMul8bitLt.backward` builds it: a copy of the codes scaled in place."""
    with op_class_scope("dequant"):
        return cb.to(dtype, copy=True).mul_(scb.unsqueeze(1).mul(_SCALE))


def dequant_bytes(rows: int, cols: int, dtype: torch.dtype) -> int:
    """Traffic of `dequantize`: codes read, the copy written, then read and written by the in-place scale."""
    return rows * cols * (1 + 3 * dtype.itemsize)


def _forward(x: torch.Tensor, cb: torch.Tensor, scb: torch.Tensor) -> torch.Tensor:
    """`MatMul8bitLt.forward` on a frozen weight, as its CUDA kernels allocate: the input cast to fp16, row
    quantization (codes and absmax first, then |x| and the outlier mask), the int8 GEMM's int32 product, its fp16
    de-quantization and the cast back to the input's dtype. The outlier columns' 16-bit matmul is not modelled."""
    with op_class_scope("dequant"):
        a16 = x.to(torch.float16)
        ca = a16.new_empty(a16.shape, dtype=torch.int8)
        sca = a16.new_empty((a16.shape[0],), dtype=torch.float32)
        outliers = a16.abs() >= THRESHOLD
        del outliers  # its column summary (in bools) and argwhere are negligible
        torch.ops.tunecost.int8_quantize_rows(a16, ca, sca, THRESHOLD)
        del a16
    acc = torch._int_mm(ca, cb.t())
    del ca
    with op_class_scope("dequant"):
        out16 = torch.ops.tunecost.int8_mm_dequant(acc, sca, scb)
        y = out16.to(x.dtype)  # the int32 product and the fp16 output are alive until this cast returns
    del acc, out16
    return y


class _Matmul8bit(torch.autograd.Function):
    """y = x @ W^T for an LLM.int8 W: int8 GEMM forward; backward de-quantizes W into a temporary (input grad)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cb: torch.Tensor, scb: torch.Tensor) -> torch.Tensor:
        ctx.cb, ctx.scb = cb, scb
        ctx.x = x  # bitsandbytes keeps its input A in ctx.tensors until backward (unused there)
        return _forward(x, cb, scb)

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        del ctx.x
        if not ctx.needs_input_grad[0]:
            return None, None, None
        w = dequantize(ctx.cb, ctx.scb, grad_y.dtype)
        return grad_y @ w, None, None


def matmul_int8(x: torch.Tensor, cb: torch.Tensor, scb: torch.Tensor) -> torch.Tensor:
    return _Matmul8bit.apply(x, cb, scb)


@torch.no_grad()
def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(CB, SCB) of a real (out, in) weight, by bitsandbytes itself (what `Int8Params` stores)."""
    import bitsandbytes.functional as bnbf

    cb, scb, _ = bnbf.int8_vectorwise_quant(weight.to(torch.float16).contiguous())
    return cb, scb
