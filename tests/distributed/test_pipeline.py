"""Pipeline stages of the tiny Llama on 2 real gloo ranks against their fake-process-group simulation (torch's own
`PipelineStage`, `Schedule1F1B`, `ScheduleGPipe`), and the pipeline formulas against torch's schedule order."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_jobs import pipeline_job

from tunecost.distributed.pipeline import (
    bubble_fraction,
    bubble_from_order,
    in_flight_from_order,
    in_flight_micro_batches,
    p2p_bytes_per_micro_batch,
    schedule_order,
    stage_layer_ids,
    stage_memory,
)
from tunecost.distributed.pipeline_step import measure_stages, simulate_stage
from tunecost.errors import TunecostError

NUM_STAGES, MICRO_BATCHES = 2, 4
SCHEDULES = ("1f1b", "gpipe")


@pytest.fixture(scope="module", params=SCHEDULES)
def layout(request):
    """(schedule, measured StageSteps, simulated StageSteps): one gloo launch per schedule."""
    job = pipeline_job()
    measured = measure_stages(job, num_stages=NUM_STAGES, schedule=request.param, micro_batches=MICRO_BATCHES)
    simulated = [
        simulate_stage(
            job, num_stages=NUM_STAGES, stage=s, schedule=request.param, micro_batches=MICRO_BATCHES, granule_bytes=1
        )
        for s in range(NUM_STAGES)
    ]
    return request.param, measured, simulated


@pytest.mark.long
def test_simulated_stage_peaks_match_gloo(layout):
    _schedule, measured, simulated = layout
    for meas, sim in zip(measured, simulated, strict=True):
        assert sim.stage == meas.stage
        assert sim.peak_bytes == pytest.approx(meas.peak_bytes, rel=0.03)
        assert sim.static_bytes == meas.static_bytes


@pytest.mark.long
def test_sends_and_recvs_match_gloo_and_the_hand_count(layout):
    _schedule, measured, simulated = layout
    job = pipeline_job()
    # one (1, 64, 64) fp32 activation forward per micro-batch, its gradient back
    one = p2p_bytes_per_micro_batch(
        micro_batch_size=job.batch_size // MICRO_BATCHES, seq_len=64, hidden_size=64, bytes_per_element=4
    )
    for meas, sim in zip(measured, simulated, strict=True):
        assert sim.p2p_totals() == meas.p2p_totals()
        assert meas.p2p_totals() == {
            "send": (MICRO_BATCHES, MICRO_BATCHES * one),
            "recv": (MICRO_BATCHES, MICRO_BATCHES * one),
        }
        peer = 1 - meas.stage
        assert all(p.peer == peer for p in meas.p2p)


@pytest.mark.long
def test_stage_memory_estimate_against_gloo(layout):
    """`stage_memory` from the single-GPU step at the micro-batch size: on this tiny model it under-estimates each
    measured stage peak by 7-12 % (docs/multi-gpu.md lists the numbers); checked within 15 %, never above."""
    from tunecost.distributed.single_step import trace_single_gpu_step

    schedule, measured, _simulated = layout
    job = pipeline_job()
    micro = trace_single_gpu_step(dataclasses.replace(job, batch_size=job.batch_size // MICRO_BATCHES), 1)
    for meas in measured:
        est = stage_memory(micro, pp=NUM_STAGES, stage=meas.stage, schedule=schedule, micro_batches=MICRO_BATCHES)
        assert est.peak_bytes == pytest.approx(meas.peak_bytes, rel=0.15)
        assert est.peak_bytes <= meas.peak_bytes
        assert est.breakdown_bytes["p2p_buffers"] == meas.static_bytes["p2p_buffers"]


@settings(max_examples=15, deadline=None)
@given(
    schedule=st.sampled_from(("1f1b", "gpipe")),
    pp=st.integers(min_value=1, max_value=6),
    extra=st.integers(min_value=0, max_value=8),
)
def test_bubble_and_in_flight_follow_torch_order(schedule, pp, extra):
    m = pp + extra
    order = schedule_order(schedule, pp, m)
    assert bubble_from_order(order) == pytest.approx(bubble_fraction(schedule, pp, m))
    assert bubble_from_order(order, backward_s=1.0) == pytest.approx(bubble_fraction(schedule, pp, m))
    for rank in range(pp):
        assert in_flight_from_order(order, rank) == in_flight_micro_batches(schedule, pp, m, rank)


@pytest.mark.parametrize(("pp", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 16, 3), (4, 4, 2)])
def test_interleaved_bubble_is_megatrons(pp, m, v):
    """Narayanan et al. 2021: (p-1)/(v m + p-1); in flight on rank r: Megatron's warm-up count
    2 (p - r - 1) + (v - 1) p plus the one in the steady state, at most v m."""
    order = schedule_order("interleaved-1f1b", pp, m, v)
    assert bubble_from_order(order) == pytest.approx(bubble_fraction("interleaved-1f1b", pp, m, v))
    for rank in range(pp):
        megatron = min(v * m, 2 * (pp - rank - 1) + (v - 1) * pp + 1)
        assert in_flight_micro_batches("interleaved-1f1b", pp, m, rank, v) == megatron


def test_stage_layers_split_evenly():
    assert [list(stage_layer_ids(5, 2, s)) for s in range(2)] == [[0, 1, 2], [3, 4]]
    with pytest.raises(TunecostError, match="at least as many layers"):
        stage_layer_ids(2, 4, 0)


def test_bad_schedule_is_one_line():
    with pytest.raises(TunecostError, match="unknown pipeline schedule"):
        bubble_fraction("zb", 2, 4)
    with pytest.raises(TunecostError, match="virtual stages"):
        bubble_fraction("1f1b", 2, 4, virtual_stages=2)
    with pytest.raises(TunecostError, match="at least as many micro-batches"):
        in_flight_micro_batches("1f1b", 4, 2, 0)
