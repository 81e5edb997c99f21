"""The one conversion point between bytes and GB (10^9) or GiB (2^30)."""

from __future__ import annotations

import pytest

from tunecost.errors import TunecostError
from tunecost.units import (
    bytes_from_gb,
    bytes_from_gib,
    format_bytes,
    gb_from_bytes,
    gib_from_bytes,
    memory_bytes_from_options,
)


def test_conversions() -> None:
    assert bytes_from_gb(48) == 48_000_000_000
    assert bytes_from_gib(48) == 48 * 1024**3 == 51_539_607_552
    assert gb_from_bytes(bytes_from_gib(48)) == pytest.approx(51.539607552)
    assert gib_from_bytes(bytes_from_gb(40)) == pytest.approx(40e9 / 2**30)


def test_format_says_both_units() -> None:
    assert format_bytes(48 * 2**30) == "51.54 GB (48.00 GiB)"
    assert format_bytes(3 * 2**20) == "3.15 MB (3.00 MiB)"


def test_memory_options() -> None:
    assert memory_bytes_from_options(gpu_memory_gb=None, gpu_memory_gib=None) is None
    assert memory_bytes_from_options(gpu_memory_gb=2, gpu_memory_gib=None) == 2 * 10**9
    assert memory_bytes_from_options(gpu_memory_gb=None, gpu_memory_gib=2) == 2 * 2**30
    with pytest.raises(TunecostError, match="not both"):
        memory_bytes_from_options(gpu_memory_gb=2, gpu_memory_gib=2)
    with pytest.raises(TunecostError, match="--gpu-memory-gib must be a positive number"):
        memory_bytes_from_options(gpu_memory_gb=None, gpu_memory_gib=-1)
