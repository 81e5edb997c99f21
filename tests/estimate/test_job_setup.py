"""The throughput `estimate` prices is the job's own: its checkpointing, LoRA, precision and storage reach the step
counts, and eq. (2) (fitted on the paper's setup) answers only for that setup."""

from __future__ import annotations

import dataclasses

import pytest

from tunecost.errors import TunecostError
from tunecost.estimate import calibrated
from tunecost.estimate.estimators import other_setup, paper_estimator, paper_throughput
from tunecost.estimate.throughput.coverage import SETUP_FIELDS
from tunecost.estimate.throughput.targets import job_for
from tunecost.workload.job import LoraConfig


def _target(req, batch: int = 2):
    return calibrated.request_target(req, batch)


def _with(req, **changes):
    """`req` with its job changed."""
    return dataclasses.replace(req, job=req.job.with_(**changes))


@pytest.fixture
def llama(make_request):
    """Llama-3.1-8B LoRA on an H100 at 1024 tokens, tunecost's defaults: checkpointing, LoRA on attention and MLP."""
    return make_request("H100", model="meta-llama/Llama-3.1-8B", method="lora", experts_per_token=None, seq_len=1024)


def test_the_target_trains_as_the_job_does(llama) -> None:
    req = _with(llama, gradient_checkpointing=False, lora=LoraConfig(rank=64, targets=("attention",)))
    target = _target(req)
    for name in SETUP_FIELDS:
        assert getattr(target.job, name) == getattr(req.job, name), name
    assert target.job.batch_size == 2


def test_checkpointing_and_lora_change_the_counts(llama) -> None:
    """Without recompute the forward runs once less; LoRA on the dense model's projections adds its matmuls (the
    target used to keep the MoE default targets, which a dense model does not have, and the paper's checkpointing)."""
    assert llama.job.gradient_checkpointing and llama.job.lora.targets == ("attention", "mlp")
    off = _with(llama, gradient_checkpointing=False)
    on_counts, off_counts = job_for(_target(llama))[1], job_for(_target(off))[1]
    assert on_counts.flops_by_class["lora"] > 0
    # the frozen projections run forward, recompute and grad-input: 3 passes with checkpointing, 2 without
    assert on_counts.flops_by_class["dense_matmul"] == pytest.approx(1.5 * off_counts.flops_by_class["dense_matmul"])
    model = calibrated.calibrated_model()
    assert model.predict(_target(off)).queries_per_s > 1.2 * model.predict(_target(llama)).queries_per_s


def test_a_setup_the_calibration_never_ran_is_a_workload_not_calibrated(make_request) -> None:
    """Mixtral QLoRA as the paper ran it is calibrated; without checkpointing it is not, and says so."""
    req = make_request("A100-80GB-SXM", batch_size=4)
    model = calibrated.calibrated_model()
    paper = model.predict(_target(req, 4))
    off = model.predict(_target(_with(req, gradient_checkpointing=False), 4))
    assert not any("setup" in r for r in paper.extrapolation_reasons)
    assert any(r.startswith("setup no checkpointing, bf16, nf4 + double quant") for r in off.extrapolation_reasons)
    assert "workload not calibrated" in off.interval_kinds and "workload not calibrated" not in paper.interval_kinds
    assert off.queries_per_s > paper.queries_per_s


def test_eq2_answers_only_for_the_setup_it_was_fitted_on(make_request) -> None:
    req = make_request("A40", batch_size=4)
    assert other_setup(req) is None
    assert paper_throughput(req, 4)[0] is not None
    rank8 = _with(req, lora=LoraConfig(rank=8, alpha=16, targets=req.job.lora.targets))
    qps, notes = paper_throughput(rank8, 4)
    assert qps is None and "LoRA r8" in notes[0] and "LoRA r16" in notes[0]
    with pytest.raises(TunecostError, match="fitted on its own setup"):
        paper_estimator(rank8)


def test_eager_attention_scores_every_pair_and_moves_the_scores(llama) -> None:
    """transformers' eager attention: the full L x L product (no causal skip) in two matmuls forward and four
    backward, and the scores' element-wise traffic (`mixers.EAGER_*`); the fused kernel's causal work otherwise."""
    from tunecost.estimate.throughput.mixers import (
        BWD_BYTES_PER_FWD_BYTE,
        EAGER_BWD_BYTES_PER_SCORE,
        EAGER_FWD_BYTES_PER_SCORE,
        FA2_VARLEN_BYTES_PER_HIDDEN,
    )

    flash_req = _with(llama, gradient_checkpointing=False)
    eager_req = _with(flash_req, attention="eager")
    assert _target(eager_req).job.attention == "eager"
    flash, eager = (job_for(_target(r, 1))[1] for r in (flash_req, eager_req))
    heads, layers, tokens = 32, 32, 1024  # Llama-3.1-8B, batch 1 x 1024
    scores = layers * heads * tokens**2
    assert eager.flops_by_class["attention"] == pytest.approx(3 * 4 * scores * 128)
    assert flash.flops_by_class["attention"] == pytest.approx(3.5 * 2 * layers * tokens**2 * heads * 128)
    extra = eager.bytes_by_class["elementwise"] - flash.bytes_by_class["elementwise"]
    unpad = layers * tokens * FA2_VARLEN_BYTES_PER_HIDDEN * 4096 * (1 + BWD_BYTES_PER_FWD_BYTE)  # flash's only
    assert extra == pytest.approx(scores * (EAGER_FWD_BYTES_PER_SCORE + EAGER_BWD_BYTES_PER_SCORE) - unpad)
    model = calibrated.calibrated_model()
    assert model.predict(_target(eager_req)).queries_per_s < model.predict(_target(flash_req)).queries_per_s


def test_gradient_accumulation_runs_the_optimizer_once_per_accumulated_micro_batches(llama) -> None:
    """--grad-accum N: N micro-batches of every class but the optimizer's per step, as `validate` prices its rows;
    a full fine-tune's AdamW over every weight is then spread over N micro-batches, the interval's kind unchanged."""
    from tunecost.estimate.throughput.counts import accumulated

    full = _with(llama, method="full", gradient_checkpointing=False)
    one, eight = job_for(_target(full))[1], job_for(_target(_with(full, grad_accum=8)))[1]
    assert eight == accumulated(one, 8)
    assert eight.flops_by_class["optimizer"] == one.flops_by_class["optimizer"] > 0
    assert eight.flops_by_class["dense_matmul"] == 8 * one.flops_by_class["dense_matmul"]
    model = calibrated.calibrated_model()
    single, spread = model.predict(_target(full)), model.predict(_target(_with(full, grad_accum=8)))
    assert spread.queries_per_s > 1.05 * single.queries_per_s
    assert [k for k, _, _ in spread.interval_parts] == [k for k, _, _ in single.interval_parts]
