"""Per-row 95 % intervals of `validate` from held-out errors (validate/intervals.py, catalog/held_out_errors.py)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from tunecost.catalog.held_out_errors import HeldOutError, held_out_errors, quantity_class
from tunecost.estimate.conformal import conformal_halfwidth
from tunecost.validate.intervals import MIN_STACK_ERRORS, with_intervals
from tunecost.validate.run import ValidationRow
from tunecost.validate.summary import interval_coverage, summarize

ROOT = Path(__file__).resolve().parents[2]


def _row(id: str, source: str, stack: str, measured: float, predicted: float, quantity="tokens_per_s_per_gpu"):
    return ValidationRow(
        id=id,
        quantity=quantity,
        measured=measured,
        predicted=predicted,
        unit="",
        error=round((predicted - measured) / measured * 100, 2),
        status="ok",
        reason="",
        stack=stack,
        source=source,
    )


def _errors(stack: str, source: str, values: list[float], quantity="s_per_step") -> list[HeldOutError]:
    return [
        HeldOutError(source=source, id=f"{source}-{i}", quantity=quantity, stack=stack, log_error=v)
        for i, v in enumerate(values)
    ]


def test_a_validated_stack_takes_its_own_errors_without_the_row() -> None:
    own = _errors("s", "src-a", [0.01 * i for i in range(1, 21)])  # 20 errors, 0.01 .. 0.20
    other = _errors("t", "src-b", [1.0] * 30)
    row = _row("src-a-19", "src-a", "s", 100.0, 100.0 * math.exp(0.2))  # the row of error 0.20 itself
    (got,) = with_intervals([row], own + other)
    # its own error is left out: 19 remain, and error 19 of 19 (0.19) bounds a new one at 95 %
    assert got.high == pytest.approx(round(row.predicted * math.exp(0.19), 4))
    assert got.inside is False and "19 other throughput rows of stack s" in got.interval
    assert quantity_class("s_per_step") == quantity_class("tokens_per_s_per_gpu") == "throughput"


def test_a_stack_with_too_few_rows_takes_the_other_sources_errors() -> None:
    few = _errors("s", "src-a", [0.01] * (MIN_STACK_ERRORS - 1))
    other = _errors("t", "src-b", [0.5] * 25)
    row = _row("x", "src-a", "s", 10.0, 11.0)
    (got,) = with_intervals([row], few + other)
    assert got.low == pytest.approx(round(11.0 * math.exp(-0.5), 4)) and got.inside is True
    assert "of other sources (stack s not validated)" in got.interval
    # the row's own source never sets its interval: with none other, there is none
    (alone,) = with_intervals([row], few)
    assert alone.low is None and alone.inside is None and "no held-out" in alone.interval


def test_oom_skipped_and_calibration_rows_carry_no_interval() -> None:
    errors = _errors("s", "b", [0.1] * 30, quantity="peak_allocated_gib")
    oom = _row("o", "a", "s", 1.0, 0.0, quantity="oom")
    calibration = ValidationRow(
        id="c", quantity="s_per_step", measured=1.0, predicted=1.0, unit="s", error=None, status="ok", reason=""
    )
    assert [r.low for r in with_intervals([oom, calibration], errors)] == [None, None]


def test_coverage_and_summary_count_the_rows_inside() -> None:
    errors = _errors("s", "b", [0.1] * 30, quantity="peak_allocated_gib")
    rows = with_intervals(
        [
            _row("in", "a", "s", 10.0, 10.5, quantity="peak_allocated_gib"),
            _row("out", "a", "s", 10.0, 13.0, quantity="peak_allocated_gib"),
        ],
        errors,
    )
    cover = interval_coverage(rows)
    assert cover["with_interval"] == 2 and cover["inside"] == 1 and cover["coverage_pct"] == 50.0
    assert cover["median_halfwidth_pct"] == pytest.approx(100 * (math.exp(0.1) - 1), abs=0.1)
    summary = next(s for s in summarize(rows) if s.stack == "all")
    assert (summary.with_interval, summary.inside) == (2, 1)


def test_shipped_errors_file_reads_and_covers_each_quantity() -> None:
    errors = held_out_errors()
    assert len(errors) > 200 and len({e.source for e in errors}) >= 3
    assert {quantity_class(e.quantity) for e in errors} >= {"throughput", "peak_allocated_gib", "nvidia_smi_gib"}


@pytest.mark.long
def test_shipped_errors_file_is_what_validate_computes_now() -> None:
    """benchmarks/held_out_errors.py --check: the shipped errors are this version's on the shipped corpus."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "held_out_errors.py"), "--check"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "src"), **__import__("os").environ},
    )
    assert done.returncode == 0, done.stderr
    coverage = {
        line.split("rows")[0].strip(): float(line.split("coverage ")[1].split(" %")[0])
        for line in done.stdout.splitlines()
        if "coverage" in line
    }
    # held out (the row itself, or its source), each quantity's 95 % interval covers 85-99 % of the corpus
    assert coverage and all(85.0 <= c <= 99.0 for c in coverage.values()), coverage


def test_family_prior_is_the_median_of_the_other_stacks_of_the_family() -> None:
    from tunecost.catalog.held_out_errors import StackEfficiency
    from tunecost.estimate.throughput.stack_priors import prior_efficiency, stack_family

    def eff(stack: str, value: float, cell: str = "") -> StackEfficiency:
        return StackEfficiency(
            stack=stack, stack_cell=cell, gpu="A100-80GB-SXM", family=stack_family(stack, cell), gemm_efficiency=value
        )

    pool = [eff("hf-trainer", 0.9), eff("trl-sft-bnb", 0.7), eff("qwen-finetune", 0.04), eff("torchtune", 0.5)]
    got, why = prior_efficiency(pool, "hf-trainer-bnb")  # hf-eager: 0.9, 0.7, 0.04 -> median 0.7
    assert got == pytest.approx(0.7) and "hf-eager, 3 (stack, GPU) groups" in why
    own, _ = prior_efficiency(pool, "trl-sft-bnb")  # its own group left out: sqrt(0.9 x 0.04)
    assert own == pytest.approx(math.sqrt(0.9 * 0.04))
    other, why = prior_efficiency(pool, "unsloth")  # no other fused-kernels stack: every other stack
    assert "every family" in why and other == pytest.approx(math.sqrt(0.5 * 0.7))
    assert stack_family("hf-trainer", "hf + fused-ops-and-kernels plugin") == "fused-kernels"
    assert prior_efficiency([], "hf-trainer") is None


def test_a_prior_row_takes_the_prior_errors() -> None:
    from dataclasses import replace

    errors = _errors("s", "b", [0.05] * 30) + [
        HeldOutError(source="c", id=f"p{i}", quantity="s_per_step", stack="t", log_error=0.6, kind="stack prior")
        for i in range(30)
    ]
    row = replace(_row("x", "a", "s", 10.0, 11.0), prior=True)
    (got,) = with_intervals([row], errors)
    assert got.high == pytest.approx(round(11.0 * math.exp(0.6), 4)) and "family's prior" in got.interval


def test_a_prior_row_takes_the_prior_errors_of_its_kind_of_model() -> None:
    from dataclasses import replace

    def prior(kind: str, value: float, n: int) -> list[HeldOutError]:
        return [
            HeldOutError(
                source="c",
                id=f"{kind}{i}",
                quantity="s_per_step",
                stack="t",
                log_error=value,
                kind="stack prior",
                model_kind=kind,
            )
            for i in range(n)
        ]

    errors = prior("dense", 0.2, 30) + [
        replace(e, log_error=1.5 + 0.02 * (i - 4.5)) for i, e in enumerate(prior("moe", 0, 10))
    ]
    dense = replace(_row("x", "a", "s", 10.0, 11.0), prior=True)
    moe = replace(dense, id="y", model_kind="moe")
    got_dense, got_moe = with_intervals([dense, moe], errors)
    assert got_dense.high == pytest.approx(round(11.0 * math.exp(0.2), 4)) and "30 held-out rows of dense" in (
        got_dense.interval
    )
    assert "10 held-out rows of moe" in got_moe.interval and "mean and spread of 10" in got_moe.interval
    # ten moe rows all predicted 4.5x too fast: the interval lies below the prediction, around 11 / 4.5
    assert got_moe.low < 11.0 * math.exp(-1.5) < got_moe.high < 11.0
    # a kind with fewer than MIN_STACK_ERRORS errors takes every prior row's
    (few,) = with_intervals([moe], prior("dense", 0.2, 30) + prior("moe", 1.5, MIN_STACK_ERRORS - 1))
    assert f"{30 + MIN_STACK_ERRORS - 1} held-out rows predicted" in few.interval


def test_the_shipped_prior_errors_cover_each_kind_of_model() -> None:
    """Each kind's split-conformal quantile covers about 95 % of its own rows, each left out in turn; the MoE rows
    (an eager expert loop the counts miss) no longer widen every dense interval."""
    from tunecost.estimate.throughput.stack_priors import prior_errors

    shipped = [e for e in held_out_errors() if e.kind == "stack prior"]
    widths = {}
    for kind in ("dense", "moe"):
        mine = [e for e in shipped if e.model_kind == kind]
        inside = 0
        for e in mine:
            pool, what = prior_errors(shipped, kind, leave_out=(e.source, e.id))
            assert f"of {kind} models" in what
            inside += abs(e.log_error) <= conformal_halfwidth(pool, what).value
        assert 0.9 <= inside / len(mine) <= 1.0
        widths[kind] = conformal_halfwidth(prior_errors(shipped, kind)[0], "").value
    assert widths["dense"] < conformal_halfwidth([e.log_error for e in shipped], "").value < widths["moe"]


def test_a_simulated_peak_takes_the_published_peaks_of_its_stack() -> None:
    from tunecost.estimate.memory_interval import MIN_STACK_ERRORS, peak_interval_bytes

    published = [e for e in held_out_errors() if e.quantity == "peak_allocated_gib" and e.kind == "calibrated"]
    own = [e for e in published if e.simulator_stack == "hf-peft"]
    assert len(own) >= MIN_STACK_ERRORS
    low, high, basis = peak_interval_bytes("hf-peft", 10 * 2**30)
    assert low < 10 * 2**30 < high and f"{len(own)} published peaks" in basis
    assert math.log(high / (10 * 2**30)) == pytest.approx(math.log(10 * 2**30 / low), abs=1e-6)
    # a stack no published row ran on takes every stack's errors
    _, _, pooled = peak_interval_bytes("no-such-stack", 2**30)
    assert f"{len(published)} published peaks of every stack" in pooled


def test_a_bad_errors_file_is_one_error_naming_the_file_row_and_column(tmp_path) -> None:
    from tunecost.catalog.held_out_errors import COLUMNS
    from tunecost.errors import TunecostError

    path = tmp_path / "errors.csv"
    path.write_text(",".join(COLUMNS) + "\nsrc,1,s_per_step,s,,dense,calibrated,abc,cmd,2026-12-02\n")
    with pytest.raises(TunecostError, match=r"errors.csv: row 2: log_error 'abc' is not a number"):
        held_out_errors(path)
    path.write_text(",".join(COLUMNS) + "\nsrc,1,s_per_step,s,,dense,guessed,0.1,cmd,2026-12-02\n")
    with pytest.raises(TunecostError, match="kind 'guessed' is not one of"):
        held_out_errors(path)
    path.write_text(",".join(COLUMNS) + "\nsrc,1,s_per_step,s,,sparse,calibrated,0.1,cmd,2026-12-02\n")
    with pytest.raises(TunecostError, match="row 2: model_kind 'sparse': dense or moe"):
        held_out_errors(path)
