"""FP8 memory on several GPUs (docs/fp8.md): each rank carries the FP8 bytes of the linears it holds, counted
here by hand from the tiny Llama's config (2 layers; hidden 64, 2 key-value heads of 16, intermediate 128)."""

from __future__ import annotations

import dataclasses

import pytest
from tiny_jobs import tiny_job

from tunecost.distributed.model_parallel import stage_steps
from tunecost.distributed.rank_memory import rank_memory
from tunecost.distributed.single_step import single_gpu_step
from tunecost.workload.job import LoraConfig
from tunecost.workload.parallel import ParallelPlan

LAYERS, TOKENS = 2, 2 * 16
# (in, out, column-parallel) of q, k, v, o, gate, up, down
LINEARS = [(64, 64, True), (64, 32, True), (64, 32, True), (64, 64, False)]
LINEARS += [(64, 128, True), (64, 128, True), (128, 64, False)]


def _job(fp8: str = "te-delayed", seq_len: int = 16):
    job = tiny_job("tiny-llama-2l", "full", LoraConfig(rank=8))
    return dataclasses.replace(job, compute_dtype="bf16", fp8=fp8, seq_len=seq_len)


@pytest.fixture(scope="module")
def steps():
    """The steps at 256 tokens, where the activations put the peak in the passes, not the optimizer step."""
    return {f: single_gpu_step(_job(f, 256), granule_bytes=1, use_cache=False) for f in ("none", "te-delayed")}


def test_a_data_parallel_rank_carries_the_fp8_bytes(steps) -> None:
    """Under DDP every rank holds the whole model: TE's two weight copies, its FP8 inputs and the largest
    grad-output's two copies, as on one GPU."""
    step, tokens = steps["te-delayed"], 2 * 256
    assert step.fp8_bytes == {
        "buffers": LAYERS * sum(2 * i * o for i, o, _ in LINEARS),
        "activations": LAYERS * sum(tokens * i for i, _, _ in LINEARS),
        "temporaries": max(2 * tokens * o for _, o, _ in LINEARS),
    }
    plan = ParallelPlan(num_gpus=2, strategy="ddp")
    plain, fp8 = rank_memory(steps["none"], _job("none", 256), plan), rank_memory(step, _job(seq_len=256), plan)
    assert fp8.peak_segment == plain.peak_segment and not fp8.peak_segment.startswith("optimizer")
    assert fp8.peak_bytes - plain.peak_bytes == sum(step.fp8_bytes.values())
    added = fp8.breakdown_bytes["buffers"] - plain.breakdown_bytes.get("buffers", 0)  # beside the rotary buffers
    assert added == step.fp8_bytes["buffers"]


def test_pipeline_stages_split_the_fp8_weight_copies(steps) -> None:
    step = steps["te-delayed"]
    plan = ParallelPlan(num_gpus=2, strategy="ddp", pp=2, micro_batches=2)
    stages = stage_steps(step, plan)
    assert sum(s.fp8_bytes["buffers"] for s in stages.values()) == step.fp8_bytes["buffers"]
    # 1F1B: the first stage holds both micro-batches' inputs of its one layer, the last one micro-batch's
    assert [s.fp8_bytes["activations"] for s in stages.values()] == [
        step.fp8_bytes["activations"],
        step.fp8_bytes["activations"] // 2,
    ]


@pytest.mark.parametrize("fp8_params", [False, True])
def test_a_tensor_parallel_rank_counts_its_shards(fp8_params) -> None:
    """tp 2 with sequence parallelism: each weight copy is half the linear's; a column-parallel linear saves the
    sequence shard of its input (TE's sequence-parallel Linear gathers it again in backward), a row-parallel one
    its feature shard; the grad-output's copies of the largest local output."""
    from tunecost.distributed.tp_single_step import tp_single_gpu_step

    job = dataclasses.replace(_job(), fp8_params=fp8_params)
    step = tp_single_gpu_step(job, tp=2, sequence_parallel=True, granule_bytes=1, use_cache=False)
    elements = LAYERS * sum(i * o // 2 for i, o, _ in LINEARS)
    expected = {
        "buffers": elements if fp8_params else 2 * elements,
        "activations": LAYERS * sum(TOKENS // 2 * i if col else TOKENS * i // 2 for i, _, col in LINEARS),
        "temporaries": max(2 * TOKENS * (o // 2 if col else o) for _, o, col in LINEARS),
    }
    if fp8_params:
        expected["trainable_params"] = -elements  # the bf16 weight held as one FP8 byte per element
    assert step.fp8_bytes == expected
