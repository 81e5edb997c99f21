"""Dense versus sparse MoE: set how many experts each token uses (the paper's ``num_experts_per_tok`` 2 or 8)."""

from __future__ import annotations

from typing import Any

from tunecost.errors import TunecostError


def num_experts_of(model: Any) -> int | None:
    config = getattr(model, "config", None)
    for key in ("num_local_experts", "num_experts"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def set_experts_per_token(model: Any, k: int) -> int:
    """Route every token to its top-`k` experts (k = number of experts: dense). Returns the number of experts.

    Updates the config and every routing module (transformers' Mixtral router and MoE block keep their own
    ``top_k``), and the model's ``num_experts_per_tok`` used by the load-balancing loss."""
    num_experts = num_experts_of(model)
    if num_experts is None:
        raise TunecostError("this model has no experts (no num_local_experts / num_experts in its config)")
    if not 1 <= k <= num_experts:
        raise TunecostError(f"experts per token must be within 1..{num_experts}, got {k}")
    own_setter = getattr(model, "set_experts_per_token", None)
    if callable(own_setter):  # e.g. tunecost's BlackMamba: frozen config, routing in its MoE mixers
        own_setter(k)
        return num_experts
    model.config.num_experts_per_tok = k
    for module in model.modules():
        if isinstance(getattr(module, "top_k", None), int):
            module.top_k = k
    if hasattr(model, "num_experts_per_tok"):
        model.num_experts_per_tok = k
    return num_experts


def routing_name(k: int, num_experts: int) -> str:
    """ "dense" when every expert is used, else "sparse" (paper §III)."""
    return "dense" if k >= num_experts else "sparse"
