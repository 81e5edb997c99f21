"""DeepSpeed ZeRO CPU offload: the states that leave the GPU, the host's share (hand counts on the tiny Mixtral,
full fine-tuning in fp32: AdamW keeps 8 bytes per parameter, the fp32 gradient 4), the PCIe copies of a step,
(strategies that do not offload: `test_plan.py`)."""

from __future__ import annotations

import pytest
from test_setups import links_at
from tiny_jobs import tiny_job

from tunecost.distributed.rank_memory import rank_memory, rank_segment_bytes, single_gpu_step
from tunecost.distributed.timing import step_time
from tunecost.workload.job import LoraConfig
from tunecost.workload.parallel import ParallelPlan

BUSBW = 1e9  # bytes/s on every link (PCIe to the host included), no latency
N = 4


@pytest.fixture(scope="module")
def full():
    job = tiny_job("tiny-mixtral-2l", "full", LoraConfig(rank=8))
    return job, single_gpu_step(job, granule_bytes=1)


def _opt_segment(step, job, strategy: str, offload: str) -> dict[str, int]:
    plan = ParallelPlan(num_gpus=N, strategy=strategy, offload=offload)
    return rank_segment_bytes(step.segments["optimizer:opt"], "optimizer", step, job, plan)


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_optimizer_offload_moves_states_and_gradients_to_the_host(full, strategy):
    job, step = full
    on_gpu, kept = _opt_segment(step, job, strategy, "optimizer"), _opt_segment(step, job, strategy, "none")
    assert "optimizer_states" in kept and "gradients" in kept
    assert not {"optimizer_states", "gradients"} & set(on_gpu)
    assert on_gpu["trainable_params"] == kept["trainable_params"]  # the 16-bit (here fp32) weights stay
    params = step.trainable_bytes // 4
    memory = rank_memory(step, job, ParallelPlan(num_gpus=N, strategy=strategy, offload="optimizer"))
    assert memory.host_bytes == -(-(params * (8 + 4)) // N)  # AdamW states + fp32 gradients, 1/N each


def test_parameter_offload_moves_the_stored_weights_too(full):
    job, step = full
    on_gpu = _opt_segment(step, job, "zero3", "params")
    assert "trainable_params" not in on_gpu and "frozen_weights" not in on_gpu
    memory = rank_memory(step, job, ParallelPlan(num_gpus=N, strategy="zero3", offload="params"))
    params = step.trainable_bytes // 4
    assert memory.host_bytes == -(-(params * 12 + step.weight_bytes) // N)
    assert memory.peak_bytes < rank_memory(step, job, ParallelPlan(num_gpus=N, strategy="zero3")).peak_bytes


def _copies(step, strategy: str, offload: str, expert_parallel: int = 1) -> dict[str, float]:
    plan = ParallelPlan(num_gpus=N, strategy=strategy, offload=offload, expert_parallel=expert_parallel)
    _timed, collectives = step_time(step, plan, links_at(BUSBW), compute_seconds=1.0)
    out: dict[str, float] = {}
    for c in collectives:
        if c.op in ("device_to_host", "host_to_device"):
            out[c.op] = out.get(c.op, 0.0) + c.count * c.nbytes
            assert c.seconds == pytest.approx(c.nbytes / BUSBW)
    return out


@pytest.mark.parametrize("expert_parallel", [1, 2])
@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_optimizer_offload_copies_the_gradient_partition_out_and_the_update_back(full, strategy, expert_parallel):
    """A rank's partition is 1/N of the trainable bytes with or without EP (1/EP of the experts, shared by N/EP)."""
    _job, step = full
    copies = _copies(step, strategy, "optimizer", expert_parallel)
    assert copies["device_to_host"] == pytest.approx(step.trainable_bytes / N)
    assert copies["host_to_device"] == pytest.approx(step.trainable_bytes / N)
    assert _copies(step, strategy, "none") == {}


def test_parameter_offload_fetches_every_shard_in_forward_and_backward(full):
    _job, step = full
    copies = _copies(step, "zero3", "params")
    assert copies["host_to_device"] == pytest.approx(2 * step.weight_bytes / N)
    assert copies["device_to_host"] == pytest.approx(step.trainable_bytes / N)


def test_the_updated_partition_is_exposed(full):
    """The copy back after the optimizer step has nothing to hide under: the step grows by at least it."""
    _job, step = full
    plan = dict(num_gpus=N, strategy="zero2")
    with_offload, _ = step_time(step, ParallelPlan(**plan, offload="optimizer"), links_at(BUSBW), 1.0)
    without, _ = step_time(step, ParallelPlan(**plan), links_at(BUSBW), 1.0)
    assert with_offload.step_seconds - without.step_seconds >= step.trainable_bytes / N / BUSBW * (1 - 1e-9)


@pytest.mark.parametrize("strategy", ["fsdp1", "fsdp2"])
def test_fsdps_cpu_offload_keeps_every_state_on_the_host_and_fetches_each_shard(full, strategy):
    """FSDP's CPU offload (FSDP1 CPUOffload(offload_params=True), FSDP2 CPUOffloadPolicy): parameter and gradient
    shards and the optimizer on the host, the optimizer's own states (no ZeRO fp32 master copy), the same copies
    per step as ZeRO-3's parameter offload."""
    job, step = full
    on_gpu = _opt_segment(step, job, strategy, "params")
    assert not {"trainable_params", "frozen_weights", "gradients", "optimizer_states"} & set(on_gpu)
    memory = rank_memory(step, job, ParallelPlan(num_gpus=N, strategy=strategy, offload="params"))
    params = step.trainable_bytes // 4
    optimizer = max(c.get("optimizer_states", 0) for c in step.segments.values())
    assert memory.host_bytes == -(-(optimizer + params * 4 + step.weight_bytes) // N)
    assert memory.peak_bytes < rank_memory(step, job, ParallelPlan(num_gpus=N, strategy=strategy)).peak_bytes
    assert any("FSDP CPU offload" in a for a in memory.assumptions)
    copies = _copies(step, strategy, "params")
    assert copies["host_to_device"] == pytest.approx(2 * step.weight_bytes / N)
    assert copies["device_to_host"] == pytest.approx(step.trainable_bytes / N)
