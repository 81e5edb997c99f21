"""Each simulated stack's `StackSpec` record (workload/stacks.py) is what the simulator and the option checks act on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunecost.errors import TunecostError
from tunecost.simulate import simulate_step
from tunecost.simulate.checkpointing import reentrant_checkpointing
from tunecost.workload.job import DEFAULT_STACK, STACKS, FineTuneJob, LoraConfig
from tunecost.workload.stacks import STACK_SPECS

TINY_LLAMA_4L = Path(__file__).parents[1] / "fixtures" / "distributed" / "tiny-llama-4l.json"
LORA = LoraConfig(rank=8, targets=("attention", "mlp"))


def _job(stack: str, **changes) -> FineTuneJob:
    fields = {"model": str(TINY_LLAMA_4L), "method": "lora", "seq_len": 16, "lora": LORA, "stack": stack}
    return FineTuneJob(**(fields | changes))


def test_the_named_stacks_are_the_records() -> None:
    assert tuple(STACK_SPECS) == STACKS and DEFAULT_STACK in STACKS
    assert all(name == spec.name for name, spec in STACK_SPECS.items())


@pytest.mark.parametrize("stack", STACKS)
def test_each_stack_runs_as_its_record_says(stack: str) -> None:
    spec = STACK_SPECS[stack]
    sim = simulate_step(_job(stack), use_cache=False)
    assert sim.stack == stack and sim.peak_bytes > 0
    in_dtype = any(a.startswith("LoRA factors in bf16, no autocast") for a in sim.assumptions)
    assert in_dtype == spec.torchtune_recipes
    assert reentrant_checkpointing(_job(stack)) == spec.reentrant_checkpointing
    odd = simulate_step(_job(stack, seq_len=13), use_cache=False)
    assert odd.seq_len == (16 if spec.pads_lengths else 13)


@pytest.mark.parametrize("stack", STACKS)
def test_what_a_stack_cannot_run_is_refused(stack: str) -> None:
    spec = STACK_SPECS[stack]
    if spec.liger:
        _job(stack, liger_kernel=True)
    else:
        with pytest.raises(TunecostError, match="--liger-kernel"):
            _job(stack, liger_kernel=True)
    refusals = (
        (spec.int8_lora, dict(method="qlora", quant_type="int8")),
        (spec.gptq, dict(method="qlora", quant_type="gptq", compute_dtype="fp16")),
        (spec.fp32_qlora, dict(method="qlora", compute_dtype="fp32")),
    )
    for allowed, changes in refusals:
        if not allowed:
            with pytest.raises(TunecostError, match=f"stack {stack}"):
                simulate_step(_job(stack, **changes), use_cache=False)


@pytest.mark.parametrize("stack", [s for s in STACKS if STACK_SPECS[s].checkpointing_note])
def test_a_stack_names_its_checkpointing_only_where_the_job_checkpoints(stack: str) -> None:
    note = STACK_SPECS[stack].checkpointing_note.strip(" ,")
    for checkpointing in (True, False):
        sim = simulate_step(_job(stack, gradient_checkpointing=checkpointing), use_cache=False)
        stack_notes = [a for a in sim.assumptions if a.startswith(f"{stack} stack:")]
        assert len(stack_notes) == 1
        assert (note in stack_notes[0]) == checkpointing
