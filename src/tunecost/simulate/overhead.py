"""Device memory the simulated tensors do not show: the CUDA context and the caching allocator's slack.

The simulator counts what `torch.cuda.max_memory_allocated` counts (tensor storages, rounded up to the caching
allocator's 512-byte granule). A real process also needs
- the CUDA context (driver state, kernel images of torch/cuBLAS/cuDNN, cuBLAS workspaces), outside PyTorch's
  allocator: about 0.3-0.6 GiB with CUDA 11.8-12.x lazy module loading on Ampere/Hopper cards;
- the caching allocator's reserve above what is allocated: memory blocks are cached in 2 MiB (small) and 20 MiB+
  (large) segments and split, so reserved memory runs above the allocated peak, most of all for the short-lived
  buffers of a training step.
Both figures are assumptions (stated in every result), not measurements; `benchmarks/gpu_memory_check.py`
measures the real gap on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunecost.units import BYTES_PER_GIB as GIB


@dataclass(frozen=True, kw_only=True)
class DeviceOverhead:
    """Memory outside the simulated tensors: a fixed context plus a fraction of the step's transient peak."""

    cuda_context_bytes: int = int(0.5 * GIB)
    allocator_fraction: float = 0.05  # reserve above the allocated peak, as a share of the non-static peak

    def overhead_bytes(self, peak_bytes: int, static_bytes: int) -> int:
        transient = max(0, peak_bytes - static_bytes)
        return int(self.cuda_context_bytes + self.allocator_fraction * transient)

    def describe(self) -> str:
        return (
            f"device overhead = CUDA context {self.cuda_context_bytes / GIB:.2f} GiB + caching-allocator reserve "
            f"{self.allocator_fraction:.0%} of the non-static peak (assumed, not measured)"
        )


DEFAULT_OVERHEAD = DeviceOverhead()
