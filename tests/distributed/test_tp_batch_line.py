"""A tensor-parallel rank's step read off its batch line (`simulate.batch_line`) equals the step traced at that
batch size (the tiny Llama at 2 layers, TP 2, with and without sequence parallelism)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from tiny_jobs import tiny_job

from tunecost.distributed import tp_single_step
from tunecost.distributed.tp_single_step import tp_single_gpu_step
from tunecost.workload.job import LoraConfig


def _plain(step) -> str:
    return json.dumps(dataclasses.asdict(step), sort_keys=True, default=lambda o: o.tolist())


@pytest.mark.parametrize(("method", "sp"), [("full", True), ("lora", False)])
def test_rank_steps_read_off_the_line_equal_traced_ones(monkeypatch, method, sp) -> None:
    monkeypatch.setattr(tp_single_step, "_LINES", {})
    lora = LoraConfig(rank=8, targets=("attention", "mlp"))
    base = dataclasses.replace(tiny_job("tiny-llama-2l", method, lora), seq_len=32)
    read = 0
    for b in (2, 3, 5, 4):
        job = dataclasses.replace(base, batch_size=b)
        lines = list(tp_single_step._LINES.values())
        read += bool(lines) and all(line.step_at(b) is not None for line, _ in lines)
        got = tp_single_gpu_step(job, tp=2, sequence_parallel=sp, use_cache=False)
        kept = dict(tp_single_step._LINES)
        tp_single_step._LINES.clear()
        traced = tp_single_gpu_step(job, tp=2, sequence_parallel=sp, use_cache=False)
        tp_single_step._LINES.clear()
        tp_single_step._LINES.update(kept)
        assert _plain(got) == _plain(traced), f"batch {b}"
    assert read == 1  # batch 4, after 2, 3 and 5
