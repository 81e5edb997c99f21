"""How a job is spread over GPUs: a frozen, self-validating description."""

from __future__ import annotations

from dataclasses import dataclass

from tunecost.errors import TunecostError

# strategy -> what it shards (P: parameters, G: gradients, O: optimizer states) across the data-parallel group
STRATEGIES = {
    "ddp": "",  # one full replica per rank; gradients all-reduced in buckets
    "fsdp2": "PGO",  # fully_shard, parameters resharded after forward
    "fsdp2-shard-grad-op": "GO",  # reshard_after_forward=False: parameters stay unsharded until backward ends
    "hsdp": "PGO",  # fsdp2 within a node, replicated across nodes (gradients all-reduced between nodes)
    "zero1": "O",  # DeepSpeed ZeRO stage 1
    "zero2": "GO",  # DeepSpeed ZeRO stage 2
    "zero3": "PGO",  # DeepSpeed ZeRO stage 3
}


@dataclass(frozen=True, kw_only=True)
class ParallelPlan:
    """A data-parallel (optionally expert-parallel) layout.

    num_gpus: ranks in total.
    gpus_per_node: ranks per node (collectives across nodes use the inter-node link).
    strategy: one of `STRATEGIES`.
    expert_parallel: expert-parallel degree for MoE models (1: every rank holds every expert); it must divide
        the number of GPUs and, checked by `check_experts`, the number of experts.
    """

    num_gpus: int = 1
    gpus_per_node: int = 8
    strategy: str = "fsdp2"
    expert_parallel: int = 1

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise TunecostError(f"number of GPUs must be at least 1, got {self.num_gpus}")
        if self.gpus_per_node < 1:
            raise TunecostError(f"GPUs per node must be at least 1, got {self.gpus_per_node}")
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            raise TunecostError(
                f"{self.num_gpus} GPUs cannot be split into whole nodes of {self.gpus_per_node} GPUs; "
                f"use a multiple of {self.gpus_per_node}"
            )
        if self.strategy not in STRATEGIES:
            raise TunecostError(f"unknown strategy {self.strategy!r}; supported: {', '.join(STRATEGIES)}")
        if self.expert_parallel < 1 or self.num_gpus % self.expert_parallel:
            raise TunecostError(
                f"expert-parallel degree {self.expert_parallel} must be at least 1 and divide the {self.num_gpus} GPUs"
            )

    @property
    def num_nodes(self) -> int:
        return max(1, -(-self.num_gpus // self.gpus_per_node))

    @property
    def intra_node(self) -> bool:
        """True when every rank sits in one node (collectives stay on the node's link)."""
        return self.num_gpus <= self.gpus_per_node

    def check_experts(self, num_experts: int) -> None:
        """Raise when the expert-parallel degree does not divide the model's experts."""
        if self.expert_parallel > 1 and (num_experts < 1 or num_experts % self.expert_parallel):
            raise TunecostError(
                f"expert-parallel degree {self.expert_parallel} does not divide the model's {num_experts} experts"
            )
