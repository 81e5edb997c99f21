"""Microbenchmarks of `tunecost calibrate-gpu`: timing helpers, the small-M fit, a CPU run end to end."""

from __future__ import annotations

import math
import time

import pytest

from tunecost.catalog.gpu_terms import GpuTerms
from tunecost.errors import TunecostError
from tunecost.profile.gpu_bench import (
    BenchPlan,
    GemmTiming,
    fit_half_rows,
    gemm_flops,
    host_time_per_call,
    run_gpu_bench,
    time_call,
)

# The plan of `tunecost calibrate-gpu --quick` on a CPU: every term in about 2 seconds.
QUICK_CPU = BenchPlan.for_device("cpu", quick=True)


def test_gemm_flops_is_two_per_multiply_add():
    assert gemm_flops(1, 4096, 14336) == 2 * 4096 * 14336  # one multiply + one add per (output, k)
    assert gemm_flops(3, 2, 5) == 60


def test_fit_half_rows_recovers_the_model_it_fits():
    peak, half, k, n = 1e14, 128.0, 4096, 14336
    # time(M) = 2KN(M + M_half)/P: the model's own timings, so the fit must return M_half exactly
    gemms = [
        GemmTiming(rows=m, k=k, n=n, seconds=2 * k * n * (m + half) / peak, flops_per_s=0.0) for m in (1, 16, 256, 4096)
    ]
    assert fit_half_rows(gemms, peak) == pytest.approx(half, rel=1e-9)
    # at M = M_half the modelled throughput is half the peak
    at_half = gemm_flops(int(half), k, n) / (2 * k * n * (half + half) / peak)
    assert at_half == pytest.approx(peak / 2)


def test_fit_half_rows_none_without_a_small_m_penalty():
    peak, k, n = 1e12, 64, 64
    faster = [GemmTiming(rows=m, k=k, n=n, seconds=2 * k * n * m / (2 * peak), flops_per_s=0.0) for m in (1, 8, 64)]
    assert fit_half_rows(faster, peak) is None  # every GEMM beats the peak: nothing to fit
    assert fit_half_rows([], peak) is None


def test_time_call_median_per_call_on_cpu():
    seconds = time_call(lambda: time.sleep(0.01), "cpu", repeats=3, warmup=0, calls=2)
    assert 0.009 <= seconds < 0.05


def test_host_time_per_call_on_cpu():
    seconds = host_time_per_call(lambda: time.sleep(0.002), "cpu", count=5, repeats=3, warmup=0)
    assert 0.0018 <= seconds < 0.02


def test_cpu_run_measures_every_term():
    labels = []
    result = run_gpu_bench("cpu", plan=QUICK_CPU, on_progress=labels.append)
    assert result.device == "cpu" and result.dtype == "float32" and result.device_name
    assert labels and labels[0].startswith("square GEMM")
    for field in ("matmul_flops_per_s", "fp32_flops_per_s", "memory_bytes_per_s", "kernel_launch_s", "host_step_s"):
        value = result.values[field].value
        assert value is not None and math.isfinite(value) and value > 0, field
        assert result.values[field].method
    assert [g.rows for g in result.gemms] == list(QUICK_CPU.rows)
    for g in result.gemms:
        assert g.flops_per_s == pytest.approx(gemm_flops(g.rows, g.k, g.n) / g.seconds)
    terms = result.terms(source="profile: test")
    assert isinstance(terms, GpuTerms) and terms.source == "profile: test"
    assert terms.matmul_flops_per_s == result.values["matmul_flops_per_s"].value
    # bitsandbytes 0.50 de-quantizes NF4 on CPU too
    assert terms.dequant_bytes_per_s is not None and terms.dequant_bytes_per_s > 0


def test_cuda_requested_without_cuda_is_an_error(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(TunecostError, match="no CUDA device"):
        run_gpu_bench("cuda", plan=QUICK_CPU)
    with pytest.raises(TunecostError, match="unknown device"):
        run_gpu_bench("tpu", plan=QUICK_CPU)


def test_quick_plans_are_smaller():
    for device in ("cpu", "cuda"):
        full, quick = BenchPlan.for_device(device), BenchPlan.for_device(device, quick=True)
        assert quick.square <= full.square and quick.repeats <= full.repeats and len(quick.rows) <= len(full.rows)
    cuda = BenchPlan.for_device("cuda")
    assert (cuda.expert_k, cuda.expert_n) == (4096, 14336)  # Mixtral-8x7B hidden / expert intermediate size


@pytest.mark.gpu
def test_cuda_quick_run_sees_tensor_cores_and_a_small_m_penalty():
    result = run_gpu_bench("cuda", quick=True)
    terms = result.terms(source="test")
    assert result.dtype == "bfloat16"
    assert terms.matmul_flops_per_s > 2 * terms.fp32_flops_per_s  # bf16 tensor cores vs fp32 CUDA cores
    assert terms.matmul_half_rows is not None and terms.matmul_half_rows > 1
    small = min(result.gemms, key=lambda g: g.rows)
    assert small.flops_per_s < 0.5 * terms.matmul_flops_per_s  # M = 1 is memory-bound
    assert terms.dequant_bytes_per_s is not None and terms.kernel_launch_s is not None
    assert 1e-7 < terms.kernel_launch_s < 1e-3
