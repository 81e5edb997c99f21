"""How a job is spread over GPUs: a frozen, self-validating description (`FineTuneJob.parallel`)."""

from __future__ import annotations

from dataclasses import dataclass

from tunecost.errors import TunecostError
from tunecost.workload.offload import check_offload

# strategy -> what it shards (P: parameters, G: gradients, O: optimizer states) across the data-parallel group
STRATEGIES = {
    "single": "",  # one GPU: nothing to shard
    "ddp": "",  # one full replica per rank; gradients all-reduced in buckets
    "fsdp2": "PGO",  # fully_shard, parameters resharded after forward
    "fsdp1": "PGO",  # torch FullyShardedDataParallel FULL_SHARD (accelerate's FSDP plugin): as fsdp2, plus `fsdp1`
    "fsdp2-shard-grad-op": "GO",  # reshard_after_forward=False: parameters stay unsharded until backward ends
    "hsdp": "PGO",  # fsdp2 within a node, replicated across nodes (gradients all-reduced between nodes)
    "zero1": "O",  # DeepSpeed ZeRO stage 1
    "zero2": "GO",  # DeepSpeed ZeRO stage 2
    "zero3": "PGO",  # DeepSpeed ZeRO stage 3
}
MULTI_GPU_STRATEGIES = tuple(s for s in STRATEGIES if s != "single")
DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed's default zero_optimization.reduce_bucket_size
DEFAULT_MAX_GPUS = 64  # --gpus auto: the most GPUs searched
MAX_SEARCH_GPUS = 100_000  # every count up to the limit is evaluated (arithmetic only)


def check_fsdp2_method(method: str, *, alternatives: str = "--method lora or full") -> None:
    """Refuse QLoRA where tunecost runs PyTorch's FSDP2 itself (the fake-process-group simulation of a rank and
    `tunecost profile --nproc-per-node`): FSDP2 shards 4-bit weights only when bitsandbytes stores them in a float
    dtype (`bnb_4bit_quant_storage`), which neither tunecost's 4-bit layer nor its profiling setup does yet."""
    if method == "qlora":
        raise TunecostError(
            "QLoRA under FSDP2 is not supported: sharding 4-bit weights needs bitsandbytes' float quant storage "
            f"(bnb_4bit_quant_storage), which tunecost neither models nor sets up yet; use {alternatives}"
        )


@dataclass(frozen=True, kw_only=True)
class ParallelPlan:
    """A data-parallel (optionally expert-parallel) layout; the default is one GPU.

    num_gpus: ranks in total.
    gpus_per_node: ranks per node (collectives across nodes use the inter-node link); None: all on one node.
    strategy: one of `STRATEGIES` ("single" for one GPU).
    expert_parallel: expert-parallel degree for MoE models (1: every rank holds every expert); it must divide
        the number of GPUs and, checked by `check_experts`, the number of experts.
    offload: DeepSpeed ZeRO CPU offload: "none", "optimizer" (zero1/2/3) or "params" (zero3; parameters and
        optimizer), see `offload`.
    reduce_bucket_elements, overlap_comm: DeepSpeed ZeRO-1/2's `zero_optimization.reduce_bucket_size` and
        `overlap_comm` (its defaults: 5e8 elements, off): the gradient buckets each backward allocates, two with
        overlap_comm.
    """

    num_gpus: int = 1
    gpus_per_node: int | None = None
    strategy: str = "single"
    expert_parallel: int = 1
    offload: str = "none"
    reduce_bucket_elements: int = DEEPSPEED_REDUCE_BUCKET_ELEMENTS
    overlap_comm: bool = False

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise TunecostError(f"number of GPUs must be at least 1, got {self.num_gpus}")
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise TunecostError(f"GPUs per node must be at least 1, got {self.gpus_per_node}")
        if self.num_gpus > self.node_size and self.num_gpus % self.node_size:
            raise TunecostError(
                f"{self.num_gpus} GPUs cannot be split into whole nodes of {self.node_size} GPUs; "
                f"use a multiple of {self.node_size}"
            )
        if self.strategy not in STRATEGIES:
            raise TunecostError(f"unknown strategy {self.strategy!r}; supported: {', '.join(STRATEGIES)}")
        if self.strategy == "single" and self.num_gpus != 1:
            raise TunecostError(
                f"a job on {self.num_gpus} GPUs needs a multi-GPU strategy ({', '.join(MULTI_GPU_STRATEGIES)}), "
                "not 'single'"
            )
        if self.expert_parallel < 1 or self.num_gpus % self.expert_parallel:
            raise TunecostError(
                f"expert-parallel degree {self.expert_parallel} must be at least 1 and divide the {self.num_gpus} GPUs"
            )
        check_offload(self.offload, self.strategy)
        if self.reduce_bucket_elements < 1:
            raise TunecostError(f"reduce_bucket_size must be at least 1 element, got {self.reduce_bucket_elements}")

    @property
    def num_reduce_buckets(self) -> int:
        """DeepSpeed ZeRO-1/2's gradient buckets per backward: two with overlap_comm (double buffering), else one."""
        return 2 if self.overlap_comm else 1

    @property
    def node_size(self) -> int:
        """GPUs per node, with None read as every GPU on one node."""
        return self.num_gpus if self.gpus_per_node is None else self.gpus_per_node

    @property
    def num_nodes(self) -> int:
        return max(1, -(-self.num_gpus // self.node_size))

    @property
    def intra_node(self) -> bool:
        """True when every rank sits in one node (collectives stay on the node's link)."""
        return self.num_gpus <= self.node_size

    def check_experts(self, num_experts: int) -> None:
        """Raise when the expert-parallel degree does not divide the model's experts."""
        if self.expert_parallel > 1 and (num_experts < 1 or num_experts % self.expert_parallel):
            raise TunecostError(
                f"expert-parallel degree {self.expert_parallel} does not divide the model's {num_experts} experts"
            )
