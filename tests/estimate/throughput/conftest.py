"""Shared fixtures of the throughput-model tests."""

from __future__ import annotations

import dataclasses

import pytest

from tunecost.catalog.gpu_terms import GpuTerms


@pytest.fixture
def gpu_terms():
    """`gpu_terms(**changes)`: the terms of a made-up GPU (100 TFLOP/s matmul, 20 TFLOP/s fp32, 1 TB/s memory, no
    measured launch, host or de-quantization times), with `changes`."""
    base = GpuTerms(
        name="test-gpu", matmul_flops_per_s=100e12, fp32_flops_per_s=20e12, memory_bytes_per_s=1e12, source="test"
    )

    def terms(**changes) -> GpuTerms:
        return dataclasses.replace(base, **changes)

    return terms
