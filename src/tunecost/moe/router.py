"""LoRA on the Mixtral router: logits = x W^T + s (x A^T) B^T, then the model's own top-k semantics.

`LoraRouter` subclasses transformers' `MixtralTopKRouter`, so transformers' output recorder (which finds routers by
class to collect `router_logits` for the load-balancing loss) still sees it, and returns the same triple
(router_logits, top-k scores, top-k indices). The logits carry the LoRA term, so the aux loss and its gradient see
it exactly as PEFT's LoRA on the paper's `gate` `nn.Linear` did. `lora_A` / `lora_B` are `nn.Linear`s as in PEFT,
so state-dict keys read `...mlp.gate.lora_A.weight`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter


class LoraRouter(MixtralTopKRouter):
    """A `MixtralTopKRouter` whose frozen weight (E, H) carries a rank-r LoRA."""

    def __init__(self, config, weight: torch.Tensor, *, rank: int, alpha: float) -> None:
        super().__init__(config)
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        self.rank, self.alpha = rank, alpha
        self.scaling = alpha / rank
        self.lora_A = nn.Linear(self.hidden_dim, rank, bias=False, device=weight.device, dtype=weight.dtype)
        self.lora_B = nn.Linear(rank, self.num_experts, bias=False, device=weight.device, dtype=weight.dtype)
        # PEFT's init: A ~ kaiming_uniform(a=sqrt(5)) = U(+-1/sqrt(H)), B = 0, so the start equals the base model.
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, hidden_states: torch.Tensor):
        # Mirrors MixtralTopKRouter.forward (transformers 5.x) with the LoRA term added to the logits;
        # tests pin it to the stock router (B = 0) and to PEFT's LoRA on `gate.weight` (B != 0).
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        router_logits = F.linear(hidden_states, self.weight) + self.scaling * self.lora_B(self.lora_A(hidden_states))
        router_probs = torch.nn.functional.softmax(router_logits.float(), dim=-1)
        router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
        router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
        return router_logits, router_top_value, router_indices

    @torch.no_grad()
    def merged_weight(self) -> torch.Tensor:
        return self.weight + self.scaling * (self.lora_B.weight @ self.lora_A.weight)

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, hidden={self.hidden_dim}, top_k={self.top_k}, lora r={self.rank}"
