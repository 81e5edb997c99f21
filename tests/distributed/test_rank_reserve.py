"""A rank's reserve: the caching allocator replayed over the rank's allocations (`distributed.rank_reserve`).
Expected values are counted from the rank's own records: the all-gather outputs of the root and the layers on the
unshard stream, the sharded gradients on the post-backward stream, the states scaled as `rank_segment_bytes`."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tiny_jobs import tiny_job

from tunecost.distributed.plan import MULTI_GPU_STRATEGIES, ParallelPlan
from tunecost.distributed.rank_memory import rank_memory, rank_segment_bytes, single_gpu_step
from tunecost.distributed.rank_reserve import (
    STREAM_COMPUTE,
    STREAM_POST_BACKWARD,
    STREAM_UNSHARD,
    rank_allocations,
)
from tunecost.simulate.allocator import KIND_WEIGHT
from tunecost.simulate.records import CATEGORIES, WEIGHT_CATEGORIES, AllocationTrace
from tunecost.workload.job import LoraConfig


@pytest.fixture(scope="module", params=["full", "lora"])
def job_step(request):
    job = tiny_job("tiny-llama-2l", request.param, LoraConfig(rank=8, targets=("attention",)))
    return job, single_gpu_step(job)


def _live_peak(a: dict[str, np.ndarray], mask: np.ndarray, num_ops: int) -> int:
    """Most bytes of the masked records alive at one op (allocated at or before it, freed at or after it)."""
    n, t0, t1 = a["nbytes"][mask], a["t_alloc"][mask], a["t_free"][mask]
    return max(int(n[(t0 <= t) & (t1 >= t)].sum()) for t in range(1, num_ops + 1))


@pytest.mark.parametrize("strategy", MULTI_GPU_STRATEGIES)
def test_a_ranks_reserve_covers_its_allocated_peak(job_step, strategy):
    job, step = job_step
    m = rank_memory(step, job, ParallelPlan(num_gpus=2, strategy=strategy))
    assert m.peak_reserved_bytes >= m.peak_bytes
    assert m.nvidia_smi_bytes == m.peak_reserved_bytes + m.device_overhead_bytes + m.nccl_bytes


def test_the_traced_windows_follow_the_passes(job_step):
    """Forward runs layer 0 then 1, backward 1 then 0, all before the optimizer."""
    _, step = job_step
    trace = AllocationTrace(**step.allocations)
    (f0, f1), (b0, b1) = trace.forward_ops, trace.backward_ops
    assert 0 < f0[0] <= f0[1] < f1[0] <= f1[1] < b1[0] <= b1[1] < b0[0] <= b0[1] < trace.t_optimizer


def test_fsdp_all_gather_outputs_are_on_the_unshard_stream(job_step):
    """The root's output once, each traced layer's twice (forward, backward); with the prefetch two layers are
    in flight beside the root, never more."""
    job, step = job_step
    a = rank_allocations(step, job, ParallelPlan(num_gpus=2, strategy="fsdp2"))
    unshard = a["stream"] == STREAM_UNSHARD
    layers = len(AllocationTrace(**step.allocations).forward_ops)
    layer = step.layer_weight_bytes
    assert sorted(a["nbytes"][unshard].tolist()) == sorted([step.root_weight_bytes] + [layer] * 2 * layers)
    num_ops = AllocationTrace(**step.allocations).num_ops
    assert _live_peak(a, unshard, num_ops) == step.root_weight_bytes + 2 * layer


def test_fsdp_sharded_gradients_are_reduce_scatter_outputs(job_step):
    """Each gradient is whole on the compute stream until its layer's backward ends, then its shard (the
    reduce-scatter output) lives on the post-backward stream until zero_grad: the rank's gradients at the
    optimizer segment, up to one byte per record of rounding up."""
    job, step = job_step
    plan = ParallelPlan(num_gpus=2, strategy="fsdp2")
    a = rank_allocations(step, job, plan)
    trace = AllocationTrace(**step.allocations)
    post = a["stream"] == STREAM_POST_BACKWARD
    rank = rank_segment_bytes(step.segments["optimizer:opt"], "optimizer", step, job, plan)
    assert 0 <= int(a["nbytes"][post].sum()) - rank["gradients"] < post.sum()
    assert (a["t_alloc"][post] < trace.t_optimizer).all()
    grads = np.asarray(trace.category) == CATEGORIES.index("gradients")
    assert post.sum() == grads.sum()  # one shard per gradient


def test_ddp_keeps_the_states_whole_and_adds_its_buckets(job_step):
    """No sharding and no side streams: the weights as traced, plus one bucket copy of the trainable gradients."""
    job, step = job_step
    a = rank_allocations(step, job, ParallelPlan(num_gpus=2, strategy="ddp"))
    trace = AllocationTrace(**step.allocations)
    weights = [CATEGORIES.index(c) for c in WEIGHT_CATEGORIES]
    traced = sum(n for n, c in zip(trace.nbytes, trace.category, strict=True) if c in weights)
    assert (a["stream"] == STREAM_COMPUTE).all()
    assert int(a["nbytes"][a["kind"] == KIND_WEIGHT].sum()) == traced + step.trainable_bytes


def test_sharded_weights_are_the_ranks_share(job_step):
    """fsdp2 on 4 GPUs: each weight record is ceil(1/4) of the traced one."""
    job, step = job_step
    a = rank_allocations(step, job, ParallelPlan(num_gpus=4, strategy="fsdp2"))
    trace = AllocationTrace(**step.allocations)
    weights = [CATEGORIES.index(c) for c in WEIGHT_CATEGORIES if c != "buffers"]
    expected = sum(math.ceil(n / 4) for n, c in zip(trace.nbytes, trace.category, strict=True) if c in weights)
    buffers = sum(n for n, c in zip(trace.nbytes, trace.category, strict=True) if c == CATEGORIES.index("buffers"))
    assert int(a["nbytes"][a["kind"] == KIND_WEIGHT].sum()) == expected + buffers
