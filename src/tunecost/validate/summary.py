"""The accuracy of validated rows per quantity and stack: errors, fits/out-of-memory verdicts, interval coverage."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from tunecost.catalog.held_out_errors import THROUGHPUT_QUANTITIES
from tunecost.simulate.batch import default_margin_fraction
from tunecost.validate.mapping import PEAK_MEMORY_QUANTITIES
from tunecost.validate.run import ValidationRow


@dataclass(frozen=True, kw_only=True)
class Summary:
    quantity: str
    stack: str  # "all" for the quantity over every stack
    rows: int
    modelled: int
    median_abs_pct_error: float | None  # memory quantities
    within_10pct: int | None
    right: int | None  # oom: predictions that agree with the measurement
    with_interval: int | None = None  # rows with a 95 % interval
    inside: int | None = None  # of those, measurements inside it
    median_halfwidth_pct: float | None = None  # median of (high / predicted - 1) x 100


def _summary(quantity: str, stack: str, rows: list[ValidationRow]) -> Summary:
    ok = [r for r in rows if r.status == "ok" and r.error is not None]
    if quantity == "oom":
        return Summary(
            quantity=quantity,
            stack=stack,
            rows=len(rows),
            modelled=len(ok),
            median_abs_pct_error=None,
            within_10pct=None,
            right=sum(1 for r in ok if r.error == 0),
        )
    ape = [abs(r.error) for r in ok if r.error is not None]
    cover = interval_coverage(ok)
    return Summary(
        quantity=quantity,
        stack=stack,
        rows=len(rows),
        modelled=len(ok),
        median_abs_pct_error=round(statistics.median(ape), 2) if ape else None,
        within_10pct=sum(1 for e in ape if e <= 10.0) if ape else None,
        right=None,
        with_interval=int(cover["with_interval"] or 0),
        inside=int(cover["inside"] or 0),
        median_halfwidth_pct=cover["median_halfwidth_pct"],
    )


def interval_coverage(rows: Iterable[ValidationRow]) -> dict[str, float | int | None]:
    """How many rows carry an interval, how many measurements lie inside, and the median half-width in % (half the
    interval's width on the log scale: sqrt(high / low) - 1)."""
    judged = [r for r in rows if r.inside is not None]
    widths = [100.0 * (math.sqrt(r.high / r.low) - 1.0) for r in judged if r.high is not None and r.low]
    inside = sum(1 for r in judged if r.inside)
    return {
        "with_interval": len(judged),
        "inside": inside,
        "coverage_pct": round(100.0 * inside / len(judged), 1) if judged else None,
        "median_halfwidth_pct": round(statistics.median(widths), 1) if widths else None,
    }


def summarize(rows: list[ValidationRow]) -> list[Summary]:
    """Per quantity over all stacks, then per (quantity, stack) where a stack was modelled."""
    out = []
    for quantity in sorted({r.quantity for r in rows}):
        of_q = [r for r in rows if r.quantity == quantity]
        out.append(_summary(quantity, "all", of_q))
        for stack in sorted({r.stack for r in of_q if r.stack}):
            out.append(_summary(quantity, stack, [r for r in of_q if r.stack == stack]))
    return out


def throughput_totals(rows: list[ValidationRow]) -> dict[str, float | int | None]:
    """Headline throughput figures: mean absolute % error over the predicted (non-calibration) rows."""
    thr = [r for r in rows if r.quantity in THROUGHPUT_QUANTITIES]
    ape = [abs(r.error) for r in thr if r.status == "ok" and r.error is not None]
    return {
        "throughput_rows": len(thr),
        "calibration_rows": sum(1 for r in thr if r.status == "ok" and r.error is None),
        "predicted_rows": len(ape),
        "mape": round(statistics.fmean(ape), 2) if ape else None,
        "median_abs_pct_error": round(statistics.median(ape), 2) if ape else None,
        "within_30pct": sum(1 for e in ape if e <= 30.0),
        **{f"interval_{k}": v for k, v in interval_coverage(thr).items()},
    }


def memory_totals(rows: list[ValidationRow]) -> dict[str, float | int | None]:
    """Headline figures over every peak-memory row (allocated, reserved, nvidia-smi) and every oom row. The
    fits/out-of-memory verdict counts both kinds of row that state one: a peak row ran (it fit; right when
    tunecost says it fits), an oom row states whether it ran out."""
    mem = [r for r in rows if r.quantity in PEAK_MEMORY_QUANTITIES]
    ape = [abs(r.error) for r in mem if r.status == "ok" and r.error is not None]
    oom = [r for r in rows if r.quantity == "oom"]
    oom_ok = [r for r in oom if r.status == "ok"]
    ran = [r for r in mem if r.status == "ok" and r.fits is not None]
    fits_right = sum(1 for r in ran if r.fits)
    oom_right = sum(1 for r in oom_ok if r.error == 0)
    return {
        "memory_rows": len(mem) + len(oom),
        "memory_rows_modelled": len(ape) + len(oom_ok),
        "peak_rows_modelled": len(ape),
        "peak_median_abs_pct_error": round(statistics.median(ape), 2) if ape else None,
        **{f"peak_interval_{k}": v for k, v in interval_coverage(mem).items()},
        "oom_rows_modelled": len(oom_ok),
        "oom_right": oom_right,
        "ran_rows_modelled": len(ran),
        "fits_right": fits_right,
        "verdict_rows": len(ran) + len(oom_ok),
        "verdict_right": fits_right + oom_right,
        # with the commands' safety margin: out-of-memory rows called a fit, runs called out of memory
        "margin_fraction": default_margin_fraction(),
        "oom_fit_with_margin": sum(1 for r in oom_ok if r.fit == "yes"),
        "oom_borderline": sum(1 for r in oom_ok if r.fit == "borderline"),
        "ran_not_fit_with_margin": sum(1 for r in ran if r.fit == "no"),
        "ran_borderline": sum(1 for r in ran if r.fit == "borderline"),
    }
