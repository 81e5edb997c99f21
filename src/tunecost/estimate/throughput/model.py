"""Step time from step counts and what a GPU achieves: a roofline per op class plus launch and host overheads.

Sources and derivations: docs/throughput-model.md, section `tunecost.estimate.throughput.model`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType

from tunecost.catalog.gpu_achieved import achieved_catalog
from tunecost.catalog.gpu_terms import GpuTerms
from tunecost.catalog.gpus import GPU, no_fp8_error
from tunecost.catalog.host_cpus import gpu_host
from tunecost.errors import TunecostError
from tunecost.estimate.throughput.counts import (
    FP8_TENSOR_CORE,
    SYNC_PER_MICRO_STEP,
    SYNC_PER_MOE_LAYER,
    SYNC_PER_QUANT_LINEAR,
    TENSOR_CORE,
    AnalyticStepCounts,
)
from tunecost.estimate.throughput.quant_counts import NF4_BYTES_PER_PARAM
from tunecost.workload.op_classes import OP_CLASSES

BF16_WRITTEN_FRACTION = 2.0 / (2.0 + NF4_BYTES_PER_PARAM)  # of a dequant's bytes (4-bit read, bf16 written)
SMOOTH_MAX_POWER = 4.0  # (a^p + b^p)^(1/p): a roofline with a soft corner (p -> inf is the hard max)


@dataclass(frozen=True, kw_only=True)
class StackParams:
    """Efficiencies of one software stack, shared by every GPU and model it runs."""

    gemm_efficiency: float  # this stack's large GEMMs (and attention) as a fraction of the GPU's achieved rate
    gemm_half_rows: float  # GEMM rows (tokens per call) at which half of that is reached
    memory_efficiency: float  # this stack's memory-bound kernels as a fraction of the achieved bandwidth
    kernel_overhead_s: float  # host time per kernel launch (Python, dispatcher, autograd, launch), reference host
    step_overhead_s: float  # host time per step outside the kernels (trainer loop, data, logging), reference host

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
    host_sync: str = SYNC_PER_MOE_LAYER  # where the host waits for the GPU: launches add to or hide under GPU time
    queries_per_row: float = 1.0  # queries a row of the batch holds (packing: several)

    @property
    def queries_per_s(self) -> float:
        return self.batch_size * self.queries_per_row / self.step_s

    @property
    def gpu_s(self) -> float:
        return sum(self.class_s.values())

    @property
    def optimizer_fraction(self) -> float:
        """The optimizer step's share of the step (what sharding its states divides)."""
        return self.class_s.get("optimizer", 0.0) / self.step_s if self.step_s else 0.0

    @property
    def exposed_host_s(self) -> float:
        """Time the step spends beyond its GPU work: launch and host time not hidden under GPU work."""
        return self.step_s - self.gpu_s


def gemm_efficiency_at(rows: float, params: StackParams, half_rows: float | None = None) -> float:
    """Fraction of the achieved rate for a GEMM with `rows` rows: saturates with problem size. `half_rows` (from
    a GPU profile) replaces the calibrated `params.gemm_half_rows`."""
    half = params.gemm_half_rows if half_rows is None else half_rows
    return params.gemm_efficiency * rows / (rows + half) if rows > 0 else params.gemm_efficiency


def smooth_max(a: float, b: float, power: float = SMOOTH_MAX_POWER) -> float:
    if a <= 0 or b <= 0:
        return max(a, b)
    hi = max(a, b)
    return hi * ((a / hi) ** power + (b / hi) ** power) ** (1.0 / power)


def catalog_gpu_terms(gpu: GPU, host_cpu: str | None = None) -> GpuTerms:
    """What a catalog GPU achieves: its achieved matmul rate and bandwidth from `catalog/data/gpu_achieved.csv`,
    its fp32 rate from the datasheet, and the speed of the host that launches its kernels (`host_cpu` when named,
    else its reference system's CPU, else the reference host: `catalog.host_cpus.gpu_host`). A GPU with neither
    achieved values nor datasheet peaks is an error."""
    achieved = achieved_catalog().get(gpu.name)
    if achieved is None:
        raise TunecostError(
            f"{gpu.name}: no achieved matmul/bandwidth values in the GPU catalog (gpu_achieved.csv); measure it "
            "with `tunecost calibrate-gpu` and pass --gpu-profile"
        )
    if gpu.fp32_flops_per_s <= 0:
        raise TunecostError(f"{gpu.name}: the catalog needs its fp32 peak for a throughput model")
    return GpuTerms(
        name=gpu.name,
        matmul_flops_per_s=achieved.matmul_flops_per_s,
        fp8_matmul_flops_per_s=achieved_fp8_flops_per_s(
            gpu, achieved.matmul_flops_per_s, achieved.fp8_matmul_flops_per_s
        ),
        fp32_flops_per_s=gpu.fp32_flops_per_s,
        memory_bytes_per_s=achieved.memory_bytes_per_s,
        source=f"catalog: matmul {achieved.sources.get('matmul', '?')}; memory {achieved.sources.get('memory', '?')}"
        f" (as of {achieved.as_of})",
        **host_fields(gpu.name, host_cpu),
    )


# FP8 MAMF efficiency over bf16 MAMF efficiency on the one GPU with both measured in one run (ml-engineering MAMF
# tables v2, H100 SXM: FP8 1402.6 of 1979, bf16 794.5 of 989): an FP8 GEMM reaches a smaller share of its peak.
FP8_OVER_BF16_EFFICIENCY = (1402.6 / 1979.0) / (794.5 / 989.0)


def achieved_fp8_flops_per_s(gpu: GPU, achieved_bf16_flops_per_s: float, measured: float | None) -> float | None:
    """A catalog GPU's achieved FP8 GEMM rate: the measured FP8 MAMF where published, else its FP8 peak at its bf16
    efficiency (achieved / peak) times FP8_OVER_BF16_EFFICIENCY; None without FP8 tensor cores."""
    if gpu.fp8_tensor_flops_per_s is None:
        return None
    if measured is not None:
        return measured
    bf16_efficiency = achieved_bf16_flops_per_s / gpu.bf16_tensor_flops_per_s
    return gpu.fp8_tensor_flops_per_s * bf16_efficiency * FP8_OVER_BF16_EFFICIENCY


def host_fields(gpu_name: str, host_cpu: str | None) -> dict:
    """`GpuTerms` fields for the host of `gpu_name` (`catalog.host_cpus.gpu_host`)."""
    host = gpu_host(gpu_name, host_cpu)
    return {
        "host_speed": host.cpu.speed,
        "host_cpu": host.cpu.name,
        "host": f"{host.origin}; single-thread speed {host.cpu.speed:.2f}x the reference host's",
        "host_named": bool(host_cpu),
    }


def rate_flops_per_s(terms: GpuTerms, peak: str) -> float:
    if peak == FP8_TENSOR_CORE:
        if terms.fp8_matmul_flops_per_s is None:
            raise no_fp8_error([terms.name])
        return terms.fp8_matmul_flops_per_s
    return terms.matmul_flops_per_s if peak == TENSOR_CORE else terms.fp32_flops_per_s


def step_time(counts: AnalyticStepCounts, terms: GpuTerms, params: StackParams) -> StepTime:
    """Predicted time of one step of `counts` on the GPU `terms` describes, under `params`."""
    if terms.memory_bytes_per_s <= 0 or terms.matmul_flops_per_s <= 0 or terms.fp32_flops_per_s <= 0:
        raise TunecostError(f"{terms.name}: the throughput model needs matmul, fp32 and bandwidth rates > 0")
    class_s: dict[str, float] = {}
    bound: dict[str, str] = {}
    bandwidth = params.memory_efficiency * terms.memory_bytes_per_s
    for cls in OP_CLASSES:
        flops = counts.flops_by_class.get(cls, 0.0)
        moved = counts.bytes_by_class.get(cls, 0.0)
        if flops <= 0 and moved <= 0:
            continue
        eff = gemm_efficiency_at(counts.gemm_rows_by_class.get(cls, 0.0), params, terms.matmul_half_rows)
        compute_s = flops / (eff * rate_flops_per_s(terms, counts.peak_by_class.get(cls, TENSOR_CORE)))
        if cls == "dequant" and terms.dequant_bytes_per_s:  # measured: bf16 bytes written per second
            memory_s = moved * BF16_WRITTEN_FRACTION / terms.dequant_bytes_per_s
        else:
            memory_s = moved / bandwidth
        class_s[cls] = smooth_max(compute_s, memory_s)
        bound[cls] = "compute" if compute_s >= memory_s else "memory"
    # host times: measured on the machine (a GPU profile), else the stack's (on the reference host) / host speed
    launch_each = (
        params.kernel_overhead_s / terms.host_speed if terms.kernel_launch_s is None else terms.kernel_launch_s
    )
    host_s = params.step_overhead_s / terms.host_speed if terms.host_step_s is None else terms.host_step_s
    launch_s = launch_each * counts.total_kernels
    gpu_s = sum(class_s.values())
    if counts.host_sync in (SYNC_PER_MOE_LAYER, SYNC_PER_QUANT_LINEAR):
        total = gpu_s + launch_s + host_s
    elif counts.host_sync == SYNC_PER_MICRO_STEP:
        opt_gpu_s = class_s.get("optimizer", 0.0)
        opt_launch_s = launch_each * counts.kernels_by_class.get("optimizer", 0.0)
        total = overlapped_s(gpu_s - opt_gpu_s, launch_s - opt_launch_s) + overlapped_s(opt_gpu_s, opt_launch_s)
        total += host_s
    else:
        raise TunecostError(f"unknown host synchronisation {counts.host_sync!r}")
    return StepTime(
        step_s=total,
        class_s=MappingProxyType(class_s),
        bound_by_class=MappingProxyType(bound),
        kernel_overhead_s=launch_s,
        step_overhead_s=host_s,
        batch_size=counts.batch_size,
        host_sync=counts.host_sync,
        queries_per_row=counts.lengths.queries_per_row,
    )


def overlapped_s(gpu_s: float, host_s: float) -> float:
    """Time between two synchronisation points when the host launches while the GPU works: the larger of the two
    with the roofline's soft corner (host-bound: the host's time; GPU-bound: the GPU's; equal: 2^(1/4) x)."""
    return smooth_max(gpu_s, host_s)


def queries_per_s(counts: AnalyticStepCounts, terms: GpuTerms, params: StackParams) -> float:
    return step_time(counts, terms, params).queries_per_s
