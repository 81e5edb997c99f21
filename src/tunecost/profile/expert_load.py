"""Tokens routed to each expert of each MoE layer (paper Fig. 11), counted by a forward hook on every router.

The hook reads the router's output: transformers routers (Mixtral, OLMoE, Qwen-MoE) return
`(logits, scores, top_k_index)`, so the chosen experts are taken as they are; a router that returns only logits
(BlackMamba's `nn.Linear`) is counted by its top-k over the logits (same experts for softmax or sigmoid scores,
both monotonic). Padding tokens are left out when a token mask is set. Counts stay on the device (one `bincount`
per layer, no sync) until `counts()`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from tunecost.errors import TunecostError
from tunecost.models.anatomy import moe_blocks


@dataclass(frozen=True, kw_only=True)
class ExpertLoad:
    """tokens[layer_index][expert]: token-to-expert assignments (a token counts once for each of its top-k)."""

    tokens: dict[int, list[int]]

    def variance(self, layer_index: int) -> float:
        """Population variance of the tokens per expert of one layer (the paper's imbalance measure)."""
        return float(statistics.pvariance(self.tokens[layer_index]))

    def rows(self) -> list[dict[str, Any]]:
        return [
            {"layer_index": layer, "expert": e, "tokens": n}
            for layer, counts in sorted(self.tokens.items())
            for e, n in enumerate(counts)
        ]


class ExpertLoadCounter:
    """Forward hooks on every router that add up tokens per expert while `counting` is True."""

    def __init__(self, model: Any, *, experts_per_token: int | None = None) -> None:
        self.model = model
        self.counting = True
        self._routers: list[tuple[int, Any, int, int | None]] = []
        for block in moe_blocks(model):
            top_k = block.top_k if block.top_k is not None else experts_per_token
            self._routers.append((block.layer_index, block.router, block.num_experts, top_k))
        if not self._routers:
            raise TunecostError(f"{type(model).__name__} has no MoE routers to count tokens per expert")
        self._handles: list[Any] = []
        self._counts: dict[int, Any] = {}
        self._mask: Any = None

    @property
    def layer_indices(self) -> list[int]:
        return [index for index, *_ in self._routers]

    def set_token_mask(self, mask: Any) -> None:
        """A (batch, seq) 0/1 mask of real tokens (None: count every token)."""
        self._mask = None if mask is None else mask.reshape(-1).bool()

    def attach(self) -> ExpertLoadCounter:
        if not self._handles:
            for index, router, num_experts, top_k in self._routers:
                self._handles.append(router.register_forward_hook(self._hook(index, num_experts, top_k)))
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> ExpertLoadCounter:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def reset(self) -> None:
        self._counts.clear()

    def _hook(self, index: int, num_experts: int, top_k: int | None) -> Any:
        import torch

        def hook(module: Any, args: Any, output: Any) -> None:
            if not self.counting:
                return
            if torch._C._current_autograd_node() is not None:
                return  # activation-checkpointing recomputation: these tokens were counted in the forward
            chosen = _chosen_experts(output, top_k)
            if self._mask is not None and chosen.shape[0] == self._mask.numel():
                chosen = chosen[self._mask.to(chosen.device)]
            counts = torch.bincount(chosen.reshape(-1), minlength=num_experts)
            self._counts[index] = counts if index not in self._counts else self._counts[index] + counts

        return hook

    def counts(self) -> ExpertLoad:
        """Tokens per expert per layer since the last `reset()` (synchronises once)."""
        tokens: dict[int, list[int]] = {}
        for index, _, num_experts, _ in self._routers:
            c = self._counts.get(index)
            tokens[index] = [0] * num_experts if c is None else [int(v) for v in c.detach().cpu().tolist()]
        return ExpertLoad(tokens=tokens)


def _chosen_experts(output: Any, top_k: int | None) -> Any:
    """(tokens, k) expert indices from a router's output."""
    import torch

    if isinstance(output, (tuple, list)):
        ints = [o for o in output if isinstance(o, torch.Tensor) and not o.is_floating_point()]
        if ints:
            return ints[-1].reshape(ints[-1].shape[0], -1) if ints[-1].dim() > 1 else ints[-1].reshape(-1, 1)
        output = output[0]
    if not isinstance(output, torch.Tensor):
        raise TunecostError(f"router output of type {type(output).__name__} has no logits or expert indices")
    if top_k is None:
        raise TunecostError("router returns only logits and its top-k is unknown: pass experts_per_token")
    logits = output.reshape(-1, output.shape[-1])
    return torch.topk(logits.detach(), top_k, dim=-1).indices
