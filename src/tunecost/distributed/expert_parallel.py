"""Expert parallelism (EP) for MoE models: each rank of an expert-parallel group of `ep` ranks holds
num_experts / ep of every MoE layer's routed experts, and tokens travel to their experts and back by all-to-all.

Sources and derivations: docs/multi-gpu.md, section `tunecost.distributed.expert_parallel`.
"""

from __future__ import annotations

from collections.abc import Mapping

from tunecost.errors import TunecostError
from tunecost.workload.parallel import ParallelPlan

EXPERT_GROUP = "experts"  # the routed experts' group in the step simulator's records (shared experts excluded)
ALL_TO_ALLS_FORWARD = 2  # dispatch, combine
ALL_TO_ALLS_BACKWARD = 2  # gradients of combine and dispatch
EP_STRATEGIES = ("ddp", "fsdp2", "fsdp2-shard-grad-op", "zero1", "zero2", "zero3")  # hsdp + EP is not modelled


def check_expert_parallel(plan: ParallelPlan, *, num_experts: int, model: str) -> None:
    """One-line errors for an expert-parallel degree the model or the strategy cannot take."""
    ep = plan.expert_parallel
    if ep == 1:
        return
    if num_experts <= 1:
        raise TunecostError(f"expert-parallel degree {ep} needs an MoE model; {model} is dense (no experts to shard)")
    plan.check_experts(num_experts)
    if plan.strategy not in EP_STRATEGIES:
        raise TunecostError(
            f"expert-parallel degree {ep} with {plan.strategy} is not modelled; use {', '.join(EP_STRATEGIES)}"
        )


def searched_degrees(num_experts: int, max_gpus: int) -> list[int]:
    """The expert-parallel degrees a search weighs beside none: 2, 4 and 8 where they divide the model's experts
    and `max_gpus` (none for a dense model)."""
    return [e for e in (2, 4, 8) if num_experts > 1 and num_experts % e == 0 and e <= max_gpus]


def dispatch_bytes(*, num_tokens: int, experts_per_token: int, hidden_size: int, bytes_per_element: int) -> int:
    """Bytes one rank sends in one dispatch (or combine) all-to-all: every token's hidden state once per chosen
    expert (balanced routing; tokens for the rank's own experts included, as nccl-tests counts the buffer)."""
    return num_tokens * experts_per_token * hidden_size * bytes_per_element


def all_to_all_per_layer(*, recompute: bool) -> dict[str, int]:
    """All-to-alls of one MoE layer per phase: dispatch and combine, their gradients, and the recompute's."""
    backward = ALL_TO_ALLS_BACKWARD + (ALL_TO_ALLS_FORWARD if recompute else 0)
    return {"forward": ALL_TO_ALLS_FORWARD, "backward": backward}


def all_to_all_buffer_bytes(layer_dispatch_bytes: int) -> int:
    """Send and receive buffers of one all-to-all alive while a MoE layer runs (balanced: equal sizes)."""
    return 2 * layer_dispatch_bytes


def expert_bytes(weight_bytes_by_key: Mapping[str, int], category: str) -> int:
    """Bytes of `category` ("frozen_weights", "trainable_params", ...) that belong to the routed experts."""
    return weight_bytes_by_key.get(f"{EXPERT_GROUP}/{category}", 0)


def split_expert_bytes(nbytes: int, expert_share: float, expert_parallel: int) -> tuple[float, float]:
    """(non-expert bytes, this rank's expert bytes) of `nbytes` of which `expert_share` belongs to the experts."""
    expert = nbytes * expert_share
    return nbytes - expert, expert / expert_parallel
