"""`tunecost validate`: tunecost's predictions beside published measurements, row by row, with the accuracy."""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path
from typing import Annotated

import typer

from tunecost.cli.common import cli_errors, console, print_json, print_table
from tunecost.cli.options import JsonOut, opt
from tunecost.io import atomic_write_text
from tunecost.results.records import read_records, save_validation_records


def rows_csv(records: list[dict]) -> str:
    """The output columns of validation records as CSV (empty cells for missing values)."""
    from tunecost.validate import OUTPUT_COLUMNS

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(OUTPUT_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for r in records:
        writer.writerow({k: "" if r.get(k) is None else r[k] for k in OUTPUT_COLUMNS})
    return buf.getvalue()


def _fmt(v: object) -> str:
    return "" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def _print_skipped(rows) -> None:
    """The rows not modelled, by reason: how many, a few of their ids."""
    ids: dict[str, list[str]] = {}
    for r in rows:
        if r.status == "skipped":
            ids.setdefault(r.reason, []).append(r.id)
    if not ids:
        print("Rows skipped: none")
        return
    ordered = sorted(ids.items(), key=lambda kv: -len(kv[1]))
    print_table("Rows skipped", ["rows", "ids", "reason"], [[len(v), _first(v), k] for k, v in ordered])


def _first(ids: list[str], shown: int = 3) -> str:
    """A few of the ids, and how many more (every one with --json or --out)."""
    return ", ".join(ids[:shown]) + (f" +{len(ids) - shown}" if len(ids) > shown else "")


def _pct(v: float | None) -> str:
    """A percentage in a sentence; "n/a" where no row gives one."""
    return "n/a" if v is None else f"{v:g} %"


@cli_errors
def validate(
    files: Annotated[
        list[Path] | None, typer.Argument(help="Measurement CSV files in the corpus columns (default: shipped).")
    ] = None,
    json_out: JsonOut = False,
    out: Annotated[
        Path | None,
        opt("--out", "Run directory: add the rows as records (validation.jsonl, validation.csv) for `report`."),
    ] = None,
    force: Annotated[bool, opt("--force", "Replace rows of the same id and quantity already in --out.")] = False,
) -> None:
    """Run tunecost's estimators on every measurement they can model: each prediction beside its measurement,
    the rows skipped with their reason, and the accuracy per quantity and per stack."""
    from tunecost.outputs import check_output_folder
    from tunecost.validate import read_corpus, validate_rows

    if out is not None:
        check_output_folder(out, own=(("validation.csv", "validation.jsonl"),))
    rows = validate_rows(read_corpus(list(files) if files else None))
    if out is not None:
        path = save_validation_records(out, rows, command=sys.argv, force=force)
        atomic_write_text(out / "validation.csv", rows_csv(read_records(path)))
    if json_out:
        print_json([r.as_output() for r in rows])
        return
    _print_tables(rows)


def _print_tables(rows) -> None:
    """The predictions beside the measurements, the rows skipped, the accuracy per quantity and stack, the totals."""
    from tunecost.validate.summary import memory_totals, summarize, throughput_totals

    print_table(
        "Predictions beside measurements (modelled rows; every row with --json or --out)",
        ["id", "quantity", "measured", "predicted", "95 % interval", "unit", "error"],
        [
            [r.id, r.quantity, _fmt(r.measured), _fmt(r.predicted), _interval(r), r.unit, _fmt(r.error)]
            for r in rows
            if r.status == "ok"
        ],
        caption=(
            "error column: signed % for memory and throughput ((predicted - measured) / measured); for oom, "
            "predicted - measured (predicted 1: does not fit); interval: from held-out errors of the shipped "
            "corpus, the row's own left out (* : the measurement lies outside)"
        ),
    )
    _print_skipped(rows)
    print_table(
        "Accuracy per quantity and stack",
        [
            "quantity",
            "stack",
            "rows",
            "modelled",
            "median |error| %",
            "within 10 %",
            "oom right",
            "inside 95 %",
            "median ± %",
        ],
        [
            [
                s.quantity,
                s.stack,
                s.rows,
                s.modelled,
                _fmt(s.median_abs_pct_error),
                _fmt(s.within_10pct),
                _fmt(s.right),
                f"{s.inside} of {s.with_interval}" if s.with_interval else "",
                _fmt(s.median_halfwidth_pct),
            ]
            for s in summarize(rows)
        ],
    )
    t = memory_totals(rows)
    console.print(
        f"memory rows modelled: {t['memory_rows_modelled']} of {t['memory_rows']}; peak memory median |error| "
        f"{_pct(t['peak_median_abs_pct_error'])} over {t['peak_rows_modelled']} rows; fits/out-of-memory "
        f"verdict right on {t['verdict_right']} of {t['verdict_rows']} rows that state one (fits on "
        f"{t['fits_right']} of the {t['ran_rows_modelled']} peak rows that ran, out of memory on {t['oom_right']} "
        f"of {t['oom_rows_modelled']} oom rows)"
    )
    console.print(
        f"with the commands' {100 * float(t['margin_fraction'] or 0):g} % safety margin on reserved + CUDA context: "
        f"{t['oom_fit_with_margin']} of the {t['oom_rows_modelled']} out-of-memory rows called a fit "
        f"({t['oom_borderline']} borderline); {t['ran_not_fit_with_margin']} of the {t['ran_rows_modelled']} runs "
        f"called out of memory ({t['ran_borderline']} borderline)"
    )
    th = throughput_totals(rows)
    console.print(
        f"throughput: mean |error| {_pct(th['mape'])} over {th['predicted_rows']} predicted rows of "
        f"{th['throughput_rows']}; {th['calibration_rows']} calibration rows (one per stack and GPU) not counted"
    )
    for name, prefix, totals in (("throughput", "interval_", th), ("peak memory", "peak_interval_", t)):
        if totals[f"{prefix}with_interval"]:
            console.print(
                f"{name} 95 % intervals: {totals[f'{prefix}inside']} of {totals[f'{prefix}with_interval']} "
                f"measurements inside ({_pct(totals[f'{prefix}coverage_pct'])}), median half-width "
                f"{_pct(totals[f'{prefix}median_halfwidth_pct'])}"
            )


def _interval(r) -> str:
    if r.low is None or r.high is None:
        return ""
    return f"{_fmt(r.low)}-{_fmt(r.high)}" + ("" if r.inside else " *")


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
