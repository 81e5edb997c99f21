"""tunecost.simulate: one fine-tuning step of any model from its config alone (fake tensors, no weights, no GPU):
peak memory with its breakdown, FLOPs and bytes moved per op class, and the largest batch that fits a GPU.

Sources and derivations: docs/memory-model.md, section `tunecost.simulate`.
"""

from tunecost.simulate.batch import MaxBatchResult, max_batch_size, simulated_max_batch_size
from tunecost.simulate.overhead import DEFAULT_OVERHEAD, DeviceOverhead
from tunecost.simulate.simulator import StepSimulation, simulate_step
from tunecost.simulate.step_types import StepCounts

__all__ = [
    "DEFAULT_OVERHEAD",
    "DeviceOverhead",
    "MaxBatchResult",
    "StepCounts",
    "StepSimulation",
    "max_batch_size",
    "simulate_step",
    "simulated_max_batch_size",
]
