"""Dense versus sparse MoE routing (the paper's ``num_experts_per_tok`` 2 or 8); top-k itself is read and set
through `tunecost.models.anatomy`."""

from __future__ import annotations


def routing_name(k: int, num_experts: int) -> str:
    """ "dense" when every expert is used, else "sparse" (paper §III)."""
    return "dense" if k >= num_experts else "sparse"
