"""A stack of expert weights stored in 4-bit NF4 (bitsandbytes), de-quantized per expert on demand.

Sources and derivations: docs/moe-layer.md, section `tunecost.moe.nf4`.
"""

from __future__ import annotations

import torch
from torch import nn

from tunecost.errors import TunecostError


class NF4ExpertWeights(nn.Module):
    """Frozen (E, N, K) expert weights in NF4. Bytes per weight: 0.5 + quantization constants."""

    packed: torch.Tensor
    absmax: torch.Tensor
    code: torch.Tensor
    absmax2: torch.Tensor | None
    code2: torch.Tensor | None
    offset: torch.Tensor | None

    def __init__(
        self,
        packed: torch.Tensor,
        absmax: torch.Tensor,
        *,
        shape: tuple[int, int],
        dtype: torch.dtype,
        blocksize: int,
        code: torch.Tensor,
        absmax2: torch.Tensor | None = None,
        code2: torch.Tensor | None = None,
        offset: torch.Tensor | None = None,
        blocksize2: int = 256,
    ) -> None:
        super().__init__()
        self.shape = tuple(shape)
        self.dtype = dtype
        self.blocksize = blocksize
        self.blocksize2 = blocksize2
        self.register_buffer("packed", packed)  # (E, N*K/2) uint8: two 4-bit codes per byte
        # Each expert is quantized as P row blocks ("parts") of its own; the packed codes of the parts are
        # contiguous, so a whole expert de-quantizes in one go once its absmax rows are concatenated.
        self.register_buffer("absmax", absmax)  # (E, P, blocks): uint8 if double-quantized, else fp32
        self.register_buffer("code", code)  # (16,) the NF4 code book
        self.register_buffer("absmax2", absmax2)  # (E, P, ceil(blocks/256)) fp32 scales of the quantized absmax
        self.register_buffer("code2", code2)  # (256,) 8-bit dynamic code book of the quantized absmax
        self.register_buffer("offset", offset)  # (E, P) mean subtracted from absmax before quantizing it

    @property
    def num_experts(self) -> int:
        return int(self.packed.shape[0])

    @property
    def double_quant(self) -> bool:
        return self.absmax2 is not None

    @classmethod
    def from_dense(
        cls,
        weight: torch.Tensor,
        *,
        dtype: torch.dtype | None = None,
        blocksize: int = 64,
        double_quant: bool = True,
        parts: int = 1,
    ) -> NF4ExpertWeights:
        """Quantize an (E, N, K) stack; `dtype` is the de-quantized (compute) dtype, the weight's by default.

        `parts` > 1 quantizes each expert as that many row blocks of its own (gate_up with parts=2 is stored
        exactly as two `Linear4bit`s w1 and w3 would be, double-quantization statistics included)."""
        import bitsandbytes.functional as bnbf

        if weight.dim() != 3:
            raise TunecostError(f"expert weights must be (experts, out, in), got shape {tuple(weight.shape)}")
        num_experts, rows, cols = weight.shape
        if rows % parts or ((rows // parts) * cols) % blocksize:
            raise TunecostError(
                f"expert matrix {rows}x{cols} in {parts} part(s) is not a multiple of the 4-bit blocksize {blocksize}"
            )
        dtype = dtype or weight.dtype
        packed, absmax, absmax2, offset = [], [], [], []
        code = code2 = None
        blocksize2 = 256
        with torch.no_grad():
            for expert in range(num_experts):
                for part in weight[expert].detach().to(dtype).chunk(parts, dim=0):
                    data, state = bnbf.quantize_4bit(
                        part.contiguous(), blocksize=blocksize, compress_statistics=double_quant, quant_type="nf4"
                    )
                    packed.append(data.reshape(-1))
                    absmax.append(state.absmax.reshape(-1))
                    code = state.code
                    if double_quant:
                        absmax2.append(state.state2.absmax.reshape(-1))
                        offset.append(torch.as_tensor(state.offset, dtype=torch.float32, device=weight.device))
                        code2 = state.state2.code
                        blocksize2 = state.state2.blocksize

        assert code is not None  # set by the first quantized part (num_experts >= 1)

        def per_expert(tensors: list[torch.Tensor]) -> torch.Tensor:  # (E*parts, n) -> (E, parts, n)
            return torch.stack(tensors).reshape(num_experts, parts, -1)

        return cls(
            per_expert(packed).reshape(num_experts, -1),
            per_expert(absmax),
            shape=(rows, cols),
            dtype=dtype,
            blocksize=blocksize,
            code=code,
            absmax2=per_expert(absmax2) if double_quant else None,
            code2=code2,
            offset=per_expert(offset).reshape(num_experts, parts) if double_quant else None,
            blocksize2=blocksize2,
        )

    def _absmax_fp32(self, experts: list[int]) -> torch.Tensor:
        if not self.double_quant:
            return self.absmax[experts].float()
        assert self.absmax2 is not None and self.offset is not None and self.code2 is not None  # double_quant
        import bitsandbytes.functional as bnbf

        rows = []
        for expert in experts:
            for part in range(self.absmax.shape[1]):
                state2 = bnbf.QuantState(
                    absmax=self.absmax2[expert, part], code=self.code2, blocksize=self.blocksize2, dtype=torch.float32
                )
                absmax = bnbf.dequantize_blockwise(self.absmax[expert, part].contiguous(), state2)
                rows.append(absmax + self.offset[expert, part])
        return torch.stack(rows)

    def dequantize(self, experts: list[int] | None = None) -> torch.Tensor:
        """The requested experts (all by default) as a (G, N, K) tensor in the compute dtype, in the given order."""
        experts = list(range(self.num_experts)) if experts is None else list(experts)
        rows, cols = self.shape
        if not experts:
            return torch.empty(0, rows, cols, dtype=self.dtype, device=self.packed.device)
        absmax = self._absmax_fp32(experts).reshape(-1).contiguous()
        if experts == list(range(self.num_experts)):
            packed = self.packed.reshape(-1, 1)  # no gather copy when every expert is needed
        else:
            packed = self.packed[experts].reshape(-1, 1)
        # The (numel / blocksize, blocksize) shape makes every row one quantization block. bitsandbytes 0.50's CPU
        # kernel indexes blocks by row and gets matrices whose last dimension is not a multiple of the blocksize
        # wrong (about twice the quantization error of its own Python reference); this shape sidesteps that.
        flat = torch.ops.bitsandbytes.dequantize_4bit.default(
            packed,
            absmax,
            self.blocksize,
            "nf4",
            [len(experts) * rows * cols // self.blocksize, self.blocksize],
            self.dtype,
        )
        return flat.view(len(experts), rows, cols)

    def _apply(self, fn, recurse=True):
        # `model.to(dtype)` must not round the quantization constants: buffers only change device, and the
        # requested dtype becomes the de-quantized (compute) dtype.
        probe = fn(torch.empty(0, dtype=self.dtype, device=self.packed.device))
        for name, buf in self._buffers.items():
            if buf is not None:
                self._buffers[name] = buf.to(device=probe.device)
        if probe.dtype.is_floating_point:
            self.dtype = probe.dtype
        return self

    def storage_bytes(self) -> int:
        """Bytes held by this module: packed codes plus every quantization constant."""
        return sum(t.numel() * t.element_size() for t in self.buffers())

    def extra_repr(self) -> str:
        return (
            f"experts={self.num_experts}, shape={self.shape}, nf4, blocksize={self.blocksize}, "
            f"double_quant={self.double_quant}, dtype={self.dtype}"
        )
