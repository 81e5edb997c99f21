"""Host/GPU overlap in the step time: where the host waits for the GPU decides whether launches add or hide.

Hand-made counts on the conftest's made-up GPU (100 TFLOP/s matmul, 1 TB/s): `F` FLOPs in one GEMM so large that
its efficiency is the stack's take F / (0.5 x 100e12) s; `K` kernels of a class with no work take K x 20 us of
host time; the host time per step is 0.05 s.
"""

from __future__ import annotations

from types import MappingProxyType

import pytest

from tunecost.estimate.throughput import counts as tc
from tunecost.estimate.throughput.lengths import fixed_lengths
from tunecost.estimate.throughput.model import SMOOTH_MAX_POWER, StackParams, overlapped_s, step_time
from tunecost.models.catalog import resolve_model
from tunecost.workload.job import FineTuneJob

SYNC_PER_MICRO_STEP, SYNC_PER_MOE_LAYER = tc.SYNC_PER_MICRO_STEP, tc.SYNC_PER_MOE_LAYER
PARAMS = StackParams(
    gemm_efficiency=0.5, gemm_half_rows=64, memory_efficiency=0.8, kernel_overhead_s=20e-6, step_overhead_s=0.05
)
HOST_STEP_S = 0.05
GEMM_FLOPS_PER_S = 0.5 * 100e12  # the stack's efficiency x the GPU's achieved rate
LAUNCH_S = 20e-6
OPT_BYTES_PER_S = 0.8 * 1e12  # the optimizer's memory-bound work: memory efficiency x bandwidth


def _counts(
    sync: str, *, gpu_s: float = 0.0, launch_s: float = 0.0, opt_gpu_s: float = 0.0, opt_launch_s: float = 0.0
) -> tc.AnalyticStepCounts:
    """Counts whose micro-steps take `gpu_s` on the GPU and `launch_s` of launches, and whose optimizer step takes
    `opt_gpu_s` (memory-bound) and `opt_launch_s`."""
    return tc.AnalyticStepCounts(
        flops_by_class=MappingProxyType({"dense_matmul": gpu_s * GEMM_FLOPS_PER_S}),
        bytes_by_class=MappingProxyType({"optimizer": opt_gpu_s * OPT_BYTES_PER_S}),
        kernels_by_class=MappingProxyType({"elementwise": launch_s / LAUNCH_S, "optimizer": opt_launch_s / LAUNCH_S}),
        gemm_rows_by_class=MappingProxyType({"dense_matmul": 1e18}),
        peak_by_class=MappingProxyType({"dense_matmul": tc.TENSOR_CORE}),
        batch_size=1,
        tokens_per_step=1.0,
        lengths=fixed_lengths(1, 1),
        host_sync=sync,
    )


def test_overlap_is_the_soft_corner_of_the_roofline() -> None:
    assert overlapped_s(2.0, 0.0) == 2.0  # GPU-bound: the GPU's time
    assert overlapped_s(0.0, 3.0) == 3.0  # host-bound: the host's time
    assert overlapped_s(1.0, 1.0) == pytest.approx(2 ** (1 / SMOOTH_MAX_POWER))  # equal: 1.189 x
    assert overlapped_s(1.0, 0.1) == pytest.approx((1 + 0.1**4) ** 0.25)  # 1.000025: the smaller one hides


def test_gpu_bound_step_is_its_gpu_time(gpu_terms) -> None:
    st = step_time(_counts(SYNC_PER_MICRO_STEP, gpu_s=1.0), gpu_terms(), PARAMS)
    assert st.step_s == pytest.approx(1.0 + HOST_STEP_S, rel=1e-9)
    assert st.exposed_host_s == pytest.approx(HOST_STEP_S)


def test_host_bound_step_is_its_host_time(gpu_terms) -> None:
    st = step_time(_counts(SYNC_PER_MICRO_STEP, launch_s=1.0), gpu_terms(), PARAMS)
    assert st.kernel_overhead_s == pytest.approx(1.0)
    assert st.step_s == pytest.approx(1.0 + HOST_STEP_S)


@pytest.mark.parametrize(
    ("sync", "expected_s"),
    [
        (SYNC_PER_MICRO_STEP, 2**0.25 * 1.0 + HOST_STEP_S),  # launches hide under GPU work: smooth corner, 1.239 s
        (SYNC_PER_MOE_LAYER, 1.0 + 1.0 + HOST_STEP_S),  # host and GPU take turns: they add, 2.05 s
        (tc.SYNC_PER_QUANT_LINEAR, 1.0 + 1.0 + HOST_STEP_S),  # LLM.int8's outlier check in every linear: alike
    ],
)
def test_equal_host_and_gpu_time(gpu_terms, sync: str, expected_s: float) -> None:
    st = step_time(_counts(sync, gpu_s=1.0, launch_s=1.0), gpu_terms(), PARAMS)
    assert st.host_sync == sync
    assert st.step_s == pytest.approx(expected_s, rel=1e-9)


def test_optimizer_step_is_a_segment_of_its_own(gpu_terms) -> None:
    """The trainer synchronises before the optimizer step: its launches cannot hide under backward's GPU work."""
    counts = _counts(SYNC_PER_MICRO_STEP, gpu_s=1.0, launch_s=0.1, opt_gpu_s=0.2, opt_launch_s=0.2)
    expected = (1.0 + 0.1**4) ** 0.25 + 0.2 * 2**0.25 + HOST_STEP_S  # 1.000025 + 0.2378 + 0.05
    assert step_time(counts, gpu_terms(), PARAMS).step_s == pytest.approx(expected, rel=1e-9)


def test_accumulated_micro_steps_overlap_like_one(gpu_terms) -> None:
    """N equal micro-steps each take smoothmax(g, h): N x that is smoothmax(N g, N h) (degree-1 homogeneous)."""
    one = _counts(SYNC_PER_MICRO_STEP, gpu_s=1.0, launch_s=0.7)
    eight = step_time(tc.accumulated(one, 8), gpu_terms(), PARAMS)
    assert eight.step_s == pytest.approx(8 * overlapped_s(1.0, 0.7) + HOST_STEP_S, rel=1e-9)


def _analytic(model: str, **job):
    return tc.analytic_step_counts(resolve_model(model), FineTuneJob(model=model, batch_size=1, seq_len=512, **job))


def test_moe_loops_sync_per_layer_and_keep_the_sum(gpu_terms) -> None:
    """The paper's stacks (eager routed-expert loops: Mixtral QLoRA, BlackMamba full) keep host + GPU."""
    for counts in (_analytic("mixtral-8x7b", method="qlora"), _analytic("blackmamba-2.8b", method="full")):
        assert counts.host_sync == SYNC_PER_MOE_LAYER
        st = step_time(counts, gpu_terms(), PARAMS)
        assert st.step_s == pytest.approx(st.gpu_s + st.kernel_overhead_s + HOST_STEP_S, rel=1e-12)


def test_dense_models_overlap_host_and_gpu(gpu_terms) -> None:
    counts = _analytic("mistralai/Mistral-7B-v0.1", method="lora")
    assert counts.host_sync == SYNC_PER_MICRO_STEP
    st = step_time(counts, gpu_terms(), PARAMS)
    assert max(st.gpu_s, st.kernel_overhead_s) + HOST_STEP_S <= st.step_s
    assert st.step_s < st.gpu_s + st.kernel_overhead_s + HOST_STEP_S
