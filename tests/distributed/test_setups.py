"""Step time, cost and the GPU-count search: hand counts of the bytes each strategy moves, and the search's
answers and errors."""

from __future__ import annotations

import dataclasses

import pytest
from tiny_jobs import tiny_job

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.catalog.interconnects import resolve_interconnect
from tunecost.distributed.layouts import valid_gpu_counts
from tunecost.distributed.rank_memory import single_gpu_step
from tunecost.distributed.timing import Links, phase_seconds, step_time
from tunecost.errors import TunecostError
from tunecost.estimate.gpu_search import estimate_multi_gpu
from tunecost.workload.job import LoraConfig
from tunecost.workload.parallel import ParallelPlan

BUSBW = 1e9  # bytes/s, no latency: seconds = bytes x bus factor / 1e9


@pytest.fixture
def tiny():
    job = tiny_job("tiny-mixtral-2l", "full", LoraConfig(rank=8, targets=("attention",)))
    return job, single_gpu_step(job, granule_bytes=1)


def links_at(bus_bandwidth_bytes_per_s: float) -> Links:
    """Every link at one bus bandwidth, no latency; the host's memory too."""
    link = dataclasses.replace(
        resolve_interconnect("NVLink4"), bus_bandwidth_bytes_per_s=bus_bandwidth_bytes_per_s, latency_seconds=0.0
    )
    return Links(node=link, network=link, nics_per_node=1, host=link, host_memory_bytes_per_s=bus_bandwidth_bytes_per_s)


def _links() -> Links:
    return links_at(BUSBW)


@pytest.mark.parametrize(
    ("strategy", "bytes_times_factor"),
    [
        # all-gather every weight in forward and again in backward, reduce-scatter every gradient: (n-1)/n each
        ("fsdp2", lambda s, n: (2 * s.weight_bytes + s.trainable_bytes) * (n - 1) / n),
        ("fsdp2-shard-grad-op", lambda s, n: (s.weight_bytes + s.trainable_bytes) * (n - 1) / n),
        # one all-reduce of every gradient: 2(n-1)/n
        ("ddp", lambda s, n: s.trainable_bytes * 2 * (n - 1) / n),
        # reduce-scatter the gradients, all-gather the updated weights
        ("zero2", lambda s, n: 2 * s.trainable_bytes * (n - 1) / n),
    ],
)
def test_collective_seconds_follow_a_hand_count(tiny, strategy, bytes_times_factor):
    _job, step = tiny
    plan = ParallelPlan(num_gpus=4, strategy=strategy)
    _timed, collectives = step_time(step, plan, _links(), compute_seconds=1.0)
    assert sum(c.total_seconds for c in collectives) == pytest.approx(bytes_times_factor(step, 4) / BUSBW)


@pytest.mark.parametrize(
    ("strategy", "bytes_times_factor"),
    [
        # a micro-batch under no_sync still all-gathers every weight in forward and backward: no reduce-scatter
        ("fsdp2", lambda s, n: 2 * s.weight_bytes * (n - 1) / n),
        ("fsdp1", lambda s, n: 2 * s.weight_bytes * (n - 1) / n),
        ("fsdp2-shard-grad-op", lambda s, n: s.weight_bytes * (n - 1) / n),
        ("ddp", lambda s, n: 0.0),  # DDP's no_sync: no all-reduce
    ],
)
def test_a_micro_batch_under_no_sync_reduces_no_gradient(tiny, strategy, bytes_times_factor):
    _job, step = tiny
    plan = ParallelPlan(num_gpus=4, strategy=strategy)
    timed, collectives = step_time(step, plan, _links(), compute_seconds=1.0, sync_gradients=False)
    assert not any(c.op in ("reduce_scatter", "all_reduce") for c in collectives)
    assert sum(c.total_seconds for c in collectives) == pytest.approx(bytes_times_factor(step, 4) / BUSBW)
    synced, _ = step_time(step, plan, _links(), compute_seconds=1.0)
    assert timed.step_seconds <= synced.step_seconds


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_deepspeed_has_no_no_sync_micro_batch(tiny, strategy):
    _job, step = tiny
    with pytest.raises(TunecostError, match="every micro-batch"):
        step_time(step, ParallelPlan(num_gpus=4, strategy=strategy), _links(), 1.0, sync_gradients=False)


@pytest.mark.parametrize(("strategy", "share"), [("ddp", 1), ("zero1", 1 / 4), ("zero3", 1 / 4), ("fsdp2", 1 / 4)])
def test_a_rank_steps_the_optimizer_over_its_shard(tiny, strategy, share):
    """The throughput model's optimizer seconds (memory-bound, given) shrink to the rank's shard of the states:
    all of them under DDP, 1/N under ZeRO and FSDP; the rest of the compute splits by the simulated FLOPs."""
    _job, step = tiny
    plan = ParallelPlan(num_gpus=4, strategy=strategy)
    timed, _ = step_time(step, plan, _links(), compute_seconds=1.0, optimizer_seconds=0.4)
    assert timed.compute_seconds == pytest.approx(0.6 + 0.4 * share)
    forward, backward, optimizer = phase_seconds(step, 1.0, 0.4)
    flops = step.flops_by_phase
    assert optimizer == 0.4 and forward + backward == pytest.approx(0.6)
    assert forward / 0.6 == pytest.approx(flops["forward"] / (sum(flops.values()) - flops.get("optimizer", 0.0)))


def test_one_gpu_communicates_nothing(tiny):
    _job, step = tiny
    timed, collectives = step_time(step, ParallelPlan(num_gpus=1, strategy="fsdp2"), _links(), compute_seconds=1.0)
    assert collectives == () and timed.step_seconds == pytest.approx(1.0)


def test_gpu_counts_are_within_a_node_or_whole_nodes():
    assert valid_gpu_counts(8, 24) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 24]


@pytest.mark.long  # 13 s: the TP and PP layouts of the tiny Mixtral traced at every probed batch
def test_search_finds_the_smallest_count_and_the_cheapest(tiny):
    job, _step = tiny
    gpu = resolve_gpu_name("H100").gpu
    answer = estimate_multi_gpu(job, gpus=[gpu], strategies=["ddp", "fsdp2"], max_gpus=16, num_queries=100, epochs=1)
    assert answer.smallest_fitting[(gpu.name, "single")].plan.num_gpus == 1  # a tiny model fits one GPU
    best = answer.cheapest
    assert best is not None and all(best.usd <= s.usd for s in answer.setups if s.usd is not None)


def test_a_job_that_fits_no_count_is_an_error(tiny):
    job, _step = tiny
    small = dataclasses.replace(resolve_gpu_name("H100").gpu, memory_gib=0.0001)
    with pytest.raises(TunecostError, match="fits no setup of up to 4 GPUs"):
        estimate_multi_gpu(job, gpus=[small], strategies=["fsdp2"], max_gpus=4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_gpus": 12, "gpus_per_node": 8}, "whole nodes"),
        ({"num_gpus": 8, "strategies": ["zero4"]}, "unknown strategy"),
        ({"num_gpus": 8, "node_link": "carrier-pigeon"}, "interconnect"),
        ({"num_gpus": 8, "node_link": "ndr"}, "links nodes"),
        ({"max_gpus": 0}, "GPU limit"),
    ],
)
def test_bad_setups_are_one_line_errors(tiny, kwargs, message):
    job, _step = tiny
    args = {"gpus": [resolve_gpu_name("H100").gpu], "strategies": ["fsdp2"], **kwargs}
    with pytest.raises(TunecostError, match=message):
        estimate_multi_gpu(job, **args)


def test_rank_memories_come_back_from_disk_without_a_step() -> None:
    from tunecost.estimate.rank_needs import RankNeeds

    job = tiny_job("tiny-mixtral-2l", "lora", LoraConfig(rank=8, targets=("attention",)))
    plans = [ParallelPlan(num_gpus=n, strategy=s) for n in (2, 4) for s in ("ddp", "fsdp2", "zero3")]
    first = RankNeeds(job)
    computed = [first.memory(plan, b) for plan in plans for b in (1, 3)]
    first.flush()
    again = RankNeeds(job)
    assert [again.memory(plan, b) for plan in plans for b in (1, 3)] == computed
    assert not again._steps  # nothing traced or replayed


@pytest.mark.long  # CI runs it (7-15 s of work no other test shares)
def test_a_lora_job_no_data_parallel_layout_holds_is_searched_with_tensor_parallelism():
    """Llama-3.1-8B LoRA at 8192 tokens without checkpointing holds on no data-parallel layout of up to 8 L4s;
    the search then shards its frozen weights and activations with TP (and PP) and says so. A job data
    parallelism holds keeps the data-parallel search."""
    from tunecost.estimate.cost import estimate_job

    job = estimate_job("meta-llama/Llama-3.1-8B", method="lora", seq_len=8192, gradient_checkpointing=False)
    gpus, strategies = [resolve_gpu_name("L4").gpu], ["ddp", "zero3"]
    answer = estimate_multi_gpu(job, gpus=gpus, strategies=strategies, max_gpus=8, num_queries=1000, epochs=1)
    fitting = [s for s in answer.setups if s.fits]
    assert fitting and all(s.plan.tp > 1 for s in fitting)
    assert "no data-parallel layout fits: tensor- and pipeline-parallel layouts searched" in answer.notes
    short = estimate_multi_gpu(job.with_(seq_len=512), gpus=gpus, strategies=strategies, max_gpus=8)
    assert all(s.plan.degree == 1 for s in short.setups)


@pytest.mark.long
def test_at_a_given_count_a_job_no_data_parallel_layout_holds_is_searched_with_tensor_parallelism():
    """The same job on the 8 L4s a user names (`--gpus 8`, no --tp): no data-parallel layout holds it, so the
    model-parallel layouts of those 8 GPUs are searched, and the note says how to name one."""
    from tunecost.estimate.cost import estimate_job

    job = estimate_job("meta-llama/Llama-3.1-8B", method="lora", seq_len=8192, gradient_checkpointing=False)
    gpus, strategies = [resolve_gpu_name("L4").gpu], ["ddp", "zero3"]
    answer = estimate_multi_gpu(job, gpus=gpus, strategies=strategies, num_gpus=8, num_queries=1000, epochs=1)
    assert {s.plan.num_gpus for s in answer.setups} == {8}
    fitting = [s for s in answer.setups if s.fits]
    assert fitting and all(s.plan.tp > 1 or s.plan.pp > 1 for s in fitting)
    assert any(s.plan.degree == 1 and not s.fits for s in answer.setups)  # the data-parallel ones, shown
    note = "no data-parallel layout fits: tensor- and pipeline-parallel layouts searched on the GPUs given"
    assert any(n.startswith(note) for n in answer.notes)


def test_a_model_parallel_group_of_every_gpu_needs_no_data_parallel_strategy() -> None:
    """tp 4 x pp 2 on 8 GPUs (a NeMo config's layout) leaves one data-parallel rank: 'single' is a valid strategy
    there, and the checks before the search let it through."""
    from tunecost.distributed.layouts import checked_counts

    h100 = resolve_gpu_name("H100").gpu
    counts, spec = checked_counts("meta-llama/Llama-2-70b-hf", [h100], ["single"], 8, 8, 8, 1, "none", 8)
    assert counts == {h100.name: [8]} and spec.num_layers == 80
    assert ParallelPlan(num_gpus=8, strategy="single", tp=4, pp=2).dp == 1


def test_a_rank_with_some_layers_recomputed_lies_between_every_layer_and_none() -> None:
    from tunecost.estimate.rank_needs import RankNeeds

    job = tiny_job(
        "tiny-llama-2l", "lora", LoraConfig(rank=8, targets=("attention", "mlp")), gradient_checkpointing=True
    )
    plan = ParallelPlan(num_gpus=2, strategy="fsdp2")
    every = RankNeeds(job).memory(plan, 2)
    none = RankNeeds(job.with_(gradient_checkpointing=False)).memory(plan, 2)
    half = RankNeeds(job.with_(recompute_layers=1)).memory(plan, 2)  # 1 of the 2 layers
    assert every.peak_bytes < half.peak_bytes < none.peak_bytes
    assert half.peak_bytes == round((every.peak_bytes + none.peak_bytes) / 2)
    assert half.peak_reserved_bytes >= half.peak_bytes and "1 of 2 layers recomputed" in half.assumptions[-1]
    assert RankNeeds(job.with_(recompute_layers=2)).memory(plan, 2) == every
