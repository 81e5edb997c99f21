"""Expert parallelism: routed experts divided over the EP ranks in memory, all-to-all dispatch and combine per
MoE layer in the step (hand counts on the tiny Mixtral: 2 layers, 8 experts, top-2, hidden 64, fp32,
2 x 16 tokens), and one-line errors for degrees a model or strategy cannot take."""

from __future__ import annotations

import pytest
from test_setups import links_at
from tiny_jobs import tiny_job

from tunecost.distributed import expert_parallel
from tunecost.distributed.layouts import valid_gpu_counts
from tunecost.distributed.rank_memory import rank_memory, rank_segment_bytes, single_gpu_step
from tunecost.distributed.timing import step_time
from tunecost.errors import TunecostError
from tunecost.estimate.gpu_search import estimate_multi_gpu
from tunecost.workload.job import LoraConfig
from tunecost.workload.parallel import ParallelPlan

BUSBW = 1e9  # bytes/s, no latency
TOKENS, TOP_K, HIDDEN, FP32 = 2 * 16, 2, 64, 4  # tiny-mixtral-2l.json, tiny_jobs.tiny_job


@pytest.fixture(scope="module")
def full():
    job = tiny_job("tiny-mixtral-2l", "full", LoraConfig(rank=8))
    return job, single_gpu_step(job, granule_bytes=1)


def test_dispatch_bytes_are_tokens_times_top_k_times_hidden_times_dtype(full):
    _job, step = full
    assert step.dispatch_bytes == TOKENS * TOP_K * HIDDEN * FP32 == 16_384


def test_all_to_alls_per_moe_layer_forward_backward_and_recompute():
    assert expert_parallel.all_to_all_per_layer(recompute=False) == {"forward": 2, "backward": 2}
    assert expert_parallel.all_to_all_per_layer(recompute=True) == {"forward": 2, "backward": 4}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2", "zero2"])
def test_all_to_all_time_follows_the_bus_bandwidth_and_is_exposed(full, strategy):
    """2 layers x (2 forward + 2 backward) all-to-alls of 16,384 bytes over 4 EP ranks: (n-1)/n of the bytes."""
    _job, step = full
    plan = ParallelPlan(num_gpus=8, strategy=strategy, expert_parallel=4)
    timed, collectives = step_time(step, plan, links_at(BUSBW), compute_seconds=1.0)
    a2a = [c for c in collectives if c.op == "all_to_all"]
    assert {(c.phase, c.count, c.ranks, c.nbytes) for c in a2a} == {
        ("forward", 4, 4, 16_384),
        ("backward", 4, 4, 16_384),
    }
    a2a_seconds = 8 * 16_384 * (4 - 1) / 4 / BUSBW
    assert sum(c.total_seconds for c in a2a) == pytest.approx(a2a_seconds)
    assert timed.exposed_comm_seconds >= a2a_seconds * (1 - 1e-9)


def test_expert_gradients_reduce_over_the_ranks_holding_the_same_experts(full):
    """DDP on 8 ranks, EP 4: non-expert gradients all-reduced over 8 ranks, a quarter of the expert gradients
    over the 2 ranks that hold the same experts: 2(n-1)/n of each."""
    _job, step = full
    experts = step.expert_trainable_bytes
    plan = ParallelPlan(num_gpus=8, strategy="ddp", expert_parallel=4)
    _timed, collectives = step_time(step, plan, links_at(BUSBW), compute_seconds=1.0)
    reduced = sum(c.total_seconds for c in collectives if c.op == "all_reduce")
    dense = (step.trainable_bytes - experts) * 2 * 7 / 8
    assert reduced == pytest.approx((dense + experts // 4 * 2 * 1 / 2) / BUSBW)


def test_expert_states_are_divided_by_the_expert_parallel_degree(full):
    """DDP replicates everything but the routed experts, of which a rank holds 1/EP; FSDP2 stores 1/N of every
    state either way, and its gathered layer holds 1/EP of the experts."""
    job, step = full
    opt = step.segments["optimizer:opt"]
    ddp1, ddp4 = (
        rank_segment_bytes(opt, "optimizer", step, job, ParallelPlan(num_gpus=8, strategy="ddp", expert_parallel=e))
        for e in (1, 4)
    )
    share = step.expert_share("trainable_params")
    assert 0.5 < share < 1  # the tiny Mixtral's experts hold most of its weights
    for category in ("trainable_params", "gradients", "optimizer_states"):
        assert ddp4[category] == pytest.approx(ddp1[category] * (1 - share + share / 4), abs=2)
    fsdp = {e: rank_memory(step, job, ParallelPlan(num_gpus=8, strategy="fsdp2", expert_parallel=e)) for e in (1, 4)}
    for category in ("trainable_params", "optimizer_states"):
        stored = [
            rank_segment_bytes(
                opt, "optimizer", step, job, ParallelPlan(num_gpus=8, strategy="fsdp2", expert_parallel=e)
            )
            for e in (1, 4)
        ]
        assert stored[0][category] == pytest.approx(stored[1][category], abs=2)
    assert fsdp[4].peak_bytes < fsdp[1].peak_bytes  # smaller gathered layers outweigh the all-to-all buffers
    forward = rank_segment_bytes(
        step.segments["forward:unit_last"],
        "forward",
        step,
        job,
        ParallelPlan(num_gpus=8, strategy="fsdp2", expert_parallel=4),
    )
    assert forward["all_to_all_buffers"] == 2 * step.dispatch_bytes
    layer_experts = step.layer_expert_bytes(trainable=False)
    assert forward["all_gather_buffers"] == 2 * (step.layer_weight_bytes - layer_experts + layer_experts // 4)


def test_search_takes_counts_the_degree_divides():
    assert valid_gpu_counts(8, 32, 4) == [4, 8, 16, 24, 32]


@pytest.mark.parametrize(
    ("config", "strategy", "num_gpus", "degree", "message"),
    [
        ("tiny-llama-2l", "fsdp2", 4, 2, "needs an MoE model; .* is dense"),
        ("tiny-mixtral-2l", "fsdp2", 4, 3, "expert-parallel degree 3 must be at least 1 and divide the 4 GPUs"),
        ("tiny-mixtral-2l", "fsdp2", 16, 16, "does not divide the model's 8 experts"),
        ("tiny-mixtral-2l", "hsdp", 4, 2, "with hsdp is not modelled"),
    ],
)
def test_bad_expert_parallel_degrees_are_one_line_errors(config, strategy, num_gpus, degree, message):
    job = tiny_job(config, "full", LoraConfig(rank=8, targets=("attention",)))
    from tunecost.catalog.gpus import resolve_gpu_name

    with pytest.raises(TunecostError, match=message):
        estimate_multi_gpu(
            job,
            gpus=[resolve_gpu_name("H100").gpu],
            strategies=[strategy],
            num_gpus=num_gpus,
            expert_degree=degree,
        )
