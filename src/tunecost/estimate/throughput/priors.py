"""Weak priors on the shared stack parameters of the throughput model (`calibrate.py`), each with its reason.

Efficiencies are relative to what the GPU achieves in microbenchmarks (`GpuTerms`: the catalog's maximum
achievable matmul rate and bandwidth, or a measured profile), not to its datasheet.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Prior:
    centre: float
    factor: float  # one standard deviation is x/÷ this factor
    lower: float
    upper: float
    reason: str


PRIORS: dict[str, Prior] = {
    "gemm_efficiency": Prior(
        centre=0.7,
        factor=1.5,
        lower=0.02,
        upper=1.0,
        reason="cuBLAS bf16 GEMMs reach 60-80 % of the dense datasheet peak",
    ),
    "gemm_half_rows": Prior(
        centre=64,
        factor=3.0,
        lower=1.0,
        upper=1e5,
        reason="GEMMs with K, N in the thousands reach half their rate at some tens of rows",
    ),
    "memory_efficiency": Prior(
        centre=0.75, factor=1.3, lower=0.05, upper=1.0, reason="streaming kernels reach 70-90 % of datasheet bandwidth"
    ),
    "kernel_overhead_s": Prior(
        centre=20e-6,
        factor=3.0,
        lower=1e-7,
        upper=1e-3,
        reason="eager PyTorch: dispatch + autograd + launch, about 10-50 us per op",
    ),
    "step_overhead_s": Prior(
        centre=0.05, factor=10.0, lower=1e-4, upper=10.0, reason="trainer bookkeeping per step (weak)"
    ),
    "run_overhead_s": Prior(
        centre=10.0,
        factor=10.0,
        lower=1e-2,
        upper=600.0,
        reason="start-up and warm-up inside the measured train_runtime (weak)",
    ),
}
