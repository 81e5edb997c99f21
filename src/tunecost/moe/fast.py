"""`FastExperts`: a drop-in for transformers' fused experts (`mlp.experts`) built for fine-tuning.

Same call contract as `MixtralExperts.forward(hidden_states (T, H), top_k_index (T, k), top_k_weights (T, k))`,
same weight layout (`gate_up_proj` (E, 2I, H) with the gate half first, `down_proj` (E, H, I)), and it works for
any gated expert: SiLU-gated (Mixtral) or GELU-gated (BlackMamba's `linear_fc1` / `linear_fc2`). The math is in
`core.py`. LoRA parameter names start with `lora_` so PEFT-style "only adapters trainable" filters keep them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tunecost.errors import TunecostError
from tunecost.moe.core import ACTIVATIONS, BaseWeights, ExpertLora, experts_forward
from tunecost.moe.nf4 import NF4ExpertWeights


def _lora_a(num_experts: int, rank: int, fan_in: int, like: torch.Tensor) -> nn.Parameter:
    # PEFT's default init: kaiming_uniform_(a=sqrt(5)) on the (E*r, fan_in) lora_A, i.e. U(-1/sqrt(fan_in), +).
    bound = 1.0 / math.sqrt(fan_in)
    weight = torch.empty(num_experts, rank, fan_in, dtype=like.dtype, device=like.device)
    return nn.Parameter(weight.uniform_(-bound, bound))


def _lora_b(num_experts: int, fan_out: int, rank: int, like: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(torch.zeros(num_experts, fan_out, rank, dtype=like.dtype, device=like.device))


class FastExperts(nn.Module):
    """Experts with tokens routed once, grouped GEMMs and LoRA on the routed rows only (see `core.py`).

    Build with `from_weights`. Attributes after a forward: `last_tokens_per_expert` (E,) on the device.
    """

    def __init__(
        self,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        *,
        activation: str = "silu",
        lora_rank: int | None = None,
        lora_alpha: float = 32,
        lora_layout: str = "fused",
        quantize_4bit: bool = False,
        keep_dequantized: bool | None = None,
        trainable_base: bool = False,
        gate_up_quant_parts: int = 2,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise TunecostError(f"unknown expert activation {activation!r}; valid: {', '.join(ACTIVATIONS)}")
        num_experts, two_i, hidden = gate_up.shape
        if two_i % 2 or tuple(down.shape) != (num_experts, hidden, two_i // 2):
            raise TunecostError(
                f"expert weights do not fit together: gate_up {tuple(gate_up.shape)}, down {tuple(down.shape)}"
            )
        self.num_experts, self.hidden_dim, self.intermediate_dim = num_experts, hidden, two_i // 2
        self.activation = activation
        self.keep_dequantized = keep_dequantized
        self.quantized = quantize_4bit
        if quantize_4bit:
            if trainable_base:
                raise TunecostError("4-bit expert weights are frozen; a full fine-tune needs quantize_4bit=False")
            # By default gate and up are quantized as two matrices, as the paper's Linear4bit w1 and w3 were
            # (BlackMamba's linear_fc1 is one matrix: gate_up_quant_parts=1).
            self.gate_up_nf4 = NF4ExpertWeights.from_dense(gate_up, parts=gate_up_quant_parts)
            self.down_nf4 = NF4ExpertWeights.from_dense(down)
        else:
            self.gate_up_proj = nn.Parameter(gate_up.detach().clone(), requires_grad=trainable_base)
            self.down_proj = nn.Parameter(down.detach().clone(), requires_grad=trainable_base)
        self.lora_rank, self.lora_alpha, self.lora_layout = lora_rank, lora_alpha, lora_layout
        if lora_rank is not None:
            e, r, i = num_experts, lora_rank, self.intermediate_dim
            if lora_layout == "fused":
                self.lora_A_gate_up = _lora_a(e, r, hidden, gate_up)
                self.lora_B_gate_up = _lora_b(e, 2 * i, r, gate_up)
            elif lora_layout == "per-projection":
                # rows [0, r) of A are w1's (gate) lora_A, rows [r, 2r) are w3's (up): one GEMM for both.
                halves = [_lora_a(e, r, hidden, gate_up).data for _ in range(2)]
                self.lora_A_gate_up = nn.Parameter(torch.cat(halves, dim=1))
                self.lora_B_gate = _lora_b(e, i, r, gate_up)
                self.lora_B_up = _lora_b(e, i, r, gate_up)
            else:
                raise TunecostError(f"unknown expert LoRA layout {lora_layout!r}; valid: fused, per-projection")
            self.lora_A_down = _lora_a(e, r, i, gate_up)
            self.lora_B_down = _lora_b(e, hidden, r, gate_up)
        self.last_tokens_per_expert: torch.Tensor | None = None

    @property
    def scaling(self) -> float:
        return self.lora_alpha / self.lora_rank if self.lora_rank else 1.0

    def _base(self) -> BaseWeights:
        if self.quantized:
            return BaseWeights(self.gate_up_nf4, self.down_nf4, keep_dequantized=self.keep_dequantized)
        return BaseWeights(self.gate_up_proj, self.down_proj)

    def _lora(self) -> ExpertLora | None:
        if self.lora_rank is None:
            return None
        return ExpertLora(
            scaling=self.scaling,
            a_gate_up=self.lora_A_gate_up,
            b_gate_up=getattr(self, "lora_B_gate_up", None),
            b_gate=getattr(self, "lora_B_gate", None),
            b_up=getattr(self, "lora_B_up", None),
            a_down=self.lora_A_down,
            b_down=self.lora_B_down,
        )

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        out, counts = experts_forward(
            hidden_states,
            top_k_index,
            top_k_weights,
            base=self._base(),
            lora=self._lora(),
            activation=self.activation,
            num_experts=self.num_experts,
        )
        self.last_tokens_per_expert = counts.detach()
        return out

    @torch.no_grad()
    def dense_weights(self, merge_lora: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up (E, 2I, H), down (E, H, I)): de-quantized if 4-bit, plus s·B·A if `merge_lora`."""
        if self.quantized:
            gate_up, down = self.gate_up_nf4.dequantize(), self.down_nf4.dequantize()
        else:
            gate_up, down = self.gate_up_proj.detach().clone(), self.down_proj.detach().clone()
        if merge_lora and self.lora_rank is not None:
            s, r, i = self.scaling, self.lora_rank, self.intermediate_dim
            a = self.lora_A_gate_up
            if self.lora_layout == "fused":
                gate_up += s * torch.bmm(self.lora_B_gate_up, a)
            else:
                gate_up[:, :i] += s * torch.bmm(self.lora_B_gate, a[:, :r])
                gate_up[:, i:] += s * torch.bmm(self.lora_B_up, a[:, r:])
            down += s * torch.bmm(self.lora_B_down, self.lora_A_down)
        return gate_up, down

    def extra_repr(self) -> str:
        lora = f"lora r={self.lora_rank} alpha={self.lora_alpha} {self.lora_layout}" if self.lora_rank else "no lora"
        storage = "nf4" if self.quantized else "dense"
        return (
            f"experts={self.num_experts}, hidden={self.hidden_dim}, intermediate={self.intermediate_dim}, "
            f"act={self.activation}, {storage}, {lora}"
        )
