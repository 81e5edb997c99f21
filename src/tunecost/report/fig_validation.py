"""How far tunecost's estimates are from published measurements (`tunecost validate --out RUN`): the accuracy
per quantity and stack as a table, and every modelled row's prediction against its measurement."""

from __future__ import annotations

import pandas as pd

from tunecost.report.base import FigureResult, _need, _panels, _plt
from tunecost.report.run_dir import RunRecords

REQUIRED = ("id", "quantity", "unit", "status")
# empty when every row was skipped; `fits` (tunecost's verdict on a row's setting) only in runs since it was recorded
OPTIONAL = ("measured", "predicted", "error", "reason", "stack", "fits", "low", "high")


def _rows(df: pd.DataFrame) -> list:
    from tunecost.validate.run import ValidationRow

    def value(v: float | None) -> float | None:
        return None if v is None or pd.isna(v) else float(v)

    return [
        ValidationRow(
            id=str(r["id"]),
            quantity=str(r["quantity"]),
            measured=value(r["measured"]),
            predicted=value(r["predicted"]),
            unit=str(r["unit"]),
            error=value(r["error"]),
            status=str(r["status"]),
            reason="" if pd.isna(r["reason"]) else str(r["reason"]),
            stack="" if pd.isna(r["stack"]) else str(r["stack"]),
            fits=None if r["fits"] is None or pd.isna(r["fits"]) else bool(r["fits"]),
            low=value(r["low"]),
            high=value(r["high"]),
        )
        for _, r in df.iterrows()
    ]


def _validation_frame(records: RunRecords) -> pd.DataFrame | str:
    df = _need(records, "validation", REQUIRED)
    if isinstance(df, str):
        return df
    return df.assign(**{c: None for c in OPTIONAL if c not in df.columns})


def validation_results(records: RunRecords) -> list:
    """The run's `validation.jsonl` records as `ValidationRow`s (none when the run holds no usable ones)."""
    df = _validation_frame(records)
    return [] if isinstance(df, str) else _rows(df)


def _scatter(ax, sel: pd.DataFrame, title: str, unit: str) -> None:
    for i, (stack, group) in enumerate(sel.groupby("stack", sort=True)):
        ax.scatter(group["measured"], group["predicted"], s=18, color=f"C{i % 10}", label=stack or "-")
    low = float(min(sel["measured"].min(), sel["predicted"].min()))
    high = float(max(sel["measured"].max(), sel["predicted"].max()))
    ax.plot([low, high], [low, high], color="black", linewidth=0.8)
    ax.fill_between([low, high], [0.9 * low, 0.9 * high], [1.1 * low, 1.1 * high], color="grey", alpha=0.2)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(f"measured ({unit})")
    ax.set_ylabel(f"predicted ({unit})")
    ax.legend(fontsize=7)


def fig_validation(records: RunRecords) -> FigureResult | str:
    df = _validation_frame(records)
    if isinstance(df, str):
        return df
    from tunecost.validate.summary import memory_totals, summarize, throughput_totals

    rows = _rows(df)
    table = pd.DataFrame(
        [
            {
                "quantity": s.quantity,
                "stack": s.stack,
                "rows": s.rows,
                "modelled": s.modelled,
                "median |error| %": s.median_abs_pct_error,
                "within 10 %": s.within_10pct,
                "oom right": s.right,
                "inside 95 %": f"{s.inside} of {s.with_interval}" if s.with_interval else None,
                "median ± %": s.median_halfwidth_pct,
            }
            for s in summarize(rows)
        ]
    )
    ok = df[(df["status"] == "ok") & df["predicted"].notna() & df["measured"].notna() & (df["quantity"] != "oom")]
    panels = [(q, ok[ok["quantity"] == q]) for q in sorted(set(ok["quantity"]))]
    panels = [(q, sel) for q, sel in panels if not sel.empty]
    m, t = memory_totals(rows), throughput_totals(rows)
    caption = (
        f"Peak memory: median |error| {m['peak_median_abs_pct_error']} % over {m['peak_rows_modelled']} rows; "
        f"fits/out-of-memory right on {m['verdict_right']} of {m['verdict_rows']} (out of memory on "
        f"{m['oom_right']} of {m['oom_rows_modelled']}); {m['memory_rows_modelled']} of "
        f"{m['memory_rows']} memory rows modelled. Throughput: mean |error| {t['mape']} % over {t['predicted_rows']} "
        f"rows ({t['calibration_rows']} calibration rows not counted). 95 % intervals (held out): peak memory "
        f"{m['peak_interval_inside']} of {m['peak_interval_with_interval']} inside, median ±"
        f"{m['peak_interval_median_halfwidth_pct']} %; throughput {t['interval_inside']} of "
        f"{t['interval_with_interval']}, median ±{t['interval_median_halfwidth_pct']} %. Grey band: within 10 %."
    )
    if not panels:
        return FigureResult(None, caption, table)
    plt = _plt()
    fig, axes = _panels(plt, len(panels), 4.2, 3.6)
    for ax, (quantity, sel) in zip(axes, panels, strict=False):
        _scatter(ax, sel, quantity, str(sel["unit"].iloc[0]))
    fig.tight_layout()
    return FigureResult(fig, caption, table)
