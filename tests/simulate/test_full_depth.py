"""The caching allocator's reserve at full depth from a trace of two or three units (`simulate.full_depth`): the
traced step made whole equals the step traced whole."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from tunecost.distributed.single_step import trace_single_gpu_step
from tunecost.models.anatomy import layer_pattern
from tunecost.models.catalog import resolve_model
from tunecost.simulate import simulate_step
from tunecost.simulate.allocator import KIND_STEP, event_order, steady_state_replay
from tunecost.simulate.full_depth import full_depth_allocations
from tunecost.simulate.pool import prepared_model
from tunecost.simulate.step_types import AllocationTrace
from tunecost.simulate.trace import trace_step
from tunecost.workload.job import FineTuneJob, LoraConfig

FIXTURES = Path(__file__).parents[1] / "fixtures"
LORA = LoraConfig(rank=4, targets=("attention", "mlp"))


def _job(config: str, method: str, checkpointing: bool) -> FineTuneJob:
    lora = LORA if method != "full" else LoraConfig()
    return FineTuneJob(
        model=str(FIXTURES / config), method=method, lora=lora, batch_size=2, seq_len=64,
        gradient_checkpointing=checkpointing,
    )  # fmt: skip


def _replay(a: AllocationTrace) -> tuple[int, int]:
    columns = (np.asarray(getattr(a, k), dtype=np.int64) for k in ("nbytes", "t_alloc", "t_free", "kind"))
    replay = steady_state_replay(*columns, a.t_optimizer)
    return replay.peak_reserved_bytes, replay.peak_requested_bytes


def _events(a: AllocationTrace) -> list:
    """The step's allocations (bytes) in order, the frees between two allocations as one sorted group (their
    order does not change what the allocator caches)."""
    step = np.flatnonzero(np.asarray(a.kind) == KIND_STEP)
    order, _ = event_order(np.asarray(a.t_alloc)[step], np.asarray(a.t_free)[step])
    out: list = []
    seen: set[int] = set()
    frees: list[int] = []
    for i in step[order].tolist():
        if i in seen:
            frees.append(a.nbytes[i])
            continue
        if frees:
            out.append(tuple(sorted(frees)))
            frees = []
        out.append(a.nbytes[i])
        seen.add(i)
    return out


def _traced(job: FineTuneJob, units: int, stack: str) -> AllocationTrace:
    allocations = trace_step(prepared_model(job.with_(stack=stack), units), job.batch_size, job.seq_len).allocations
    assert allocations is not None
    return allocations


@pytest.mark.parametrize(
    ("config", "method", "checkpointing", "stack", "units"),
    [
        ("distributed/tiny-llama-4l.json", "lora", True, "hf-peft", 2),
        ("distributed/tiny-llama-4l.json", "full", False, "torchtune", 2),  # fused AdamW
        ("distributed/tiny-llama-4l.json", "full", True, "hf-peft", 2),  # foreach AdamW: one op, every layer
        ("simulate/small-mixtral.json", "qlora", True, "hf-peft", 2),
        ("simulate/tiny-deepseek-v2.json", "lora", True, "hf-peft", 2),  # a dense first layer before the units
        ("simulate/tiny-gpt-bigcode.json", "full", True, "hf-peft", 2),
        ("simulate/tiny-blackmamba.json", "full", False, "tunecost", 3),  # the first unit adds no residual
    ],
)
def test_the_traced_step_made_whole_is_the_step_traced_whole(config, method, checkpointing, stack, units) -> None:
    job = _job(config, method, checkpointing)
    prefix, period, full_units = layer_pattern(resolve_model(job.model))
    whole = _traced(job, full_units, stack)
    made = full_depth_allocations(_traced(job, units, stack), prefix, period, units, full_units)
    assert made is not None
    if "mixtral" not in config:  # routed experts: the expert loop's records differ; the replay is the same
        assert _events(made) == _events(whole)
        assert sorted(zip(made.nbytes, made.kind, made.layer, strict=True)) == sorted(
            zip(whole.nbytes, whole.kind, whole.layer, strict=True)
        )
    assert _replay(made) == _replay(whole)


def test_a_first_unit_unlike_the_others_is_not_made_whole_from_two_units() -> None:
    """BlackMamba's first block adds no residual: its ops do not match the second block's, so two units give
    nothing and the simulator traces a third (the next test)."""
    job = _job("simulate/tiny-blackmamba.json", "full", False)
    prefix, period, full_units = layer_pattern(resolve_model(job.model))
    assert full_depth_allocations(_traced(job, 2, "tunecost"), prefix, period, 2, full_units) is None


def test_the_simulated_reserve_is_the_full_depth_replay() -> None:
    """`simulate_step`'s reserve equals the allocator replayed over the step traced whole, where two units give
    it (Llama) and where a third is traced (BlackMamba)."""
    for config, stack in (
        ("distributed/tiny-llama-4l.json", "torchtune"),
        ("simulate/tiny-blackmamba.json", "tunecost"),
    ):
        job = _job(config, "full", False)
        _, _, full_units = layer_pattern(resolve_model(job.model))
        simulated = simulate_step(job.with_(stack=stack), use_cache=False)
        assert simulated.peak_reserved_bytes == _replay(_traced(job, full_units, stack))[0]


def test_the_multi_gpu_step_is_made_whole_by_the_same_rule() -> None:
    """The per-rank models' step (`distributed.single_step`) carries the allocations the simulator replays: made
    whole from a third unit where the first differs (BlackMamba), so both reserves agree."""
    job = dataclasses.replace(_job("simulate/tiny-blackmamba.json", "full", False), stack="tunecost")
    step = trace_single_gpu_step(job, 512)
    whole = AllocationTrace(**step.allocations)
    assert len(whole.forward_ops) == step.num_layers == resolve_model(job.model).num_layers
    assert _replay(whole)[0] == simulate_step(job.with_(stack="tunecost"), use_cache=False).peak_reserved_bytes
