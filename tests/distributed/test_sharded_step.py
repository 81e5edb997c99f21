"""One rank's FSDP2 step on a fake process group: sharded states are exactly 1/N of the model's, and the
collectives are the ones FSDP2's layout implies (hand counts from the tiny configs)."""

from __future__ import annotations

import pytest
from tiny_jobs import tiny_job

from tunecost.distributed.sharded_step import simulate_fsdp_rank
from tunecost.errors import TunecostError
from tunecost.workload.job import FineTuneJob, LoraConfig


def _job(config: str, method: str) -> FineTuneJob:
    return tiny_job(config, method, LoraConfig(rank=8, targets=("attention",)))


def _param_bytes(job: FineTuneJob) -> tuple[int, int]:
    """(all parameter bytes, trainable parameter bytes) of the unsharded model, from the same builder."""
    from tunecost.simulate.prepare import build_prepared

    prepared = build_prepared(job, num_units=None)
    params = list(prepared.model.parameters())
    total = sum(p.numel() * p.element_size() for p in params)
    trainable = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    return total, trainable


@pytest.mark.parametrize("method", ["full", "lora"])
def test_sharded_states_are_one_over_n(method):
    job = _job("tiny-mixtral-2l", method)
    total, trainable = _param_bytes(job)
    for world_size in (2, 4):
        step = simulate_fsdp_rank(job, world_size=world_size, granule_bytes=1)
        # every dim-0 of the tiny config divides by 4, so FSDP2 pads nothing
        assert step.static_bytes["sharded_params"] * world_size == total
        # AdamW: two fp32 states per trainable element, sharded like the parameters
        assert step.static_bytes["optimizer_states"] * world_size == 2 * trainable


def test_collectives_follow_the_fsdp_units():
    """fully_shard on 2 layers + the root = 3 units: each all-gathered in forward and again in backward
    (resharded after forward), and reduce-scattered once; each all-gather moves the unit's whole parameters."""
    job = _job("tiny-mixtral-2l", "full")
    total, _ = _param_bytes(job)
    step = simulate_fsdp_rank(job, world_size=2, granule_bytes=1)
    totals = step.collective_totals()
    num_units = 2 + 1
    assert totals[("all_gather", "forward")] == (num_units, total)
    assert totals[("all_gather", "backward")] == (num_units, total)
    assert totals[("reduce_scatter", "backward")] == (num_units, total)
    assert all(c.group_size == 2 and c.dtype == "float32" for c in step.collectives)


def test_lora_reduce_scatters_only_trainable_gradients():
    job = _job("tiny-mixtral-2l", "lora")
    total, trainable = _param_bytes(job)
    step = simulate_fsdp_rank(job, world_size=2, granule_bytes=1)
    totals = step.collective_totals()
    assert totals[("all_gather", "forward")][1] == total  # frozen weights are sharded and gathered too
    num_calls, nbytes = totals[("reduce_scatter", "backward")]
    assert nbytes == trainable
    assert num_calls == 2  # the LoRA factors live in the 2 layers; the root unit has no trainable parameter


def test_peak_breakdown_adds_up():
    step = simulate_fsdp_rank(_job("tiny-llama-2l", "full"), world_size=2, granule_bytes=1)
    assert sum(step.breakdown_bytes.values()) == step.peak_bytes
    assert step.breakdown_bytes["unsharded_params"] > 0


def test_qlora_is_refused_with_the_reason(config_path):
    job = FineTuneJob(model=config_path("tiny-mixtral-2l"), method="qlora")
    with pytest.raises(TunecostError, match="quant storage"):
        simulate_fsdp_rank(job, world_size=2)


def test_unknown_strategy():
    with pytest.raises(TunecostError, match="unknown FSDP strategy"):
        simulate_fsdp_rank(_job("tiny-llama-2l", "full"), world_size=2, strategy="zero7")


def test_forward_all_gathers_name_their_layer():
    step = simulate_fsdp_rank(_job("tiny-llama-2l", "full"), world_size=2, granule_bytes=1)
    forward = [c.layer for c in step.collectives if c.phase == "forward"]
    assert forward == [None, 0, 1]  # the root unit (embedding, norm, head) first, then the layers in order
