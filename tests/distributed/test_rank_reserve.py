"""A rank's reserve: the caching allocator replayed over the rank's allocations (`distributed.rank_reserve`).
Expected values are counted from the rank's own records: the all-gather outputs of the root and the layers on the
unshard stream, the sharded gradients on the post-backward stream, the states scaled as `rank_segment_bytes`."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from tiny_jobs import tiny_job
from tiny_models import write_llama_config

from tunecost.distributed.rank_memory import rank_memory, rank_segment_bytes, single_gpu_step
from tunecost.distributed.rank_reserve import (
    STREAM_COMPUTE,
    STREAM_POST_BACKWARD,
    STREAM_UNSHARD,
    full_depth_side_allocations,
    rank_allocations,
    stream_peak_bytes,
)
from tunecost.simulate.allocator import KIND_STEP, KIND_WEIGHT, NEVER_FREED, steady_state_replay
from tunecost.simulate.step_types import CATEGORIES, WEIGHT_CATEGORIES, AllocationTrace
from tunecost.workload.job import FineTuneJob, LoraConfig
from tunecost.workload.parallel import MULTI_GPU_STRATEGIES, ParallelPlan


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
    rank = rank_segment_bytes(step.segments["optimizer:opt"], "optimizer:opt", step, job, plan)
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


@pytest.fixture(scope="module")
def deep_job_step(tmp_path_factory):
    """A 6-layer Llama, full fine-tune: traced at 1 and 2 layers, so the side streams are laid out at full depth."""
    config = tmp_path_factory.mktemp("deep") / "tiny-llama-6l.json"
    sizes = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4)
    write_llama_config(config, num_hidden_layers=6, vocab_size=256, **sizes)
    job = FineTuneJob(model=str(config), method="full", compute_dtype="fp32", batch_size=2, seq_len=16)
    return job, single_gpu_step(job)


def test_side_streams_at_full_depth_hold_every_layer(deep_job_step):
    """At full depth the post-backward stream holds every layer's gradient shards (the traced layer 0's, six
    times, and the root's) until zero_grad, and the unshard stream the root's and two layers' outputs at once."""
    job, step = deep_job_step
    plan = ParallelPlan(num_gpus=2, strategy="fsdp2")
    trace = AllocationTrace(**step.allocations)
    assert len(trace.forward_ops) == step.num_layers == 6  # the traced step made whole (`simulate.full_depth`)
    side = full_depth_side_allocations(step, job, plan)
    post, unshard = side["stream"] == STREAM_POST_BACKWARD, side["stream"] == STREAM_UNSHARD
    grads = np.asarray(trace.category) == CATEGORIES.index("gradients")
    layer = np.asarray(trace.layer)
    shards = [math.ceil(n / 2) for n in np.asarray(trace.nbytes)[grads & (layer == 0)].tolist()]
    root = [math.ceil(n / 2) for n in np.asarray(trace.nbytes)[grads & (layer == -1)].tolist()]
    assert sorted(side["nbytes"][post].tolist()) == sorted(6 * shards + root)
    assert unshard.sum() == 1 + 2 * 6
    num_ops = 4 * 6 + 3
    assert _live_peak(side, unshard, num_ops) == step.root_weight_bytes + 2 * step.layer_weight_bytes
    replay = steady_state_replay(
        side["nbytes"], side["t_alloc"], side["t_free"], side["kind"], 4 * 6 + 2, stream=side["stream"]
    )
    rank_gradients = rank_segment_bytes(step.segments["optimizer:opt"], "optimizer:opt", step, job, plan)["gradients"]
    assert replay.stream_reserved_bytes[STREAM_POST_BACKWARD] >= rank_gradients
    assert (side["kind"] == KIND_STEP).all()


def test_the_reserve_sums_the_streams_pools(deep_job_step):
    """The rank's reserve holds at least each stream's most live bytes at once, all streams together (their
    cached blocks serve no other stream), and at least the allocated peak."""
    job, step = deep_job_step
    plan = ParallelPlan(num_gpus=2, strategy="fsdp2")
    m = rank_memory(step, job, plan)
    live = stream_peak_bytes(step, job, plan)
    assert set(live) == {STREAM_COMPUTE, STREAM_UNSHARD, STREAM_POST_BACKWARD}
    assert m.peak_reserved_bytes >= sum(live.values()) >= m.peak_bytes


def test_a_step_without_traced_allocations_reserves_its_allocated_peak(job_step):
    job, step = job_step
    bare = dataclasses.replace(step, allocations={})
    m = rank_memory(bare, job, ParallelPlan(num_gpus=2, strategy="fsdp2"))
    assert m.peak_reserved_bytes == m.peak_bytes


def test_a_replay_of_the_same_allocations_is_answered_from_memory(monkeypatch):
    """Equal allocations (another GPU, a strategy that allocates alike) replay once; any other size replays."""
    from collections import OrderedDict

    from tunecost.distributed import rank_reserve

    monkeypatch.setattr(rank_reserve, "_REPLAYS", OrderedDict())
    calls = []

    def counted(*args, **kwargs):
        calls.append(args)
        return steady_state_replay(*args, **kwargs)

    monkeypatch.setattr(rank_reserve, "steady_state_replay", counted)
    a = {
        "nbytes": np.array([4 << 20, 3 << 20, 1 << 20]),
        "t_alloc": np.array([0, 1, 2]),
        "t_free": np.array([NEVER_FREED, 3, 3]),
        "kind": np.array([KIND_WEIGHT, KIND_STEP, KIND_STEP]),
        "stream": np.zeros(3, dtype=np.int64),
    }
    first = rank_reserve._replay(a, 5)
    assert rank_reserve._replay({k: v.copy() for k, v in a.items()}, 5) == first and len(calls) == 1
    other = rank_reserve._replay({**a, "nbytes": np.array([4 << 20, 3 << 20, 5 << 20])}, 5)
    assert len(calls) == 2 and other != first
    replay = steady_state_replay(a["nbytes"], a["t_alloc"], a["t_free"], a["kind"], 5, stream=a["stream"])
    assert first == (replay.stream_reserved_bytes, replay.stream_peak_requested_bytes)
