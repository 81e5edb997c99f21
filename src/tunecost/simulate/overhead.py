"""Device memory outside PyTorch's caching allocator: the CUDA context.

Sources and derivations: docs/memory-model.md, section `tunecost.simulate.overhead`.
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
