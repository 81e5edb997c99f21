"""Units: the one place where bytes become GB or GiB and back.

Inside tunecost every size is in bytes (`*_bytes`). A size a person types or reads is in GB (10^9 bytes, the
unit of GPU datasheets and of the paper's eq. (1)) or GiB (2^30 bytes, what CUDA and `nvidia-smi` report); the
identifier says which (`gpu_memory_gb`, `memory_gib`) and so does every printed size.
"""

from __future__ import annotations

import math

from tunecost.errors import TunecostError
from tunecost.limits import MAX_GPU_MEMORY_BYTES

BYTES_PER_GB = 10**9
BYTES_PER_GIB = 2**30


def bytes_from_gb(gb: float) -> int:
    """`gb` GB (10^9 bytes) in bytes."""
    return round(gb * BYTES_PER_GB)


def bytes_from_gib(gib: float) -> int:
    """`gib` GiB (2^30 bytes) in bytes."""
    return round(gib * BYTES_PER_GIB)


def gb_from_bytes(num_bytes: float) -> float:
    return num_bytes / BYTES_PER_GB


def gib_from_bytes(num_bytes: float) -> float:
    return num_bytes / BYTES_PER_GIB


def format_bytes(num_bytes: float, digits: int = 2) -> str:
    """A size for people, in both units: "51.54 GB (48.00 GiB)"; below 0.1 GB in MB (10^6) and MiB (2^20 bytes)."""
    if abs(num_bytes) < 0.1 * BYTES_PER_GB:
        return f"{num_bytes / 10**6:,.{digits}f} MB ({num_bytes / 2**20:,.{digits}f} MiB)"
    return f"{gb_from_bytes(num_bytes):,.{digits}f} GB ({gib_from_bytes(num_bytes):,.{digits}f} GiB)"


def memory_bytes_from_options(*, gpu_memory_gb: float | None, gpu_memory_gib: float | None) -> int | None:
    """The memory a user gave as `--gpu-memory-gb` (10^9 bytes) or `--gpu-memory-gib` (2^30 bytes), in bytes;
    None when neither was given."""
    for option, value in (("--gpu-memory-gb", gpu_memory_gb), ("--gpu-memory-gib", gpu_memory_gib)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise TunecostError(f"{option} must be a positive number, got {value}")
    if gpu_memory_gb is not None and gpu_memory_gib is not None:
        raise TunecostError("give --gpu-memory-gb or --gpu-memory-gib, not both")
    if gpu_memory_gb is None and gpu_memory_gib is None:
        return None
    if gpu_memory_gb is not None:
        option, value, unit_bytes = "--gpu-memory-gb", gpu_memory_gb, BYTES_PER_GB
    else:
        option, value, unit_bytes = "--gpu-memory-gib", gpu_memory_gib or 0.0, BYTES_PER_GIB
    if value * unit_bytes > MAX_GPU_MEMORY_BYTES:
        raise TunecostError(
            f"{option} is larger than any GPU holds (at most {gb_from_bytes(MAX_GPU_MEMORY_BYTES):g} GB), got {value:g}"
        )
    return round(value * unit_bytes)
