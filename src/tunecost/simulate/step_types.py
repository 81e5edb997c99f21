"""Result types of the simulator that import nothing heavy (cached answers load without torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    "weights_8bit",  # last: trace codes index this tuple
)
WEIGHT_CATEGORIES = ("weights_4bit", "weights_8bit", "quant_constants", "frozen_weights", "trainable_params", "buffers")
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
    into `CATEGORIES`; a storage that became a parameter's gradient counts as "gradients") and its decoder layer
    (a weight's or state's own, else the allocating op's or, in the optimizer, its parameter's; -1: outside). Per
    traced layer: the first and last op index of its forward and of its backward (recompute included); -1 where the
    layer has none."""

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


SIMULATOR_VERSION = "9"  # 3: allocator replay; 4: no dropout mask under fused kernels; 5: notes; 6: temporaries;
# 7: a parameter's AccumulateGrad in its layer's backward; 9: a stack's checkpointing noted only where the job has it


@dataclass(frozen=True, kw_only=True)
class StepSimulation:
    """The simulated step. Bytes are device bytes as `torch.cuda.max_memory_allocated` counts them (512-byte
    granules), without the device overhead, which is given separately; `peak_reserved_bytes` is what
    `torch.cuda.max_memory_reserved` would show over a run of such steps (the caching allocator replayed)."""

    model: str
    method: str
    stack: str
    batch_size: int
    seq_len: int
    num_layers: int
    peak_bytes: int
    peak_segment: str  # where in the step the peak falls, e.g. "backward:unit_last"
    breakdown_bytes: dict[str, int]  # category -> bytes at the peak
    module_bytes: dict[str, int]  # module group -> bytes at the peak
    weight_bytes: dict[str, int]  # "group/category" -> bytes of the stored weights (4-bit, constants, ...)
    counts: dict[str, StepCounts]  # phase (forward, backward, recompute, optimizer) -> FLOPs and bytes by class
    flops_by_module: dict[str, dict[str, float]]  # module group -> phase -> FLOPs
    device_overhead_bytes: int
    peak_reserved_bytes: int
    layers_traced: tuple[int, ...]
    seconds_taken: float
    assumptions: tuple[str, ...] = field(default=())

    @property
    def total_counts(self) -> StepCounts:
        return total_counts(self.counts)

    @property
    def flops_per_step(self) -> float:
        return self.total_counts.flops

    @property
    def static_bytes(self) -> int:
        return sum(v for k, v in self.breakdown_bytes.items() if k in STATIC_CATEGORIES)

    @property
    def weight_storage_bytes(self) -> int:
        return sum(v for k, v in self.weight_bytes.items() if not k.endswith("trainable_params"))

    def to_dict(self) -> dict[str, Any]:
        """The simulation as plain data (what `tunecost memory --json` prints), sizes in bytes."""
        total = self.total_counts
        job_fields = ("model", "method", "stack", "batch_size", "seq_len", "num_layers")  # printed as they are
        return {
            **{name: getattr(self, name) for name in job_fields},
            "layers_traced": list(self.layers_traced),
            "peak_bytes": self.peak_bytes,
            "peak_segment": self.peak_segment,
            "breakdown": self.breakdown_bytes,
            "module_bytes": self.module_bytes,
            "weight_bytes": self.weight_bytes,
            "weight_storage_bytes": self.weight_storage_bytes,
            "flops_per_step": total.flops,
            "matmul_flops_per_step": total.matmul_flops,
            "bytes_moved_per_step": total.bytes_moved,
            "flops_by_phase": {p: c.flops_by_class for p, c in self.counts.items()},
            "bytes_by_phase": {p: c.bytes_by_class for p, c in self.counts.items()},
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "device_overhead_bytes": self.device_overhead_bytes,
            "seconds_taken": self.seconds_taken,
            "assumptions": list(self.assumptions),
        }
