"""Throughput validation: the throughput model's step per row, one calibration row per (stack, GPU), skips."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.estimate.throughput.counts import TENSOR_CORE, AnalyticStepCounts
from tunecost.estimate.throughput.lengths import fixed_lengths
from tunecost.estimate.throughput.priors import PRIORS
from tunecost.validate import throughput as tp
from tunecost.validate.corpus import REQUIRED_COLUMNS, CorpusRow
from tunecost.validate.mapping import MappedRow, Skip, map_row
from tunecost.validate.run import validate_rows
from tunecost.validate.summary import throughput_totals

A100 = resolve_gpu_name("A100-80GB-SXM").gpu
FLOPS_PER_TOKEN = 6e9  # made-up micro-batch counts: all work in one large GEMM class
STEP_OVERHEAD_S = PRIORS["step_overhead_s"].centre


def _gemm_only(mapped: MappedRow) -> AnalyticStepCounts:
    """One micro-batch's counts with every FLOP in one GEMM so large that its efficiency is the stack's (no
    bytes, no kernels): the step is FLOPs / (efficiency x achieved rate) + the host time per step."""
    tokens = mapped.job.batch_size * (mapped.job.seq_len or 0)
    return AnalyticStepCounts(
        flops_by_class=MappingProxyType({"dense_matmul": FLOPS_PER_TOKEN * tokens}),
        bytes_by_class=MappingProxyType({}),
        kernels_by_class=MappingProxyType({}),
        gemm_rows_by_class=MappingProxyType({"dense_matmul": 1e15}),
        peak_by_class=MappingProxyType({"dense_matmul": TENSOR_CORE}),
        batch_size=mapped.job.batch_size,
        tokens_per_step=float(tokens),
        lengths=fixed_lengths(mapped.job.seq_len or 1, mapped.job.batch_size),
    )


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


def test_units_round_trip() -> None:
    shape = tp.StepShape(batch=4, seq_len=1000, grad_accum=2)
    assert tp.to_step_seconds("tokens_per_s_per_gpu", 4000.0, shape) == 2.0  # 8000 tokens per step
    assert tp.to_step_seconds("samples_per_s", 4.0, shape) == 2.0  # 8 samples per step
    assert tp.to_step_seconds("s_per_step", 2.0, shape) == 2.0
    # samples per second are the whole job's: 4 GPUs run 4 x 8 samples per step
    assert tp.to_step_seconds("samples_per_s", 16.0, shape._replace(num_gpus=4)) == 2.0
    assert tp.to_step_seconds("tokens_per_s_per_gpu", 4000.0, shape._replace(num_gpus=4)) == 2.0
    for q in ("tokens_per_s_per_gpu", "samples_per_s", "s_per_step"):
        assert tp.from_step_seconds(q, tp.to_step_seconds(q, 3.0, shape), shape) == pytest.approx(3.0)


def test_host_terms_are_the_priors_and_only_the_gemm_efficiency_is_free() -> None:
    params = tp.stack_params(0.5)
    assert params.gemm_efficiency == 0.5
    for name in ("gemm_half_rows", "memory_efficiency", "kernel_overhead_s", "step_overhead_s"):
        assert getattr(params, name) == PRIORS[name].centre


def test_gemm_efficiency_round_trip_on_real_counts() -> None:
    mapped = map_row(_row(0, grad_accum="4", method="full", lora_rank="", lora_targets=""))
    counts = tp.step_counts(mapped)
    terms = tp.gpu_terms(A100)
    measured = tp.step_seconds(counts, terms, 0.55)
    step_of = tp.row_step_fn(mapped, counts, terms, A100)
    assert tp.gemm_efficiency_from(step_of, measured) == pytest.approx(0.55, rel=1e-6)
    fastest = tp.step_seconds(counts, terms, 1.0)
    assert tp.gemm_efficiency_from(step_of, 0.9 * fastest) is None
    said = tp.calibration_failure(step_of, counts, terms, 0.9 * fastest, one_gpu=True)
    assert f"faster than the counts at gemm_efficiency 1 ({fastest:.3g} s, of which" in said
    # a rank's step (its communication, a TP/PP/CP share of the counts) is the row's: the step it was compared with
    rank_step = lambda eff: 0.5 * step_of(eff)  # noqa: E731
    said = tp.calibration_failure(rank_step, counts, terms, 0.4 * fastest, one_gpu=False)
    assert f"faster than the counts at gemm_efficiency 1 ({0.5 * fastest:.3g} s: one rank's step" in said


def test_a_step_is_grad_accum_micro_batches_and_one_optimizer_step() -> None:
    mapped = map_row(_row(0, grad_accum="8"))
    micro, step = tp.micro_batch_counts(mapped), tp.step_counts(mapped)
    assert step.tokens_per_step == 8 * micro.tokens_per_step == 8000
    assert step.flops_by_class["optimizer"] == micro.flops_by_class["optimizer"]
    assert step.flops_by_class["dense_matmul"] == pytest.approx(8 * micro.flops_by_class["dense_matmul"])


def test_one_calibration_row_per_stack_and_gpu_predicts_the_rest() -> None:
    rows = [
        _row(0, seq_len="500", value="2000"),  # fewer tokens per step: predicted
        _row(
            1, batch_size_per_gpu="2", value="3000"
        ),  # most FLOPs (tokens x the same model) per step: the calibration row
        _row(2, batch_size_per_gpu="2", value="9999"),  # a tie in FLOPs: the first in file order calibrates
        _row(3, num_gpus="2", parallelism="pipeline parallel", value="1"),
        _row(4, quantity="time_to_train_s", value="100", unit="s"),
        _row(5, seq_len_kind="max", value="1"),
    ]
    out = validate_rows(rows, counts_fn=_gemm_only)
    cal, pred, tie = out[1], out[0], out[2]
    assert (cal.status, cal.reason, cal.error, cal.predicted) == ("ok", "calibration row", None, 3000.0)
    # by hand: the calibration step (2000 tokens) = 2000 x 6e9 / (eff x rate) + host, so eff x rate follows;
    # the 500-token row then takes 500 x 6e9 / (eff x rate) + host
    cal_step = 2000 / 3000
    rate = 2000 * FLOPS_PER_TOKEN / (cal_step - STEP_OVERHEAD_S)
    step = 500 * FLOPS_PER_TOKEN / rate + STEP_OVERHEAD_S
    assert pred.predicted == pytest.approx(500 / step, rel=1e-6)
    eff = rate / tp.gpu_terms(A100).matmul_flops_per_s
    assert pred.reason == f"gemm_efficiency {eff:.3f} from r1"
    assert pred.error == pytest.approx((pred.predicted - 2000) / 2000 * 100, abs=0.01)
    assert tie.predicted == pytest.approx(3000.0) and tie.error == pytest.approx((3000 - 9999) / 9999 * 100, abs=0.01)
    assert "not modelled (DDP" in out[3].reason and "time_to_train_s" in out[4].reason and "dataset" in out[5].reason
    assert all(r.status == "skipped" and r.predicted is None for r in out[3:])
    totals = throughput_totals(out)
    assert totals["calibration_rows"] == 1 and totals["predicted_rows"] == 2
    assert totals["mape"] == pytest.approx((abs(pred.error) + abs(tie.error)) / 2, abs=0.01)


def test_a_calibration_row_no_efficiency_reproduces_predicts_its_group_at_the_bound() -> None:
    """Faster than the counts at GEMM efficiency 1: every row of the group, the calibration row too, is predicted
    at efficiency 1 with its error, and nothing is recorded as that stack's fitted efficiency."""
    fastest_tokens_per_s = 2000 / (2000 * FLOPS_PER_TOKEN / tp.gpu_terms(A100).matmul_flops_per_s + STEP_OVERHEAD_S)
    small = "Qwen/Qwen2.5-0.5B"  # its real counts keep the row within the GPU's peak (not implausible)
    rows = [
        _row(0, model=small, batch_size_per_gpu="2", value=str(2 * fastest_tokens_per_s)),
        _row(1, model=small, seq_len="500", value="1"),
    ]
    calibrated: list = []
    out = validate_rows(rows, counts_fn=_gemm_only, calibrated=calibrated)
    assert calibrated == []
    cal, other = out
    assert cal.status == other.status == "ok" and not cal.prior
    assert cal.predicted == pytest.approx(fastest_tokens_per_s, rel=1e-6) and cal.error == pytest.approx(-50.0)
    assert other.error is not None and other.error > 0
    for r in out:
        assert r.reason.startswith("gemm_efficiency at its bound 1, none fitted: no efficiency reproduces r0, the")
        assert "calibration row of hf-trainer" in r.reason and "faster than the counts at gemm_efficiency 1" in r.reason


def test_exactly_one_calibration_row_per_stack_and_gpu() -> None:
    plugin = "hf-transformers+peft+accelerate (accelerated-peft-bnb plugin)"
    rows = [
        _row(0, value="3000"),
        _row(1, seq_len="2000", value="3000"),
        _row(2, gpu="H100", value="6000"),
        _row(3, gpu="H100", seq_len="500", value="6000"),
        _row(4, method="qlora", quantization="bnb-nf4", value="2000"),
        _row(5, method="qlora", quantization="bnb-nf4", seq_len="2000", value="2000"),
        _row(6, method="qlora", quantization="bnb-nf4", stack=plugin, value="2500"),  # a plugin: its own stack
        _row(7, method="qlora", quantization="bnb-nf4", stack=plugin, seq_len="500", value="2500"),
    ]
    out = validate_rows(rows, counts_fn=_gemm_only)
    calibration = [r.id for r in out if r.reason == "calibration row"]
    assert calibration == ["r1", "r2", "r5", "r6"]  # one per (stack, GPU): the most FLOPs, first on a tie
    assert all(r.status == "ok" for r in out)
    assert {r.reason.split(" from ")[1] for r in out if r.error is not None} == {"r1", "r2", "r5", "r6"}


def test_unmodelled_settings_are_skipped_and_a_failed_calibration_shown_at_its_bound() -> None:
    rows = [
        _row(0, value="3000"),
        _row(1, stack="torchtune", stack_versions="activation offload", grad_ckpt="off", value="3000"),
        _row(2, stack="torchtune", stack_versions="activation offload", num_gpus="2", parallelism="ddp", value="3000"),
        _row(3, attention="eager", value="3000"),
        _row(4, stack="hf-transformers+peft (Qwen finetune.py)", method="full", value="3000"),
        # faster than any efficiency allows these counts, within the GPU's peak for a 0.5B model's real ones
        _row(5, stack="swift 2.x (hf-transformers+peft)", model="Qwen/Qwen2.5-0.5B", value="50000"),
        _row(6, gpu="no-such-gpu", value="1"),
        _row(7, stack="swift 2.x (hf-transformers+peft)", value="1e12"),  # beyond any GPU
    ]
    out = validate_rows(rows, counts_fn=_gemm_only)
    # alone in its (stack, GPU), row 0 is predicted with its family's prior (the shipped corpus's other stacks)
    assert out[0].prior and out[0].reason.startswith("stack prior gemm_efficiency") and out[0].error is not None
    expected = {
        1: "activation offload without gradient checkpointing not modelled",
        2: "activation offload on several GPUs not modelled",
        3: "eager attention not modelled",
        4: "full fine-tune under stack qwen-finetune not modelled",
        6: "not in the GPU catalog",
        7: "implausible: 1e12 tokens/s is",
    }
    for i, words in expected.items():
        assert out[i].status == "skipped" and words in out[i].reason and out[i].predicted is None, out[i]
    # no efficiency reproduces row 5 (alone in its group: its family's prior predicts it, and the reason says
    # the row is faster than the counts at any efficiency); shown with its error, not skipped
    assert out[5].status == "ok" and out[5].error is not None and out[5].error < 0 and out[5].prior
    assert "faster than the counts at gemm_efficiency 1" in out[5].reason


def test_a_row_alone_on_its_gpu_takes_its_stacks_efficiency_calibrated_on_another() -> None:
    """The efficiency is a fraction of each GPU's achieved rates: a stack's row alone on an H100 is predicted at
    the efficiency the file calibrated for that stack on an A100, before the shipped corpus's (borrowed from
    outside its group: of the prior's kind); the same row under a stack calibrated nowhere takes its family's
    prior."""
    rows = [_row(0, value="3000"), _row(1, batch_size_per_gpu="2", value="3200"), _row(2, gpu="H100", value="6000")]
    out = validate_rows(rows, counts_fn=_gemm_only)
    calibrated = [r for r in out if r.reason == "calibration row"]
    assert [r.id for r in calibrated] == ["r1"] and out[2].prior and out[2].error is not None
    assert "calibrated on A100-80GB-SXM (no calibration row on H100-80GB-SXM)" in out[2].reason
    alone = validate_rows(
        [_row(2, gpu="H100", stack="swift 2.x (hf-transformers+peft)", value="6000")], counts_fn=_gemm_only
    )
    assert alone[0].prior and alone[0].reason.startswith("stack prior gemm_efficiency")


def test_bad_values_and_a_gpu_without_achieved_rates_are_skipped_not_raised(monkeypatch) -> None:
    from tunecost.errors import TunecostError

    rows = [_row(0, value="nan"), _row(1, value="inf"), _row(2, value="-3")]
    out = validate_rows(rows, counts_fn=_gemm_only)
    assert all(r.status == "skipped" and "finite number > 0" in r.reason for r in out)

    def no_rates(gpu):
        raise TunecostError(f"{gpu.name}: no achieved matmul/bandwidth values")

    monkeypatch.setattr(tp, "gpu_terms", no_rates)
    (row,) = validate_rows([_row(3, value="3000")], counts_fn=_gemm_only)
    assert row.status == "skipped" and "no achieved matmul/bandwidth values" in row.reason


def _fsdp(i: int, num_gpus: int, **cells: str) -> CorpusRow:
    return _row(i, num_gpus=str(num_gpus), parallelism="fsdp (FULL_SHARD)", **cells)


def test_a_multi_gpu_row_is_its_single_gpu_step_plus_the_communication_compute_does_not_hide() -> None:
    """A row on several GPUs is predicted with the efficiency of its stack's single-GPU rows and never calibrated
    on (here it ties for the most FLOPs per step and comes first), as its own step on one GPU plus the
    communication that compute does not hide."""
    rows = [
        _row(0, value="3000"),
        _fsdp(1, 2, batch_size_per_gpu="4", value="2500"),
        _row(2, batch_size_per_gpu="4", value="2600"),  # the same micro-batch on one GPU: the calibration row
    ]
    out = validate_rows(rows, counts_fn=_gemm_only)
    assert out[2].reason == "calibration row" and out[2].predicted == pytest.approx(2600)
    assert out[1].status == "ok" and out[1].reason.endswith(" from r2") and out[0].reason.endswith(" from r2")
    single_step = 4000 / 2600  # the calibration row's measured step, which its efficiency reproduces
    exposed = tp.exposed_comm_s(map_row(rows[1]), A100, single_step)
    assert exposed > 0
    assert out[1].predicted == pytest.approx(4000 / (single_step + exposed), rel=1e-4)
    assert out[1].error == pytest.approx((out[1].predicted - 2500) / 2500 * 100, abs=0.01)


def test_exposed_communication_per_micro_batch_and_across_nodes() -> None:
    one, two = map_row(_row(0, batch_size_per_gpu="2")), map_row(_fsdp(1, 2, batch_size_per_gpu="2"))
    assert tp.exposed_comm_s(one, A100, 0.1) == 0.0
    per_micro = tp.exposed_comm_s(two, A100, 0.1)
    accumulated = map_row(_fsdp(2, 2, batch_size_per_gpu="2", grad_accum="3"))
    # three micro-batches' all-gathers, one reduce-scatter (the Trainer's no_sync: the next test)
    assert per_micro < tp.exposed_comm_s(accumulated, A100, 0.1) < 3 * per_micro
    node, nodes = map_row(_fsdp(3, 8, batch_size_per_gpu="2")), map_row(_fsdp(4, 16, batch_size_per_gpu="2"))
    assert (node.plan().num_nodes, nodes.plan().num_nodes, nodes.plan().node_size) == (1, 2, 8)
    assert tp.exposed_comm_s(nodes, A100, 0.1) > tp.exposed_comm_s(node, A100, 0.1)  # the network is slower
    with pytest.raises(Skip, match="whole nodes of 8"):
        map_row(_fsdp(5, 12))


def test_a_stack_and_gpu_with_rows_on_several_gpus_only_calibrates_on_its_fewest_gpus() -> None:
    """Without a single-GPU row, the row on the fewest GPUs (the least communication in its step) calibrates, with
    its communication in the step, although the other counts more FLOPs per optimizer step: the efficiency
    reproduces its measured step exactly, and the other GPU count is predicted with it."""
    rows = [_fsdp(0, 4, batch_size_per_gpu="4", value="2400"), _fsdp(1, 2, batch_size_per_gpu="2", value="2500")]
    out = validate_rows(rows, counts_fn=_gemm_only)
    assert out[1].reason == "calibration row" and out[1].predicted == pytest.approx(2500, rel=1e-6)
    assert out[0].status == "ok" and out[0].reason.endswith(" from r1") and out[0].error is not None
    terms = tp.gpu_terms(A100)

    def step_of(row: CorpusRow) -> tp.StepFn:
        mapped = map_row(row)
        return tp.row_step_fn(mapped, tp.step_counts(mapped, _gemm_only), terms, A100, _gemm_only)

    eff = tp.gemm_efficiency_from(step_of(rows[1]), 2000 / 2500)  # 2 x 1000 tokens per GPU per step
    assert eff is not None and step_of(rows[1])(eff) == pytest.approx(2000 / 2500, rel=1e-6)
    mapped = map_row(rows[0])
    assert step_of(rows[0])(eff) > tp.step_seconds(tp.step_counts(mapped, _gemm_only), terms, eff)  # + communication
    assert out[0].predicted == pytest.approx(4000 / step_of(rows[0])(eff), rel=1e-4)


def test_the_trainer_reduces_gradients_once_per_optimizer_step_and_torchtune_every_micro_batch() -> None:
    """Every micro-batch all-gathers the sharded weights in forward and backward; under transformers' Trainer
    (accelerate's no_sync) only the last of an optimizer step reduce-scatters the gradients, while torchtune's
    recipes reduce-scatter every micro-batch. With no compute to hide under, each micro-batch's communication is
    exposed whole."""
    from tunecost.distributed.timing import default_links, step_time

    for stack, no_sync in (("hf-transformers+peft+accelerate", True), ("torchtune", False)):
        one = map_row(_fsdp(0, 2, batch_size_per_gpu="2", method="full", stack=stack))
        four = map_row(_fsdp(1, 2, batch_size_per_gpu="2", method="full", stack=stack, grad_accum="4"))
        assert four.stack.no_sync_accumulation is no_sync
        traced, plan, links = tp.rank_step(one), one.plan(), default_links(A100, 2)
        synced = step_time(traced, plan, links, 0.0)[0].exposed_comm_seconds
        unsynced = step_time(traced, plan, links, 0.0, sync_gradients=False)[0].exposed_comm_seconds
        assert 0 < unsynced < synced
        expected = synced + 3 * unsynced if no_sync else 4 * synced
        assert tp.exposed_comm_s(four, A100, 0.0) == pytest.approx(expected)


def test_a_measurement_beyond_the_gpus_tensor_peak_is_skipped_with_the_reading_that_fails() -> None:
    """Mistral-7B LoRA at 1000 tokens: about 4 x 7.2 GFLOP per token without recomputation, so 100k tokens/s per
    A100 would be ~2.9 PFLOP/s, nine times its 312 TFLOP/s bf16 peak; 3000 tokens/s is within it."""
    from dataclasses import replace

    fast = _row(1, value="100000")
    mapped = map_row(fast)
    assert mapped.job.gradient_checkpointing  # the row says on; the check counts the step without recomputation
    least = tp.step_counts(replace(mapped, job=mapped.job.with_(gradient_checkpointing=False)))
    implied = least.total_flops / tp.to_step_seconds("tokens_per_s_per_gpu", 100000.0, tp.shape_of(mapped))
    assert implied > 2 * A100.bf16_tensor_flops_per_s
    why = tp.beyond_peak(fast, mapped, A100, 100000.0)
    assert why is not None and why.startswith("implausible: 100000 tokens/s is") and "312 TFLOP/s bf16" in why
    assert f"{implied / 1e12:.0f} TFLOP/s per GPU" in why
    assert tp.beyond_peak(_row(2, value="3000"), map_row(_row(2, value="3000")), A100, 3000.0) is None
    rows = validate_rows([fast, _row(4, value="3000"), _row(5, value="2900")], held_out=())
    assert rows[0].status == "skipped" and rows[0].reason.startswith("implausible")
    assert all(r.status == "ok" for r in rows[1:])


def test_activation_offload_copies_run_beside_the_compute(monkeypatch) -> None:
    """With checkpointing, a row under activation offload is its step with the copies of each layer's input to the
    host and back beside it (`activation_offload.with_copies_s`): hidden while the compute is longer."""
    from tunecost.estimate.throughput import activation_offload
    from tunecost.validate.mapping import map_row

    offloaded = {"stack": "torchtune", "stack_versions": "activation offload", "value": "3000"}
    rows = [_row(0, stack="torchtune", value="3000"), _row(1, **offloaded)]
    out = validate_rows(rows, counts_fn=_gemm_only)
    assert [r.status for r in out] == ["ok", "ok"] and out[1].predicted is not None
    mapped = map_row(rows[1])
    assert mapped.behaviour.activation_offload
    monkeypatch.setattr(activation_offload, "copies_seconds", lambda *a: 1e3)  # copies far longer than compute
    monkeypatch.setattr("tunecost.validate.throughput.copies_seconds", lambda *a: 1e3)
    slow = validate_rows(rows, counts_fn=_gemm_only)
    assert slow[1].predicted < out[1].predicted


def test_activation_offload_named_in_the_notes_only_is_skipped_with_where_to_name_it() -> None:
    out = validate_rows([_row(0, stack="torchtune", notes="+activation offload", value="3000")], counts_fn=_gemm_only)
    assert out[0].status == "skipped" and "stack_versions" in out[0].reason


def test_sequences_up_to_seq_len_of_a_catalog_dataset_are_its_lengths_cut_there() -> None:
    """A throughput row whose queries run up to seq_len of a catalog dataset is priced on the dataset's lengths
    cut at seq_len, each batch padded to its longest (as `estimate --dataset D --seq-len L`); a dataset the
    catalog has no lengths for, or tokens per second (padding counted or not), stays skipped."""
    row = _row(0, seq_len="2048", seq_len_kind="max", dataset="gsm8k-train", batch_size_per_gpu="4",
               quantity="samples_per_s", unit="samples/s")  # fmt: skip
    mapped = map_row(row)
    assert mapped.job.seq_len == 2048 and mapped.lengths is not None
    assert 100 < mapped.lengths.padded_len_tokens <= 568  # gsm8k-train's longest query: 561 tokens
    assert "gsm8k" in mapped.note
    counts = tp.micro_batch_counts(mapped)
    fixed = tp.micro_batch_counts(MappedRow(job=mapped.job, stack=mapped.stack, gpu_memory_bytes=None))
    assert counts.total_flops < 0.35 * fixed.total_flops
    for cells in (dict(dataset="a benchmark set"), dict(quantity="tokens_per_s_per_gpu", unit="tokens/s")):
        with pytest.raises(Skip):
            map_row(_row(0, **{**row.cells, **cells}))
