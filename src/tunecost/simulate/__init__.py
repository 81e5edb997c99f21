"""tunecost.simulate: one fine-tuning step of any model from its config alone (fake tensors, no weights, no GPU):
peak memory with its breakdown, FLOPs and bytes moved per op class, and the largest batch that fits a GPU.

Public API (torch is imported only when a simulation actually runs; cached answers load without it):
- `simulate_step(job, *, num_layers_to_trace=None, stack="tunecost") -> StepSimulation`
- `max_batch_size(job, gpu_memory_bytes, *, stack=...) -> MaxBatchResult`
- `simulated_max_batch_size(job, gpu) -> int`
- `StepCounts`, `DeviceOverhead`
"""

from tunecost.simulate.batch import MaxBatchResult, max_batch_size, simulated_max_batch_size
from tunecost.simulate.overhead import DEFAULT_OVERHEAD, DeviceOverhead
from tunecost.simulate.records import StepCounts
from tunecost.simulate.simulator import StepSimulation, simulate_step

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
