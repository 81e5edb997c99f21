"""A loop of like iterations sampled by the recorder (`simulate.loops`: Liger's loss chunks and row blocks) leaves
the record the whole loop leaves: every storage's bytes and lifetime, every op's segment, the same counts."""

from __future__ import annotations

import dataclasses

import pytest
from tiny_models import write_llama_config

from tunecost.simulate import loops
from tunecost.simulate.behaviour import LOSS_TRL_CHUNKED, TRL_CHUNK_TOKENS, StackBehaviour
from tunecost.simulate.prepare import build_prepared
from tunecost.simulate.trace import trace_step
from tunecost.workload.job import FineTuneJob, LoraConfig


@pytest.mark.parametrize(("method", "batch", "seq", "act"), [("full", 3, 41, "silu"), ("lora", 2, 32, "gelu")])
def test_a_sampled_loop_leaves_the_record_of_the_whole_loop(tmp_path, monkeypatch, method, batch, seq, act) -> None:
    path = write_llama_config(
        tmp_path / "llama.json", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=4096, hidden_act=act,
    )  # fmt: skip
    lora = LoraConfig(rank=4, alpha=8, targets=("attention", "mlp"))
    job = FineTuneJob(model=str(path), method=method, lora=lora, seq_len=seq, batch_size=batch, liger_kernel=True)
    repeated: list[bool] = []
    real = loops._repeat
    monkeypatch.setattr(loops, "_repeat", lambda *args: repeated.append(real(*args)) or repeated[-1])
    sampled = trace_step(build_prepared(job.with_(stack="hf-peft"), num_units=None), batch, seq)
    assert repeated and all(repeated)  # the chunks, each norm's and MLP's row blocks
    monkeypatch.setattr(loops, "MIN_COUNT", 10**9)
    whole = trace_step(build_prepared(job.with_(stack="hf-peft"), num_units=None), batch, seq)
    assert dataclasses.replace(sampled, seconds=0.0) == dataclasses.replace(whole, seconds=0.0)


@pytest.mark.parametrize(("method", "ckpt"), [("full", True), ("lora", False)])
def test_trls_sampled_loss_chunks_and_their_backward_leave_the_whole_record(
    tmp_path, monkeypatch, method, ckpt
) -> None:
    """TRL's chunked_nll: 8 checkpointed chunks (the last partial), forward and the backward that recomputes them."""
    path = write_llama_config(
        tmp_path / "llama.json", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
    )  # fmt: skip
    lora = LoraConfig(rank=4, alpha=8, targets=("attention",))
    job = FineTuneJob(model=str(path), method=method, lora=lora, seq_len=600, batch_size=3, gradient_checkpointing=ckpt)
    trl = StackBehaviour(loss_code=LOSS_TRL_CHUNKED)
    assert -(-3 * 599 // TRL_CHUNK_TOKENS) == 8
    repeated: list[tuple[str, bool]] = []
    real = loops._alike
    monkeypatch.setattr(loops, "_alike", lambda rec, *a: repeated.append((rec.phase, real(rec, *a))) or repeated[-1][1])
    sampled = trace_step(build_prepared(job.with_(stack="hf-peft"), num_units=None, behaviour=trl), 3, 600)
    assert repeated == [("forward", True), ("backward", True)]
    monkeypatch.setattr(loops, "MIN_COUNT", 10**9)
    whole = trace_step(build_prepared(job.with_(stack="hf-peft"), num_units=None, behaviour=trl), 3, 600)
    assert dataclasses.replace(sampled, seconds=0.0) == dataclasses.replace(whole, seconds=0.0)


def test_a_backward_that_differs_traces_the_step_whole(tmp_path, monkeypatch) -> None:
    path = write_llama_config(
        tmp_path / "llama.json", hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
    )  # fmt: skip
    job = FineTuneJob(model=str(path), method="full", seq_len=600, batch_size=3)
    trl = StackBehaviour(loss_code=LOSS_TRL_CHUNKED)
    real, asked = loops._alike, []
    monkeypatch.setattr(
        loops, "_alike", lambda rec, *a: asked.append(rec.phase) or (rec.phase != "backward" and real(rec, *a))
    )
    retried = trace_step(build_prepared(job.with_(stack="hf-peft"), num_units=None, behaviour=trl), 3, 600)
    assert asked == ["forward", "backward"]  # sampled, differed, traced again whole
    monkeypatch.setattr(loops, "MIN_COUNT", 10**9)
    whole = trace_step(build_prepared(job.with_(stack="hf-peft"), num_units=None, behaviour=trl), 3, 600)
    assert dataclasses.replace(retried, seconds=0.0) == dataclasses.replace(whole, seconds=0.0)


def test_iterations_that_differ_run_whole() -> None:
    class Rec:  # a recorder whose third iteration adds an op the second did not
        phase, resized, t, records, op_segments, op_layers = "forward", False, 0, [], [], []
        counter = type("C", (), {"log": None, "add": lambda *a: None})()

    rec = Rec()
    seen = []
    for i in loops.recorded_loop(rec, 8):
        seen.append(i)
        rec.t += 2 if i == 2 else 1
        rec.op_segments += [("forward:post",)] * (2 if i == 2 else 1)
        rec.op_layers += [-1] * (2 if i == 2 else 1)
    assert seen == list(range(8))
