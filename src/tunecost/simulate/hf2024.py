"""The paper's 2024 software stack, as far as it changes memory: transformers 4.40 + PEFT 0.7 + bitsandbytes 0.42
under LLaMA-Factory, with torch 2.1 (the versions the paper used).

Sources and derivations: docs/memory-model.md, section `tunecost.simulate.hf2024`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tunecost.simulate.modules import SimLinear, expert_weights, split_gate_up
from tunecost.simulate.quant4bit import QuantSpec, tokens_per_expert


class Loop2024Experts(nn.Module):
    """Per-expert w1/w3/w2 modules (4-bit or frozen + PEFT-style LoRA, or trainable for full fine-tuning) looped
    over experts as in transformers 4.40's `MixtralSparseMoeBlock`."""

    def __init__(
        self, experts: Any, *, quant: QuantSpec | None, lora_rank: int | None, lora_alpha: float, trainable: bool
    ) -> None:
        super().__init__()
        weights = expert_weights(experts)
        self.num_experts, _, self.hidden_dim = weights.gate_up.shape
        self.glu = weights.glu
        self.w1, self.w3, self.w2 = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        for e in range(self.num_experts):
            gate, up = weights.rows(e)
            gate_b, up_b = (None, None)
            if weights.gate_up_bias is not None:
                gate_b, up_b = split_gate_up(weights.gate_up_bias[e], weights.layout)
            down_b = None if weights.down_bias is None else weights.down_bias[e]
            mats = {"w1": (gate, gate_b), "w3": (up, up_b), "w2": (weights.down[e], down_b)}
            for name, (w, b) in mats.items():
                linear = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device="meta")
                linear.weight = nn.Parameter(_copy(w), requires_grad=trainable)
                if b is not None:
                    linear.bias = nn.Parameter(_copy(b), requires_grad=trainable)
                lin: nn.Module = (
                    linear
                    if trainable
                    else SimLinear(linear, quant=quant, lora_rank=lora_rank, lora_alpha=lora_alpha, style="peft-2024")
                )
                getattr(self, name).append(lin)

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        num_top_k = top_k_index.size(-1)
        final = torch.zeros_like(hidden_states)
        routing_weights = top_k_weights.to(hidden_states.dtype)
        expert_ids_g, perm = torch.sort(top_k_index.reshape(-1))
        counts = tokens_per_expert(expert_ids_g, self.num_experts)
        token_idx, pos_idx = perm // num_top_k, perm % num_top_k
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            top_x, idx = token_idx[start : start + n], pos_idx[start : start + n]
            current_state = hidden_states[top_x]
            h = self.glu(self.w1[e](current_state), self.w3[e](current_state))
            h = self.w2[e](h) * routing_weights[top_x, idx, None]
            final.index_add_(0, top_x, h.to(hidden_states.dtype))
            start += n
        return final


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of a weight slice (a meta tensor of its shape for a meta weight)."""
    return (
        t.data.clone(memory_format=torch.contiguous_format)
        if t.device.type != "meta"
        else torch.empty(t.shape, dtype=t.dtype, device="meta")
    )


def causal_lm_loss_2024(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """transformers 4.40's Mixtral/Llama loss: fp32 logits, a contiguous shifted copy, CrossEntropyLoss."""
    logits = logits.float()
    shift_logits = logits[..., :-1, :].contiguous()
    shift_labels = labels[..., 1:].contiguous()
    return nn.functional.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))


def load_balancing_loss_2024(gate_logits: tuple[torch.Tensor, ...], num_experts: int, top_k: int) -> torch.Tensor:
    """transformers 4.40's `load_balancing_loss_func` without an attention mask."""
    concatenated = torch.cat(list(gate_logits), dim=0)
    routing_weights = nn.functional.softmax(concatenated, dim=-1)
    _, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = nn.functional.one_hot(selected_experts, num_experts)
    tokens_per_expert_frac = torch.mean(expert_mask.float(), dim=0)
    router_prob_per_expert = torch.mean(routing_weights, dim=0)
    overall = torch.sum(tokens_per_expert_frac * router_prob_per_expert.unsqueeze(0))
    return overall * num_experts
