"""Tokens per expert per MoE layer, for any installed experts implementation (paper Fig. 11).

Counts come from the router's top-k indices (a forward hook on `block.gate`, which every implementation keeps, PEFT
wrapper or not), accumulated on the device without a host sync per step. Router calls made while autograd runs a
backward are gradient-checkpointing recomputations of a forward already counted, so they are skipped.
"""

from __future__ import annotations

import torch

from tunecost.errors import TunecostError
from tunecost.models.anatomy import unwrap_peft as _unwrap
from tunecost.moe.install import moe_layers


class ExpertLoadRecorder:
    """Context manager: `with ExpertLoadRecorder(model) as rec: ...; rec.counts()` -> {layer name: [E counts]}."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._layers = moe_layers(model)
        if not all(hasattr(_unwrap(layer.router), "top_k") for layer in self._layers):
            raise TunecostError(
                "ExpertLoadRecorder reads Mixtral-style routers; BlackMamba returns tokens_per_expert itself "
                "(model(..., output_router_logits=True).tokens_per_expert)"
            )
        self._totals: dict[str, torch.Tensor] = {}
        self._handles: list = []

    def _hook(self, name: str, num_experts: int):
        def hook(module, args, output) -> None:
            if torch._C._current_graph_task_id() != -1:  # inside backward: a checkpoint recomputation
                return
            indices = output[2].reshape(-1)
            counts = torch.bincount(indices, minlength=num_experts).to(torch.int64)
            self._totals[name] = self._totals[name] + counts if name in self._totals else counts

        return hook

    def __enter__(self) -> ExpertLoadRecorder:
        for layer in self._layers:
            num_experts = _unwrap(layer.router).num_experts
            self._handles.append(layer.router.register_forward_hook(self._hook(layer.name, num_experts)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def reset(self) -> None:
        self._totals.clear()

    def counts(self) -> dict[str, list[int]]:
        """Tokens routed to each expert (a token counts once per expert it is sent to), per layer."""
        return {name: total.tolist() for name, total in self._totals.items()}
