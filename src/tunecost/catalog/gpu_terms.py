"""What one GPU achieves, as the throughput model uses it: from the catalog's datasheet and published values, or
measured on the device by `tunecost calibrate-gpu` (a GPU profile). Base units: FLOP/s, bytes/s, seconds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class GpuTerms:
    name: str  # catalog name, or the device name a profile was measured on
    matmul_flops_per_s: float  # achieved dense bf16 GEMM throughput at large shapes
    fp8_matmul_flops_per_s: float | None = None  # achieved dense FP8 GEMM throughput; None: no FP8 tensor cores
    matmul_half_rows: float | None = None  # GEMM rows (M) at which a small-M GEMM reaches half of it
    fp32_flops_per_s: float  # achieved fp32 (non-tensor-core) throughput
    memory_bytes_per_s: float  # achieved element-wise (streaming) bandwidth
    dequant_bytes_per_s: float | None = None  # achieved 4-bit de-quantization, bytes of bf16 written per second
    kernel_launch_s: float | None = None  # host time per kernel launch in an eager PyTorch loop
    host_step_s: float | None = None  # host time of an empty training step (no kernels)
    source: str  # where these values come from ("catalog: ...", "profile: FILE measured DATE on DEVICE")
    host_speed: float = 1.0  # the host CPU's single-thread speed relative to the reference host (catalog.host_cpus)
    host_cpu: str = ""  # the host CPU's catalog name
    host: str = ""  # which host that is and how it was chosen, for notes
    host_named: bool = False  # the user named the host (else a reference system's CPU or the reference host)

    @property
    def host_measured(self) -> bool:
        """A profile measured this machine's launch and empty-step host times: no catalog host is used."""
        return self.kernel_launch_s is not None and self.host_step_s is not None
