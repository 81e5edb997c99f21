"""The paper's QLoRA experts: per-expert bitsandbytes `Linear4bit` w1/w3/w2 with LoRA, a loop over hit experts.

This is what transformers 4.40 + PEFT 0.7 + bitsandbytes 0.42 ran for Mixtral (the paper's stack): each expert an
`MixtralBlockSparseTop2MLP` with `nn.Linear` w1 (gate), w3 (up), w2 (down), quantized by `load_in_4bit` to
`Linear4bit` (nf4, double quantization, compute dtype = model dtype), each wrapped by PEFT's LoRA (rank r,
A kaiming-uniform, B zero, scaling alpha / r, y = base(x) + s B(A(x))), and the MoE block looping over the experts
that received tokens. transformers 5 no longer quantizes fused experts, so we rebuild that module on an instance.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from tunecost.moe.core import activation_forward
from tunecost.moe.spec import LoraSpec


def make_linear4bit(weight: torch.Tensor, *, blocksize: int = 64, double_quant: bool = True) -> nn.Module:
    """A frozen `bitsandbytes.nn.Linear4bit` holding `weight` (out, in) in nf4; computes in the weight's dtype."""
    import bitsandbytes as bnb

    out_features, in_features = weight.shape
    layer = bnb.nn.Linear4bit(
        in_features,
        out_features,
        bias=False,
        compute_dtype=weight.dtype,
        compress_statistics=double_quant,
        quant_type="nf4",
        device="meta",
    )
    layer.weight = bnb.nn.Params4bit(
        weight.detach().contiguous().clone(),
        requires_grad=False,
        blocksize=blocksize,
        compress_statistics=double_quant,
        quant_type="nf4",
    )
    return layer.to(weight.device)  # moving an unquantized Params4bit quantizes it (CPU too, bnb >= 0.48)


class LoraLinear(nn.Module):
    """y = base(x) + s * lora_B(lora_A(x)): the forward of PEFT's `lora.Linear` / `lora.bnb.Linear4bit`
    (dropout 0) around a frozen `nn.Linear` or `Linear4bit`."""

    def __init__(self, base: Any, *, rank: int, alpha: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.base_layer = base
        self.scaling = alpha / rank
        device = base.weight.device
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, device=device, dtype=dtype)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, device=device, dtype=dtype)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling


class Linear4bitExpert(nn.Module):
    """One expert as transformers 4.40's `MixtralBlockSparseTop2MLP`: w2(act(w1(x)) * w3(x))."""

    def __init__(self, w1: nn.Module, w3: nn.Module, w2: nn.Module, activation: str) -> None:
        super().__init__()
        self.w1, self.w3, self.w2 = w1, w3, w2
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # labels let a profiler split the expert matmuls by weight (paper Fig. 6: W1 / W3 / W2)
        with record_function("tunecost.moe.w1"):
            gate = self.w1(x)
        with record_function("tunecost.moe.w3"):
            up = self.w3(x)
        with record_function("tunecost.moe.w2"):
            return self.w2(activation_forward(self.activation, gate) * up)


class Linear4bitExperts(nn.Module):
    """E `Linear4bitExpert`s behind transformers 5's experts call contract (hidden, top_k_index, top_k_weights)."""

    def __init__(
        self, gate_up: torch.Tensor, down: torch.Tensor, *, activation: str = "silu", lora: LoraSpec | None = None
    ) -> None:
        """`lora`: per-projection LoRA on w1, w3 and w2 of every expert when it targets the experts."""
        super().__init__()
        num_experts, two_i, hidden = gate_up.shape
        intermediate = two_i // 2
        self.num_experts, self.hidden_dim, self.intermediate_dim = num_experts, hidden, intermediate
        lora_rank = lora.rank if lora is not None and lora.on_experts else None
        lora_alpha = lora.alpha if lora is not None else 32
        self.lora_rank, self.lora_alpha = lora_rank, lora_alpha

        def wrap(weight: torch.Tensor) -> nn.Module:
            layer = make_linear4bit(weight)
            if lora_rank is None:
                return layer
            return LoraLinear(layer, rank=lora_rank, alpha=lora_alpha, dtype=gate_up.dtype)

        self.experts = nn.ModuleList(
            Linear4bitExpert(
                wrap(gate_up[e, :intermediate]), wrap(gate_up[e, intermediate:]), wrap(down[e]), activation
            )
            for e in range(num_experts)
        )
        self.last_tokens_per_expert: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        # transformers 4.40's MixtralSparseMoeBlock loop (one_hot mask, torch.where per expert, index_add_).
        final_hidden_states = torch.zeros_like(hidden_states)
        expert_mask = F.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
        counts = expert_mask.sum(dim=(1, 2))
        self.last_tokens_per_expert = counts.detach()
        for expert_idx in torch.nonzero(counts).flatten().tolist():
            slot, token = torch.where(expert_mask[expert_idx])
            current = self.experts[expert_idx](hidden_states[token])
            current = current * top_k_weights[token, slot, None]
            final_hidden_states.index_add_(0, token, current.to(hidden_states.dtype))
        return final_hidden_states

    @torch.no_grad()
    def dense_weights(self, merge_lora: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up (E, 2I, H), down (E, H, I)) de-quantized, plus s·B·A if `merge_lora`."""
        import bitsandbytes.functional as bnbf

        def weight(module: Any) -> torch.Tensor:
            base = module.base_layer if isinstance(module, LoraLinear) else module
            w = bnbf.dequantize_4bit(base.weight.data, base.weight.quant_state)
            if merge_lora and isinstance(module, LoraLinear):
                w = w + module.scaling * (module.lora_B.weight @ module.lora_A.weight)
            return w

        gate_up = torch.stack([torch.cat([weight(e.w1), weight(e.w3)]) for e in self.experts])
        down = torch.stack([weight(e.w2) for e in self.experts])
        return gate_up, down

    def extra_repr(self) -> str:
        lora = f"lora r={self.lora_rank} alpha={self.lora_alpha}" if self.lora_rank else "no lora"
        return f"experts={self.num_experts}, Linear4bit nf4 w1/w3/w2, {lora}"
