"""Result types of the simulator that import nothing heavy (cached answers load without torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = (
    "weights_4bit",
    "quant_constants",
    "frozen_weights",
    "trainable_params",
    "buffers",
    "gradients",
    "optimizer_states",
    "activations",
    "temporaries",
    "inputs",
)
WEIGHT_CATEGORIES = ("weights_4bit", "quant_constants", "frozen_weights", "trainable_params", "buffers")
STATIC_CATEGORIES = (*WEIGHT_CATEGORIES, "optimizer_states")


@dataclass(frozen=True, kw_only=True)
class StepCounts:
    """FLOPs and bytes moved of one phase (or a whole step), by op class. Base units: FLOPs, bytes."""

    flops_by_class: dict[str, float] = field(default_factory=dict)
    bytes_by_class: dict[str, float] = field(default_factory=dict)

    @property
    def flops(self) -> float:
        return float(sum(self.flops_by_class.values()))

    @property
    def matmul_flops(self) -> float:
        """Tensor-core work: every class except element-wise and optimizer (which count 1 FLOP/element)."""
        return float(sum(v for k, v in self.flops_by_class.items() if k not in ("elementwise", "optimizer")))

    @property
    def bytes_moved(self) -> float:
        return float(sum(self.bytes_by_class.values()))

    def plus(self, other: StepCounts) -> StepCounts:
        return StepCounts(
            flops_by_class=_add(self.flops_by_class, other.flops_by_class),
            bytes_by_class=_add(self.bytes_by_class, other.bytes_by_class),
        )


def _add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) + v
    return out


def total_counts(by_phase: dict[str, StepCounts]) -> StepCounts:
    total = StepCounts()
    for counts in by_phase.values():
        total = total.plus(counts)
    return total


@dataclass(frozen=True, kw_only=True)
class AllocationTrace:
    """One traced step's allocations in the order the caching allocator sees them, as plain lists (JSON-ready;
    `simulate.allocator` replays them). Per record: bytes (rounded to the granule), the op index that allocates
    and frees it (`allocator.NEVER_FREED`: never), its replay kind (`allocator.KIND_*`), its category (an index
    into `CATEGORIES`; a storage that became a parameter's gradient counts as "gradients") and the decoder layer
    of the op that allocated it (-1: outside the layers). Per traced layer: the first and last op index of its
    forward and of its backward (recompute included); -1 where the layer has none."""

    nbytes: list[int]
    t_alloc: list[int]
    t_free: list[int]
    kind: list[int]
    category: list[int]
    layer: list[int]
    forward_ops: list[list[int]]  # per layer: [first, last] op index of its forward
    backward_ops: list[list[int]]  # per layer: [first, last] op index of its backward and recompute
    t_optimizer: int  # index of the first optimizer op
    num_ops: int
