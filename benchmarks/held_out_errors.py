"""The held-out errors behind `tunecost validate`'s intervals, and the stack efficiencies behind its priors.

    PYTHONPATH=src .venv/bin/python benchmarks/held_out_errors.py [CORPUS.csv] [--write | --check]

Runs validate on the shipped corpus (default): ln(predicted / measured) of every row predicted from its (stack,
GPU) calibration ("calibrated"), and of every throughput row predicted from its family's prior over the other
stacks ("stack prior"), and the GEMM efficiency each group calibrated. Prints the coverage per quantity class.
--write stores src/tunecost/catalog/data/held_out_errors.csv and stack_efficiencies.csv; --check exits 1 when
they differ from what this run computes.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import math
import sys
from pathlib import Path

from tunecost.catalog.held_out_errors import (
    COLUMNS,
    EFFICIENCY_COLUMNS,
    HELD_OUT_ERRORS_PATH,
    MODEL_KINDS,
    STACK_EFFICIENCIES_PATH,
    HeldOutError,
    StackEfficiency,
    quantity_class,
)
from tunecost.io import atomic_write_text
from tunecost.validate import read_corpus, validate_rows
from tunecost.validate.intervals import has_interval, with_intervals
from tunecost.validate.stacks import STACKS
from tunecost.validate.summary import interval_coverage

COMMAND = "PYTHONPATH=src .venv/bin/python benchmarks/held_out_errors.py --write"


def held_out(corpus: list[Path] | None) -> tuple[list[HeldOutError], list[StackEfficiency]]:
    calibrated: list[StackEfficiency] = []
    rows = validate_rows(read_corpus(corpus), held_out=(), calibrated=calibrated)
    # a row alone in its (stack, GPU) is predicted from the prior in both passes: counted once
    from_prior = {(r.id, r.quantity) for r in rows if r.prior}
    prior_rows = [
        r
        for r in validate_rows(read_corpus(corpus), held_out=(), prior_only=True)
        if r.prior and (r.id, r.quantity) not in from_prior
    ]
    errors = [
        HeldOutError(
            source=r.source,
            id=r.id,
            quantity=r.quantity,
            stack=r.stack,
            log_error=round(math.log(r.predicted / r.measured), 6),
            kind="stack prior" if r.prior else "calibrated",
            simulator_stack=(STACKS[r.stack].simulator_stack or "") if r.stack in STACKS else "",
            model_kind=r.model_kind,
        )
        for r in [*rows, *prior_rows]
        if has_interval(r) and r.measured and r.predicted
    ]
    return errors, calibrated


def csv_text(errors: list[HeldOutError], as_of: str) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    for e in errors:
        writer.writerow(
            [
                *(e.source, e.id, e.quantity, e.stack, e.simulator_stack, e.model_kind, e.kind),
                *(f"{e.log_error:.6f}", COMMAND, as_of),
            ]
        )
    return buf.getvalue()


def efficiencies_text(effs: list[StackEfficiency], corpus: str, as_of: str) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(EFFICIENCY_COLUMNS)
    for e in effs:
        writer.writerow([e.stack, e.stack_cell, e.gpu, e.family, f"{e.gemm_efficiency:.4f}", corpus, COMMAND, as_of])
    return buf.getvalue()


def _without_dates(text: str) -> list[str]:
    return [line.rsplit(",", 1)[0] for line in text.splitlines()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", nargs="*", type=Path)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    errors, effs = held_out(args.corpus or None)
    today = datetime.date.today().isoformat()
    corpus = ", ".join(p.name for p in args.corpus) or "shipped corpus"
    rows = with_intervals(validate_rows(read_corpus(args.corpus or None), held_out=()), errors)
    prior_rows = [r for r in validate_rows(read_corpus(args.corpus or None), held_out=(), prior_only=True) if r.prior]
    judged_priors = with_intervals(prior_rows, errors)
    by_model = [(f"stack prior, {k}: ", [r for r in judged_priors if r.model_kind == k]) for k in MODEL_KINDS]
    for label, judged in (("", rows), ("stack prior: ", judged_priors), *by_model):
        for kind in sorted({quantity_class(r.quantity) for r in judged if r.inside is not None}):
            cover = interval_coverage(r for r in judged if quantity_class(r.quantity) == kind)
            print(
                f"{label + kind:30s} rows {cover['with_interval']:4d}  inside {cover['inside']:4d}  "
                f"coverage {cover['coverage_pct']} %  median half-width {cover['median_halfwidth_pct']} %"
            )
    ape = sorted(abs(math.expm1(e.log_error)) for e in errors if e.kind == "stack prior")
    if ape:
        print(f"stack prior: median |error| {100 * ape[len(ape) // 2]:.1f} % over {len(ape)} throughput rows")
    outputs = (
        (HELD_OUT_ERRORS_PATH, csv_text(errors, today)),
        (STACK_EFFICIENCIES_PATH, efficiencies_text(effs, corpus, today)),
    )
    if args.check:
        for path, text in outputs:
            current = path.read_text() if path.is_file() else ""
            if _without_dates(current) != _without_dates(text):
                print(f"{path} is out of date: run {COMMAND}", file=sys.stderr)
                return 1
            print(f"{path}: current")
    if args.write:
        for path, text in outputs:
            atomic_write_text(path, text)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
