"""Quantized frozen weights (4-bit QLoRA; LLM.int8) that run on fake tensors as well as real ones.

Sources and derivations: docs/memory-model.md, section `tunecost.simulate.quant4bit`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tunecost.simulate import gptq, int8
from tunecost.simulate.counts import add_work, note_not_affine, op_class_scope

BLOCKSIZE = 64  # bitsandbytes' 4-bit default (QLoRA paper)
NESTED_BLOCKSIZE = 256  # double quantization: second-level blocks of absmax values
_DECODE_CHUNK_ELEMS = 1 << 16  # real-kernel scratch bound (elements decoded at a time)
PACKED_BUFFER = {"bnb": "packed", "gptq": "qweight", "int8": "CB"}  # the buffer of codes per storage format


def num_blocks(numel: int, blocksize: int = BLOCKSIZE) -> int:
    return -(-numel // blocksize)


def packed_bytes(numel: int) -> int:
    """Bytes of packed 4-bit codes for `numel` weights."""
    return -(-numel // 2)


def quant_constant_bytes(numel: int, double_quant: bool) -> int:
    """Bytes of quantization constants per quantized matrix (absmax, second level, offset; codes excluded)."""
    blocks = num_blocks(numel)
    if not double_quant:
        return 4 * blocks
    return blocks + 4 * num_blocks(blocks, NESTED_BLOCKSIZE) + 4


def _dequantize_absmax_cpu(
    qabsmax: torch.Tensor, absmax2: torch.Tensor, code2: torch.Tensor, offset: torch.Tensor
) -> torch.Tensor:
    """Double quantization, second level: 8-bit absmax codes -> fp32 absmax per 64-block."""
    n = qabsmax.numel()
    vals = code2[qabsmax.reshape(-1).long()]
    scale = absmax2.reshape(-1).repeat_interleave(NESTED_BLOCKSIZE)[:n]
    return (vals * scale + offset).float()


def _dequantize_absmax_meta(qabsmax, absmax2, code2, offset):
    return qabsmax.new_empty((qabsmax.numel(),), dtype=torch.float32)


def _dequantize_4bit_cpu(
    packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, rows: int, cols: int, dtype: torch.dtype
) -> torch.Tensor:
    """Packed 4-bit codes (bitsandbytes layout) and fp32 absmax -> a (rows, cols) matrix in `dtype`."""
    n = rows * cols
    flat = packed.reshape(-1)
    out = torch.empty(n, dtype=dtype, device=packed.device)
    step = _DECODE_CHUNK_ELEMS  # a multiple of 2 * BLOCKSIZE: chunks start at block and byte boundaries
    for start in range(0, n, step):
        stop = min(n, start + step)
        pairs = flat[start // 2 : -(-stop // 2)]
        codes = torch.stack(((pairs >> 4), (pairs & 0xF)), dim=-1).reshape(-1)[: stop - start].long()
        vals = code[codes]
        block_ids = torch.arange(start, stop, device=packed.device) // BLOCKSIZE
        out[start:stop] = (vals * absmax.reshape(-1)[block_ids]).to(dtype)
    return out.view(rows, cols)


def _dequantize_4bit_meta(packed, absmax, code, rows, cols, dtype):
    return packed.new_empty((rows, cols), dtype=dtype)


# Plain operator registrations (CPU + Meta kernels): fake tensors run the Meta kernel, which only allocates the
# output, as bitsandbytes' fused kernels do. (torch.library.custom_op costs ~10 ms per call under fake tensors.)
_LIB = torch.library.Library("tunecost", "DEF")
_LIB.define("dequantize_absmax(Tensor qabsmax, Tensor absmax2, Tensor code2, Tensor offset) -> Tensor")
_LIB.define(
    "dequantize_4bit(Tensor packed, Tensor absmax, Tensor code, int rows, int cols, ScalarType dtype) -> Tensor"
)
for _key in ("CPU", "CUDA"):  # the decode is plain torch: the same code runs on a GPU (benchmarks/gpu_memory_check)
    _LIB.impl("dequantize_absmax", _dequantize_absmax_cpu, _key)
    _LIB.impl("dequantize_4bit", _dequantize_4bit_cpu, _key)
_LIB.impl("dequantize_absmax", _dequantize_absmax_meta, "Meta")
_LIB.impl("dequantize_4bit", _dequantize_4bit_meta, "Meta")


@dataclass(frozen=True)
class QuantSpec:
    quant_type: str = "nf4"  # nf4 / fp4 (bitsandbytes), gptq, or int8 (bitsandbytes LLM.int8)
    double_quant: bool = True  # bitsandbytes only
    group_size: int = 128  # gptq only (-1: one group)
    kernel: str = "triton-v2"  # gptq only: see tunecost.simulate.gptq

    @property
    def is_gptq(self) -> bool:
        return self.quant_type == "gptq"

    @property
    def is_int8(self) -> bool:
        return self.quant_type == "int8"

    @property
    def storage(self) -> str:
        """The storage format: a key of PACKED_BUFFER."""
        return "gptq" if self.is_gptq else "int8" if self.is_int8 else "bnb"


class Quantized4bit(torch.nn.Module):
    """A stack of `num_mats` frozen (rows, cols) matrices in 4-bit (or LLM.int8) storage, one state each.

    Buffers (not parameters: nothing here is trained): `packed` (num_mats, ceil(rows*cols/2)) uint8, `absmax`
    (num_mats, blocks) uint8 or fp32, `absmax2` (num_mats, blocks/256) fp32, `offset` (num_mats,) fp32, and the
    codes `code` (16,) and `code2` (256,). GPTQ: auto-gptq's `qweight`, `qzeros`, `scales`, `g_idx` per matrix
    (shapes in `gptq.buffer_shapes`, with rows = out_features and cols = in_features), stacked over num_mats.
    int8: bitsandbytes' `CB` (rows, cols) int8 and `SCB` (rows,) fp32 per matrix (`int8.buffer_shapes`).
    """

    packed: torch.Tensor
    absmax: torch.Tensor
    code: torch.Tensor
    absmax2: torch.Tensor  # double quantization only, as are offset and code2
    offset: torch.Tensor
    code2: torch.Tensor
    qweight: torch.Tensor  # GPTQ only, as are qzeros, scales and g_idx
    qzeros: torch.Tensor
    scales: torch.Tensor
    g_idx: torch.Tensor
    CB: torch.Tensor  # int8 only, as is SCB
    SCB: torch.Tensor

    def __init__(self, num_mats: int, rows: int, cols: int, spec: QuantSpec, *, device=None) -> None:
        super().__init__()
        self.num_mats, self.rows, self.cols, self.spec = num_mats, rows, cols, spec
        if spec.is_gptq:
            gptq.check_shape(rows, cols, spec.group_size)
        if spec.storage != "bnb":
            shapes = gptq.buffer_shapes(rows, cols, spec.group_size) if spec.is_gptq else int8.buffer_shapes(rows, cols)
            for name, (shape, dtype) in shapes.items():
                self.register_buffer(name, torch.empty(num_mats, *shape, dtype=dtype, device=device))
            return
        numel = rows * cols
        blocks = num_blocks(numel)
        kw = {"device": device}
        self.register_buffer("packed", torch.empty(num_mats, packed_bytes(numel), dtype=torch.uint8, **kw))
        self.register_buffer("code", torch.empty(16, dtype=torch.float32, **kw))
        if spec.double_quant:
            self.register_buffer("absmax", torch.empty(num_mats, blocks, dtype=torch.uint8, **kw))
            self.register_buffer(
                "absmax2", torch.empty(num_mats, num_blocks(blocks, NESTED_BLOCKSIZE), dtype=torch.float32, **kw)
            )
            self.register_buffer("offset", torch.empty(num_mats, dtype=torch.float32, **kw))
            self.register_buffer("code2", torch.empty(NESTED_BLOCKSIZE, dtype=torch.float32, **kw))
        else:
            self.register_buffer("absmax", torch.empty(num_mats, blocks, dtype=torch.float32, **kw))

    def gptq_buffers(self, i: int) -> tuple[torch.Tensor, ...]:
        """Matrix `i`'s (qweight, qzeros, scales, g_idx)."""
        return self.qweight[i], self.qzeros[i], self.scales[i], self.g_idx[i]

    @torch.no_grad()
    def load_from(self, weights: torch.Tensor) -> None:
        """Quantize real weights (num_mats, rows, cols) with bitsandbytes itself, or GPTQ's layout by
        round-to-nearest (real tensors only)."""
        if self.spec.is_int8:
            for i in range(self.num_mats):
                cb, scb = int8.quantize(weights[i])
                self.CB[i].copy_(cb)
                self.SCB[i].copy_(scb)
            return
        if self.spec.is_gptq:
            for i in range(self.num_mats):
                for name, t in gptq.quantize_rtn(weights[i], self.spec.group_size).items():
                    getattr(self, name)[i].copy_(t)
            return
        import bitsandbytes.functional as bnbf

        for i in range(self.num_mats):
            packed, state = bnbf.quantize_4bit(
                weights[i].float().contiguous(),
                blocksize=BLOCKSIZE,
                compress_statistics=self.spec.double_quant,
                quant_type=self.spec.quant_type,
            )
            self.packed[i].copy_(packed.reshape(-1))
            self.absmax[i].copy_(state.absmax.reshape(-1))
            self.code.copy_(state.code)
            if self.spec.double_quant:
                self.absmax2[i].copy_(state.state2.absmax.reshape(-1))
                self.offset[i].copy_(state.offset)
                self.code2.copy_(state.state2.code)

    def dequantize(self, i: int, dtype: torch.dtype) -> torch.Tensor:
        """Matrix `i` as a (rows, cols) tensor in `dtype`: a fresh temporary (the fp32 absmax is one too)."""
        if self.spec.is_int8:
            return int8.dequantize(self.CB[i], self.SCB[i], dtype)
        if self.spec.is_gptq:  # the triton kernel writes the whole (in, out) weight, here seen as (out, in)
            if is_fake(self.qweight):
                with op_class_scope("dequant"):
                    return self.qweight.new_empty((self.cols, self.rows), dtype=dtype).t()
            with torch.no_grad():
                return gptq.unpack_weight(*self.gptq_buffers(i)).to(dtype).t()
        if is_fake(self.packed):
            # Same allocations as the kernels (fp32 absmax, then the output), without operator dispatch cost;
            # the recorder counts the bytes read (packed codes, absmax codes) and written under "dequant".
            with op_class_scope("dequant"):
                absmax_fp32 = (
                    self.absmax[i].new_empty((self.absmax.shape[1],), dtype=torch.float32)
                    if self.spec.double_quant
                    else None
                )
                w = self.packed[i].new_empty((self.rows, self.cols), dtype=dtype)
                del absmax_fp32  # freed once the matrix is written, as the kernel's temporary is
                return w
        absmax = self.absmax[i]
        if self.spec.double_quant:
            absmax = torch.ops.tunecost.dequantize_absmax(absmax, self.absmax2[i], self.code2, self.offset[i])
        return torch.ops.tunecost.dequantize_4bit(self.packed[i], absmax, self.code, self.rows, self.cols, dtype)

    def dequant_bytes(self, dtype: torch.dtype) -> int:
        """Traffic of de-quantizing one matrix: codes and absmax read, the matrix written (and, with double
        quantization, the fp32 absmax written and read back). GPTQ: its buffers read, the matrix written."""
        if self.spec.is_int8:
            return int8.dequant_bytes(self.rows, self.cols, dtype)
        if self.spec.is_gptq:
            return (
                gptq.storage_bytes(self.rows, self.cols, self.spec.group_size) + self.rows * self.cols * dtype.itemsize
            )
        blocks = self.absmax.shape[1]
        absmax_traffic = blocks * (1 + 4) if self.spec.double_quant else blocks * 4
        return self.packed.shape[1] + absmax_traffic + self.rows * self.cols * dtype.itemsize

    def storage_bytes(self) -> tuple[int, int]:
        """(packed 4-bit bytes, quantization-constant bytes including codes)."""
        packed_name = PACKED_BUFFER[self.spec.storage]
        const = sum(b.numel() * b.element_size() for n, b in self.named_buffers() if n != packed_name)
        packed = getattr(self, packed_name)
        return packed.numel() * packed.element_size(), const


class _Matmul4bit(torch.autograd.Function):
    """y = x @ W_i^T for a 4-bit W_i; W_i is de-quantized in forward and again in backward, never saved."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, qweight: Quantized4bit, index: int) -> torch.Tensor:
        ctx.qweight, ctx.index = qweight, index
        w = qweight.dequantize(index, x.dtype)
        y = x @ w.t()
        del w
        return y

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        if not ctx.needs_input_grad[0]:
            return None, None, None
        w = ctx.qweight.dequantize(ctx.index, grad_y.dtype)
        return grad_y @ w, None, None


def matmul_4bit(x: torch.Tensor, qweight: Quantized4bit, index: int = 0) -> torch.Tensor:
    """y = x @ W_index^T; GPTQ's torch kernel path keeps its de-quantized weight for backward (see `gptq`);
    LLM.int8 runs an int8 GEMM on the quantized input (see `int8`)."""
    if qweight.spec.is_int8:
        return int8.matmul_int8(x, qweight.CB[index], qweight.SCB[index])
    if qweight.spec.is_gptq and qweight.spec.kernel == "torch":
        return gptq.matmul_torch_path(x, *qweight.gptq_buffers(index))
    return _Matmul4bit.apply(x, qweight, index)


class _GroupedMatmul4bit(torch.autograd.Function):
    """Rows of `x` grouped by expert (`counts` rows each, in order): y[g] = x[g] @ W_e^T, one expert's weight
    de-quantized at a time (forward and backward), so the temporary is one expert's matrix."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, qweight: Quantized4bit, counts: tuple[int, ...]) -> torch.Tensor:
        ctx.qweight, ctx.counts = qweight, counts
        return _grouped_loop(x, qweight, counts, transpose=False)

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        if not ctx.needs_input_grad[0]:
            return None, None, None
        return _grouped_loop(grad_y, ctx.qweight, ctx.counts, transpose=True), None, None


def _grouped_loop(x: torch.Tensor, qweight: Quantized4bit, counts: tuple[int, ...], *, transpose: bool):
    """y = x_e @ W_e^T per expert group (transpose: x_e @ W_e, the input gradient)."""
    out_dim = qweight.cols if transpose else qweight.rows
    y = x.new_empty((x.shape[0], out_dim))
    hit = [e for e, n in enumerate(counts) if n]
    if is_fake(x):
        # Fake tensors carry no values: one representative expert gives the temporary (one de-quantized matrix)
        # and one matmul over all rows gives the FLOPs; the other experts' de-quantization traffic is added.
        if hit:
            w = qweight.dequantize(hit[0], x.dtype)
            add_work("dequant", nbytes=(len(hit) - 1) * qweight.dequant_bytes(x.dtype))
            torch.mm(x, w if transpose else w.t(), out=y)
            del w
        return y
    start = 0
    for e, n in enumerate(counts):
        if n:
            w = qweight.dequantize(e, x.dtype)
            torch.mm(x[start : start + n], w if transpose else w.t(), out=y[start : start + n])
            del w
        start += n
    return y


def grouped_matmul_4bit(x: torch.Tensor, qweight: Quantized4bit, counts: tuple[int, ...]) -> torch.Tensor:
    return _GroupedMatmul4bit.apply(x, qweight, counts)


def is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor) or t.device.type == "meta"


def tokens_per_expert(expert_ids_sorted: torch.Tensor, num_experts: int) -> tuple[int, ...]:
    """Rows per expert of an expert-sorted assignment list. Fake tensors carry no routing, so they get a
    uniform split (the total, which decides the memory of grouped compute, is exact either way)."""
    total = expert_ids_sorted.numel()
    if is_fake(expert_ids_sorted):
        base, extra = divmod(total, num_experts)
        if extra:
            note_not_affine()
        return tuple(base + (1 if e < extra else 0) for e in range(num_experts))
    return tuple(int(c) for c in torch.bincount(expert_ids_sorted, minlength=num_experts).tolist())
