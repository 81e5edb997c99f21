"""FSDP over fp32 parameters (MixedPrecisionPolicy param_dtype bf16, torchtitan's default): the rank keeps fp32
shards of the parameters, gradients and AdamW states, gathers and computes its layers in bf16; real gloo ranks,
the fake FSDP2 rank and the derivation from the bf16 single-GPU step agree."""

from __future__ import annotations

import pytest
from tiny_jobs import tiny_job

from tunecost.distributed.measure import measure_fsdp_ranks
from tunecost.distributed.rank_memory import rank_memory, rank_segment_bytes, single_gpu_step
from tunecost.distributed.sharded_step import simulate_fsdp_rank
from tunecost.errors import TunecostError
from tunecost.estimate.gpu_search import strategies_holding
from tunecost.estimate.rank_needs import RankNeeds
from tunecost.workload.job import LoraConfig
from tunecost.workload.parallel import ParallelPlan

STATES = ("trainable_params", "gradients", "optimizer_states")


def _jobs(method: str = "full", config: str = "tiny-mixtral-2l"):
    job = tiny_job(config, method, LoraConfig(rank=8, targets=("attention", "mlp"))).with_(compute_dtype="bf16")
    return job, job.with_(fp32_params=True)


@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp2-shard-grad-op"])
def test_fp32_shards_double_the_states_and_keep_the_gathered_layers_bf16(strategy):
    job, fp32 = _jobs()
    bf16_rank = simulate_fsdp_rank(job, world_size=2, strategy=strategy, granule_bytes=1)
    fp32_rank = simulate_fsdp_rank(fp32, world_size=2, strategy=strategy, granule_bytes=1)
    for category in ("sharded_params", "optimizer_states"):
        assert fp32_rank.static_bytes[category] == 2 * bf16_rank.static_bytes[category]
    assert fp32_rank.collective_totals() == bf16_rank.collective_totals()  # gathered and reduced in bf16

    step = single_gpu_step(job, granule_bytes=1)
    plan = ParallelPlan(num_gpus=2, strategy=strategy)
    derived = rank_memory(step, fp32, plan)
    for key, categories in step.segments.items():  # each segment's states twice the bf16 job's, the rest equal
        bf16_bytes = rank_segment_bytes(categories, key, step, job, plan)
        for category, nbytes in rank_segment_bytes(categories, key, step, fp32, plan).items():
            doubled = category in STATES or (category == "temporaries" and key.startswith("optimizer"))
            assert nbytes == (2 if doubled else 1) * bf16_bytes[category], (key, category)
    assert fp32_rank.peak_bytes <= derived.peak_bytes <= 1.10 * fp32_rank.peak_bytes
    assert any("FSDP mixed precision over fp32 parameters" in a for a in derived.assumptions)


def test_lora_keeps_fp32_frozen_shards_beside_its_fp32_factors():
    """LoRA over fp32 frozen weights: the frozen shards twice the bf16 job's, the factors and their AdamW states
    fp32 either way (the factors gathered in bf16 under the policy: the derivation's fp32 gathers over-count)."""
    job, fp32 = _jobs("lora", "tiny-llama-2l")
    plan = ParallelPlan(num_gpus=2, strategy="fsdp2")
    fake = simulate_fsdp_rank(fp32, world_size=2, granule_bytes=1)
    step = single_gpu_step(job, granule_bytes=1)
    derived = rank_segment_bytes(step.segments["optimizer:opt"], "optimizer", step, fp32, plan)
    bf16 = rank_segment_bytes(step.segments["optimizer:opt"], "optimizer", step, job, plan)
    assert derived["frozen_weights"] == 2 * bf16["frozen_weights"]
    assert derived["trainable_params"] == bf16["trainable_params"]
    assert derived["frozen_weights"] + derived["trainable_params"] == fake.static_bytes["sharded_params"]
    assert derived["optimizer_states"] == fake.static_bytes["optimizer_states"]
    assert fake.peak_bytes <= rank_memory(step, fp32, plan).peak_bytes


def test_two_gloo_ranks_measure_the_fake_fp32_rank():
    fp32 = _jobs()[1]
    fake = simulate_fsdp_rank(fp32, world_size=2, granule_bytes=1)
    for real in measure_fsdp_ranks(fp32, world_size=2):
        assert real.peak_bytes == fake.peak_bytes
        assert real.breakdown_bytes == fake.breakdown_bytes
        assert real.collective_totals() == fake.collective_totals()


def test_the_search_prices_fsdp_from_the_compute_dtype_step(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNECOST_CACHE_DIR", str(tmp_path))
    job, fp32 = _jobs()
    plan = ParallelPlan(num_gpus=4, strategy="fsdp2")
    memory = RankNeeds(fp32).memory(plan, fp32.batch_size)
    assert memory == rank_memory(single_gpu_step(job), fp32, plan)
    ddp = ParallelPlan(num_gpus=4, strategy="ddp")  # DDP keeps autocast's step over the fp32 weights
    assert RankNeeds(fp32).memory(ddp, fp32.batch_size) == rank_memory(single_gpu_step(fp32), fp32, ddp)


def test_fp32_parameters_hold_under_ddp_and_fsdp_not_deepspeed():
    full, lora = _jobs()[1], _jobs("lora")[1]
    every = ["ddp", "fsdp2", "fsdp1", "hsdp", "zero2", "zero3"]
    assert strategies_holding(full, every)[0] == ["ddp", "fsdp2", "fsdp1", "hsdp"]
    assert strategies_holding(lora, every)[0] == ["ddp", "fsdp2", "fsdp1", "hsdp"]
    assert strategies_holding(full, every, "params") == (
        [],
        ["--offload params: CPU offload of fp32 parameters is not modelled"],
    )
    for job in (full, lora):
        job.with_(parallel=ParallelPlan(num_gpus=2, strategy="fsdp2"))
    with pytest.raises(TunecostError, match="--fp32-params with layout"):
        full.with_(parallel=ParallelPlan(num_gpus=2, strategy="zero3"))
