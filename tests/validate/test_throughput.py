"""Throughput validation: FLOPs per token by hand, unit conversions, one calibration row per (stack, GPU)."""

from __future__ import annotations

import pytest

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.validate.corpus import REQUIRED_COLUMNS, CorpusRow
from tunecost.validate.run import throughput_totals, validate_rows
from tunecost.validate.throughput import (
    ADAMW_BYTES_PER_TRAINED_PARAM,
    ModelCounts,
    StepWork,
    efficiency_from,
    flops_per_token,
    from_step_seconds,
    step_seconds,
    step_work,
    to_step_seconds,
)

COUNTS = ModelCounts(
    matmul_params=1_000_000_000,
    quantizable_params=900_000_000,
    trained_params_full=1_100_000_000,
    hidden_size=1000,
    num_layers=10,
)
A100 = resolve_gpu_name("A100-80GB-SXM").gpu


def test_flops_per_token_by_hand() -> None:
    # attention forward per token: 2 * seq * hidden * layers = 2 * 1000 * 1000 * 10 = 2e7 (causal QK^T and PV)
    assert flops_per_token(COUNTS, method="full", seq_len=1000, gradient_checkpointing=False) == 6e9 + 3 * 2e7
    assert flops_per_token(COUNTS, method="lora", seq_len=1000, gradient_checkpointing=False) == 4e9 + 3 * 2e7
    assert flops_per_token(COUNTS, method="lora", seq_len=1000, gradient_checkpointing=True) == 6e9 + 4 * 2e7
    assert flops_per_token(COUNTS, method="full", seq_len=500, gradient_checkpointing=True) == 8e9 + 4 * 1e7


def test_step_bytes_by_hand() -> None:
    lora = step_work(COUNTS, method="lora", batch=2, seq_len=1000, grad_accum=3, gradient_checkpointing=True)
    assert lora.bytes == 0 and lora.flops == 6000 * (6e9 + 8e7)
    # QLoRA: 0.5 B read + 2 B written per 4-bit parameter, forward + backward + recompute, per micro-batch
    q = step_work(COUNTS, method="qlora", batch=1, seq_len=1000, grad_accum=2, gradient_checkpointing=True)
    assert q.bytes == 2 * 3 * 900_000_000 * 2.5
    full = step_work(COUNTS, method="full", batch=1, seq_len=1000, grad_accum=4, gradient_checkpointing=False)
    assert full.bytes == 1_100_000_000 * ADAMW_BYTES_PER_TRAINED_PARAM == 1_100_000_000 * 28


def test_efficiency_round_trip_and_units() -> None:
    work = StepWork(flops=1e15, bytes=2e11)
    step_s = 1e15 / (0.5 * A100.bf16_tensor_flops_per_s) + 2e11 / A100.mem_bandwidth_bytes_per_s
    assert step_seconds(work, A100, 0.5) == pytest.approx(step_s)
    assert efficiency_from(work, A100, step_s) == pytest.approx(0.5)
    assert efficiency_from(work, A100, 2e11 / A100.mem_bandwidth_bytes_per_s * 0.9) is None  # faster than bytes
    shape = {"batch": 4, "seq_len": 1000, "grad_accum": 2}
    assert to_step_seconds("tokens_per_s_per_gpu", 4000.0, **shape) == 2.0  # 8000 tokens per step
    assert to_step_seconds("samples_per_s", 4.0, **shape) == 2.0  # 8 samples per step
    assert to_step_seconds("s_per_step", 2.0, **shape) == 2.0
    for q in ("tokens_per_s_per_gpu", "samples_per_s", "s_per_step"):
        assert from_step_seconds(q, to_step_seconds(q, 3.0, **shape), **shape) == pytest.approx(3.0)


def _row(i: int, **cells: str) -> CorpusRow:
    base = dict.fromkeys(REQUIRED_COLUMNS, "")
    base.update(
        id=f"r{i}",
        model="mistralai/Mistral-7B-v0.1",
        method="lora",
        lora_rank="8",
        lora_targets="q_proj",
        quantization="none",
        compute_dtype="bf16",
        batch_size_per_gpu="1",
        grad_accum="1",
        seq_len="1000",
        seq_len_kind="packed",
        grad_ckpt="on",
        attention="flash2",
        stack="hf-transformers+peft+accelerate",
        gpu="A100-SXM4-80GB",
        num_gpus="1",
        quantity="tokens_per_s_per_gpu",
        unit="tokens/s",
    )
    base.update(cells)
    return CorpusRow(path="t.csv", line=i + 2, cells=base)


def test_one_calibration_row_per_stack_and_gpu_predicts_the_rest() -> None:
    rows = [
        _row(0, seq_len="500", value="2000"),  # fewer tokens per step: predicted
        _row(1, batch_size_per_gpu="2", value="3000"),  # most tokens per step: the calibration row
        _row(2, batch_size_per_gpu="2", value="9999"),  # a tie in tokens: the first in file order calibrates
        _row(3, num_gpus="2", value="1"),
        _row(4, quantity="time_to_train_s", value="100", unit="s"),
        _row(5, seq_len_kind="max", value="1"),
    ]
    out = validate_rows(rows, counts_fn=lambda mapped: COUNTS)
    cal, pred, tie = out[1], out[0], out[2]
    assert (cal.status, cal.reason, cal.error, cal.predicted) == ("ok", "calibration row", None, 3000.0)
    # LoRA, no bytes: step time is proportional to FLOPs per token, so tokens/s scales with its inverse
    # seq 1000: 6e9 + 4 * 2e7 = 6.08e9 FLOPs/token; seq 500: 6e9 + 4 * 1e7 = 6.04e9
    assert pred.predicted == pytest.approx(3000 * 6.08e9 / 6.04e9, abs=1e-3)
    assert pred.error == pytest.approx((pred.predicted - 2000) / 2000 * 100, abs=0.01)
    assert pred.reason.startswith("efficiency") and "r1" in pred.reason
    assert tie.predicted == pytest.approx(3000.0) and tie.error == pytest.approx((3000 - 9999) / 9999 * 100, abs=0.01)
    assert "multi-GPU" in out[3].reason and "time_to_train_s" in out[4].reason and "dataset" in out[5].reason
    assert all(r.status == "skipped" for r in out[3:])
    totals = throughput_totals(out)
    assert totals["calibration_rows"] == 1 and totals["predicted_rows"] == 2
    assert totals["mape"] == pytest.approx((abs(pred.error) + abs(tie.error)) / 2, abs=0.01)


def test_groups_calibrate_separately_and_a_failed_calibration_skips_its_group() -> None:
    rows = [
        _row(0, value="3000"),
        _row(1, gpu="H100", value="6000"),
        _row(2, stack="swift 2.x (hf-transformers+peft)", value="1e12"),  # efficiency above 1: no calibration
        _row(3, gpu="no-such-gpu", value="1"),
    ]
    out = validate_rows(rows, counts_fn=lambda mapped: COUNTS)
    assert [r.reason for r in out[:2]] == ["calibration row", "calibration row"]
    assert out[2].status == "skipped" and "calibration of swift-2" in out[2].reason
    assert out[3].status == "skipped" and "not in the GPU catalog" in out[3].reason
