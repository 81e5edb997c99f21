"""Device memory outside PyTorch's caching allocator: the CUDA context.

The simulator counts what `torch.cuda.max_memory_allocated` counts (tensor storages, rounded up to the caching
allocator's 512-byte granule), and replays the caching allocator over the step (`allocator`) for what
`torch.cuda.max_memory_reserved` counts: the 2 MiB and 20 MiB+ segments the blocks are cut from. What nvidia-smi
shows is that reserve plus memory the allocator never sees: the CUDA context (driver state, kernel images of
torch/cuBLAS/cuDNN, cuBLAS workspaces), about 0.3-0.6 GiB with CUDA 11.8-12.x lazy module loading on
Ampere/Hopper cards. That figure is an assumption (stated in every result), not a measurement;
`benchmarks/gpu_memory_check.py` measures the real figures on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunecost.units import BYTES_PER_GIB as GIB


@dataclass(frozen=True, kw_only=True)
class DeviceOverhead:
    """Memory outside the caching allocator: a fixed CUDA context."""

    cuda_context_bytes: int = int(0.5 * GIB)

    def overhead_bytes(self) -> int:
        return self.cuda_context_bytes

    def describe(self) -> str:
        return (
            f"device overhead outside PyTorch's caching allocator = CUDA context "
            f"{self.cuda_context_bytes / GIB:.2f} GiB (assumed, not measured)"
        )


DEFAULT_OVERHEAD = DeviceOverhead()
