"""Step time from step counts and a GPU's datasheet: a roofline per op class plus launch and host overheads.

    step_s = sum over op classes c of smoothmax(FLOPs_c / (eff_gemm(rows_c) * peak_c), bytes_c / (eff_mem * BW))
             + kernel_overhead_s * kernels + step_overhead_s
    eff_gemm(rows) = gemm_efficiency * rows / (rows + gemm_half_rows)
    queries_per_s = batch_size / step_s

peak_c is the GPU's dense bf16 tensor peak for GEMMs and attention, its fp32 peak for the rest (the fp32 LoRA
adapters, dequantization, element-wise work, the optimizer). The five `StackParams` describe the software stack
(PyTorch eager, bitsandbytes, the trainer, the host CPU that launches kernels), not a GPU: one set is
calibrated on measurements and applied to every GPU in the catalog. The launch and host terms add to the GPU time
rather than overlap it because the paper's stack synchronises many times per layer (the eager expert loop's
`torch.where` reads token counts back to the host; the profiler's timers synchronise per layer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType

from tunecost.catalog.gpus import GPU
from tunecost.errors import TunecostError
from tunecost.estimate.throughput.counts import OP_CLASSES, TENSOR_CORE, StepCounts

SMOOTH_MAX_POWER = 4.0  # (a^p + b^p)^(1/p): a roofline with a soft corner (p -> inf is the hard max)


@dataclass(frozen=True, kw_only=True)
class StackParams:
    """Efficiencies of one software stack, shared by every GPU and model it runs."""

    gemm_efficiency: float  # achieved fraction of peak FLOP/s for large GEMMs (and attention)
    gemm_half_rows: float  # GEMM rows (tokens per call) at which half of that is reached
    memory_efficiency: float  # achieved fraction of peak DRAM bandwidth by streaming kernels
    kernel_overhead_s: float  # host time per kernel launch (Python, dispatcher, autograd, launch)
    step_overhead_s: float  # host time per step outside the kernels (trainer loop, data, logging)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not value >= 0:
                raise TunecostError(f"stack parameter {f.name} must be >= 0, got {value}")
        if not 0 < self.gemm_efficiency <= 1 or not 0 < self.memory_efficiency <= 1:
            raise TunecostError("efficiencies must be in (0, 1]")

    def as_dict(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in fields(self)}


PARAM_NAMES: tuple[str, ...] = tuple(f.name for f in fields(StackParams))


@dataclass(frozen=True, kw_only=True)
class StepTime:
    """A predicted step, split so that the doc and the CLI can say where the time goes."""

    step_s: float
    class_s: Mapping[str, float]  # roofline time per op class
    bound_by_class: Mapping[str, str]  # "compute" or "memory": the larger side of each class's roofline
    kernel_overhead_s: float
    step_overhead_s: float
    batch_size: int

    @property
    def queries_per_s(self) -> float:
        return self.batch_size / self.step_s

    @property
    def gpu_s(self) -> float:
        return sum(self.class_s.values())


def gemm_efficiency_at(rows: float, params: StackParams) -> float:
    """Achieved fraction of peak for a GEMM with `rows` rows: saturates with problem size."""
    return params.gemm_efficiency * rows / (rows + params.gemm_half_rows) if rows > 0 else params.gemm_efficiency


def smooth_max(a: float, b: float, power: float = SMOOTH_MAX_POWER) -> float:
    if a <= 0 or b <= 0:
        return max(a, b)
    hi = max(a, b)
    return hi * ((a / hi) ** power + (b / hi) ** power) ** (1.0 / power)


def peak_flops_per_s(gpu: GPU, peak: str) -> float:
    return gpu.bf16_tensor_flops_per_s if peak == TENSOR_CORE else gpu.fp32_flops_per_s


def step_time(counts: StepCounts, gpu: GPU, params: StackParams) -> StepTime:
    """Predicted time of one step of `counts` on `gpu` under `params`."""
    if gpu.mem_bandwidth_bytes_per_s <= 0 or gpu.bf16_tensor_flops_per_s <= 0:
        raise TunecostError(f"{gpu.name}: the catalog needs its bandwidth and bf16 peak for a throughput model")
    class_s: dict[str, float] = {}
    bound: dict[str, str] = {}
    bandwidth = params.memory_efficiency * gpu.mem_bandwidth_bytes_per_s
    for cls in OP_CLASSES:
        flops = counts.flops_by_class.get(cls, 0.0)
        moved = counts.bytes_by_class.get(cls, 0.0)
        if flops <= 0 and moved <= 0:
            continue
        eff = gemm_efficiency_at(counts.gemm_rows_by_class.get(cls, 0.0), params)
        compute_s = flops / (eff * peak_flops_per_s(gpu, counts.peak_by_class.get(cls, TENSOR_CORE)))
        memory_s = moved / bandwidth
        class_s[cls] = smooth_max(compute_s, memory_s)
        bound[cls] = "compute" if compute_s >= memory_s else "memory"
    launch_s = params.kernel_overhead_s * counts.total_kernels
    total = sum(class_s.values()) + launch_s + params.step_overhead_s
    return StepTime(
        step_s=total,
        class_s=MappingProxyType(class_s),
        bound_by_class=MappingProxyType(bound),
        kernel_overhead_s=launch_s,
        step_overhead_s=params.step_overhead_s,
        batch_size=counts.batch_size,
    )


def queries_per_s(counts: StepCounts, gpu: GPU, params: StackParams) -> float:
    return step_time(counts, gpu, params).queries_per_s
