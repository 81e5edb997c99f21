"""The held-out errors behind `tunecost validate`'s intervals: ln(predicted / measured) of every predicted row.

    PYTHONPATH=src .venv/bin/python benchmarks/held_out_errors.py [CORPUS.csv] [--write | --check]

Runs validate on the shipped corpus (default) and prints, per quantity class, the coverage that intervals from the
other sources' errors reach (what `validate` reports). --write stores the errors in
src/tunecost/catalog/data/held_out_errors.csv; --check exits 1 when that file differs from what this run computes.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import math
import sys
from pathlib import Path

from tunecost.catalog.held_out_errors import COLUMNS, HELD_OUT_ERRORS_PATH, HeldOutError
from tunecost.io import atomic_write_text
from tunecost.validate import read_corpus, validate_rows
from tunecost.validate.intervals import has_interval, quantity_class, with_intervals
from tunecost.validate.run import interval_coverage

COMMAND = "PYTHONPATH=src .venv/bin/python benchmarks/held_out_errors.py --write"


def held_out(corpus: list[Path] | None) -> list[HeldOutError]:
    rows = validate_rows(read_corpus(corpus), held_out=())
    return [
        HeldOutError(
            source=r.source,
            id=r.id,
            quantity=r.quantity,
            stack=r.stack,
            log_error=round(math.log(r.predicted / r.measured), 6),
        )
        for r in rows
        if has_interval(r) and r.measured and r.predicted
    ]


def csv_text(errors: list[HeldOutError], as_of: str) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    for e in errors:
        writer.writerow([e.source, e.id, e.quantity, e.stack, f"{e.log_error:.6f}", COMMAND, as_of])
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
    errors = held_out(args.corpus or None)
    rows = with_intervals(validate_rows(read_corpus(args.corpus or None), held_out=()), errors)
    for kind in sorted({quantity_class(r.quantity) for r in rows if r.inside is not None}):
        cover = interval_coverage(r for r in rows if quantity_class(r.quantity) == kind)
        print(
            f"{kind:22s} rows {cover['with_interval']:4d}  inside {cover['inside']:4d}  "
            f"coverage {cover['coverage_pct']} %  median half-width {cover['median_halfwidth_pct']} %"
        )
    text = csv_text(errors, datetime.date.today().isoformat())
    if args.check:
        current = HELD_OUT_ERRORS_PATH.read_text() if HELD_OUT_ERRORS_PATH.is_file() else ""
        if _without_dates(current) != _without_dates(text):
            print(f"{HELD_OUT_ERRORS_PATH} is out of date: run {COMMAND}", file=sys.stderr)
            return 1
        print(f"{HELD_OUT_ERRORS_PATH}: current ({len(errors)} errors)")
    if args.write:
        atomic_write_text(HELD_OUT_ERRORS_PATH, text)
        print(f"wrote {len(errors)} errors to {HELD_OUT_ERRORS_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
