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


# name: (centre, factor, lower, upper, reason)
_PRIOR_ROWS: dict[str, tuple[float, float, float, float, str]] = {
    "gemm_efficiency": (0.7, 1.5, 0.02, 1.0, "cuBLAS bf16 GEMMs reach 60-80 % of the dense datasheet peak"),
    "gemm_half_rows": (
        64,
        3.0,
        1.0,
        1e5,
        "GEMMs with K, N in the thousands reach half their rate at some tens of rows",
    ),
    "memory_efficiency": (0.75, 1.3, 0.05, 1.0, "streaming kernels reach 70-90 % of datasheet bandwidth"),
    "kernel_overhead_s": (20e-6, 3.0, 1e-7, 1e-3, "eager PyTorch: dispatch + autograd + launch, about 10-50 us per op"),
    "step_overhead_s": (0.05, 10.0, 1e-4, 10.0, "trainer bookkeeping per step (weak)"),
    "run_overhead_s": (10.0, 10.0, 1e-2, 600.0, "start-up and warm-up inside the measured train_runtime (weak)"),
}
PRIORS: dict[str, Prior] = {
    name: Prior(centre=centre, factor=factor, lower=lower, upper=upper, reason=reason)
    for name, (centre, factor, lower, upper, reason) in _PRIOR_ROWS.items()
}
