"""The roofline step-time model (tunecost.estimate.throughput.model) on hand-made counts and known parameters."""

from __future__ import annotations

import itertools

import pytest

from tunecost.catalog.gpus import get_gpu
from tunecost.errors import TunecostError
from tunecost.estimate.throughput.counts import analytic_step_counts
from tunecost.estimate.throughput.lengths import dataset_lengths
from tunecost.estimate.throughput.model import (
    SMOOTH_MAX_POWER,
    StackParams,
    catalog_gpu_terms,
    gemm_efficiency_at,
    smooth_max,
    step_time,
)
from tunecost.models.catalog import resolve_model
from tunecost.workload.job import FineTuneJob

PARAMS = StackParams(
    gemm_efficiency=0.6, gemm_half_rows=64, memory_efficiency=0.8, kernel_overhead_s=20e-6, step_overhead_s=0.05
)


def _counts(batch: int, k: int = 2, dataset: str = "commonsense_15k"):
    job = FineTuneJob(model="mixtral-8x7b", experts_per_token=k, batch_size=batch, seq_len=1024)
    return analytic_step_counts(resolve_model("mixtral-8x7b"), job, dataset_lengths(dataset, batch))


def test_smooth_max_is_a_soft_roofline() -> None:
    assert smooth_max(3.0, 0.0) == 3.0
    assert smooth_max(1.0, 1.0) == pytest.approx(2 ** (1 / SMOOTH_MAX_POWER))
    assert 10.0 <= smooth_max(10.0, 1.0) < 10.001


def test_gemm_efficiency_saturates_with_rows() -> None:
    assert gemm_efficiency_at(64, PARAMS) == pytest.approx(0.3)  # half of the maximum at gemm_half_rows
    assert gemm_efficiency_at(1e6, PARAMS) == pytest.approx(0.6, rel=1e-3)


def test_step_time_adds_launch_and_host_overheads() -> None:
    counts = _counts(1)
    st = step_time(counts, catalog_gpu_terms(get_gpu("A40")), PARAMS)
    assert st.kernel_overhead_s == pytest.approx(20e-6 * counts.total_kernels)
    assert st.step_s == pytest.approx(st.gpu_s + st.kernel_overhead_s + 0.05)
    assert st.queries_per_s == pytest.approx(1 / st.step_s)


def test_expert_matmuls_go_from_memory_to_compute_bound_with_batch() -> None:
    """Takeaway 5: memory-bound at small batch, compute-bound at large batch."""
    gpu = catalog_gpu_terms(get_gpu("A40"))
    assert step_time(_counts(1), gpu, PARAMS).bound_by_class["expert_matmul"] == "memory"
    assert step_time(_counts(16), gpu, PARAMS).bound_by_class["expert_matmul"] == "compute"
    assert step_time(_counts(1), gpu, PARAMS).bound_by_class["dequant"] == "memory"


def test_throughput_saturates_and_sparse_beats_dense() -> None:
    gpu = catalog_gpu_terms(get_gpu("A40"))
    qps = [step_time(_counts(b), gpu, PARAMS).queries_per_s for b in (1, 2, 4, 8, 16)]
    assert qps == sorted(qps)
    gains = [b / a for a, b in itertools.pairwise(qps)]
    assert gains == sorted(gains, reverse=True)  # diminishing returns of doubling the batch
    for b in (1, 2, 4):
        sparse, dense = (step_time(_counts(b, k=k), gpu, PARAMS).queries_per_s for k in (2, 8))
        assert sparse > dense


def test_faster_gpu_is_faster_but_less_than_its_datasheet_ratio() -> None:
    a40, h100 = catalog_gpu_terms(get_gpu("A40")), catalog_gpu_terms(get_gpu("H100"))
    ratio = step_time(_counts(4), h100, PARAMS).queries_per_s / step_time(_counts(4), a40, PARAMS).queries_per_s
    assert 1.0 < ratio < h100.matmul_flops_per_s / a40.matmul_flops_per_s


def test_stack_params_validate() -> None:
    with pytest.raises(TunecostError, match="efficiencies"):
        StackParams(
            gemm_efficiency=1.5, gemm_half_rows=1, memory_efficiency=0.5, kernel_overhead_s=0, step_overhead_s=0
        )
    with pytest.raises(TunecostError, match="kernel_overhead_s"):
        StackParams(
            gemm_efficiency=0.5, gemm_half_rows=1, memory_efficiency=0.5, kernel_overhead_s=-1, step_overhead_s=0
        )


def test_catalog_terms_use_achieved_rates_not_the_datasheet() -> None:
    h100 = catalog_gpu_terms(get_gpu("H100"))
    assert h100.matmul_flops_per_s == pytest.approx(792.1e12)  # MAMF, ml-engineering table
    assert h100.matmul_flops_per_s < get_gpu("H100").bf16_tensor_flops_per_s
    assert "MAMF" in h100.source


def test_catalog_gpu_without_achieved_values_is_a_clear_error(monkeypatch) -> None:
    import tunecost.estimate.throughput.model as throughput_model

    monkeypatch.setattr(throughput_model, "achieved_catalog", lambda: {})
    with pytest.raises(TunecostError, match="no achieved matmul/bandwidth values"):
        catalog_gpu_terms(get_gpu("A40"))


def test_profile_launch_and_host_times_replace_the_calibrated_ones(gpu_terms) -> None:
    counts = _counts(1)
    plain = step_time(counts, gpu_terms(), PARAMS)
    assert plain.kernel_overhead_s == pytest.approx(PARAMS.kernel_overhead_s * counts.total_kernels)
    measured = step_time(counts, gpu_terms(kernel_launch_s=5e-6, host_step_s=0.2), PARAMS)
    assert measured.kernel_overhead_s == pytest.approx(5e-6 * counts.total_kernels)
    assert measured.step_overhead_s == 0.2
    assert measured.gpu_s == pytest.approx(plain.gpu_s)  # GPU work unchanged


def test_gpu_work_halves_when_every_rate_doubles(gpu_terms) -> None:
    counts = _counts(4)
    slow = step_time(counts, gpu_terms(), PARAMS)
    fast = step_time(
        counts, gpu_terms(matmul_flops_per_s=200e12, fp32_flops_per_s=40e12, memory_bytes_per_s=2e12), PARAMS
    )
    assert fast.gpu_s == pytest.approx(slow.gpu_s / 2)
    assert fast.kernel_overhead_s == slow.kernel_overhead_s  # host time does not shrink with the GPU


def test_measured_dequant_rate_sets_the_dequant_time(gpu_terms) -> None:
    counts = _counts(1)
    slow = step_time(counts, gpu_terms(dequant_bytes_per_s=1e11), PARAMS).class_s["dequant"]
    fast = step_time(counts, gpu_terms(dequant_bytes_per_s=1e12), PARAMS).class_s["dequant"]
    assert slow == pytest.approx(10 * fast, rel=0.05)


def test_host_times_scale_with_the_host_speed_and_gpu_work_does_not() -> None:
    counts = _counts(1)
    gpu = get_gpu("A40")
    ref = step_time(counts, catalog_gpu_terms(gpu), PARAMS)
    fast = catalog_gpu_terms(gpu, "Xeon Platinum 8480C")
    assert fast.host_speed == pytest.approx(3.8 / 3.4 * 1.19) and fast.host_named
    st = step_time(counts, fast, PARAMS)
    assert st.gpu_s == pytest.approx(ref.gpu_s)
    assert st.kernel_overhead_s == pytest.approx(ref.kernel_overhead_s / fast.host_speed)
    assert st.step_overhead_s == pytest.approx(0.05 / fast.host_speed)
    assert catalog_gpu_terms(get_gpu("H100")).host_cpu == "Xeon Platinum 8480C"  # its DGX system's CPU
    with pytest.raises(TunecostError, match="unknown host CPU"):
        catalog_gpu_terms(gpu, "Pentium II")
