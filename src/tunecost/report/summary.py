"""The report's opening summary: what the fine-tune costs, on which GPU, and how sure the estimate is, from the
run's estimate records (or, without them, what the run measured)."""

from __future__ import annotations

import html
import math

import pandas as pd

from tunecost.report.run_dir import RunRecords


def _num(value: object) -> float | None:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return x if math.isfinite(x) else None


def summary_lines(records: RunRecords) -> list[str]:
    """Plain-text summary sentences (escaped by the caller)."""
    lines: list[str] = []
    est = records.get("estimate")
    if est is not None and {"usd", "gpu", "model"} <= set(est.columns):
        usd = pd.to_numeric(est["usd"], errors="coerce")
        ok = est[usd.notna() & (usd >= 0)].assign(_usd=usd)  # $0: owned hardware
        if not ok.empty:
            for model, group in ok.groupby("model", sort=True):
                best = group.sort_values("_usd").iloc[0]
                worst = group.sort_values("_usd").iloc[-1]
                where = str(best["gpu"])
                if "provider" in group.columns and isinstance(best.get("provider"), str):
                    where += f" at {best['provider']}"
                hours = _num(best.get("hours"))
                text = f"{model}: cheapest ${best['_usd']:,.2f} on {where}"
                if hours is not None:
                    text += f" ({hours:,.1f} GPU-hours)"
                if len(group) > 1:
                    text += f"; the dearest of {len(group)} options is ${worst['_usd']:,.2f} on {worst['gpu']}"
                text += "."
                lines.append(text)
            lines.append(_certainty(ok))
    lines += _planned(records)
    if not lines:
        tp = records.get("throughput")
        if tp is not None and "queries_per_s" in tp.columns:
            qps = pd.to_numeric(tp["queries_per_s"], errors="coerce").dropna()
            if not qps.empty:
                lines.append(
                    f"No cost estimate in this run; measured throughput ranges {qps.min():.3g}-{qps.max():.3g} "
                    f"queries/s over {len(qps)} points. Run `tunecost estimate --out` to add costs."
                )
    accuracy = _validated(records)
    if not lines:
        lines.append("No cost estimate or throughput measurement in this run; the sections below show what it has.")
    return [*lines, *accuracy]


def _planned(records: RunRecords) -> list[str]:
    """The answer of each `tunecost plan --out` in the run: its recommended setup and the size of its front."""
    plan = records.get("plan")
    if plan is None or not {"model", "recommended", "on_front", "method", "gpu", "num_gpus", "hours"} <= set(plan):
        return []
    lines = []
    for model, group in plan.groupby("model", sort=True):
        best = group[group["recommended"].eq(True)]
        front = int(group["on_front"].eq(True).sum())
        if best.empty:
            lines.append(f"{model}: the plan found no setup within its constraints ({len(group)} weighed).")
            continue
        b = best.iloc[0]
        usd = _num(b.get("usd"))
        cost = f", ${usd:,.2f}" if usd is not None else ""
        lines.append(
            f"{model}: plan ({b.get('goal')}): {b['method']} on {int(b['num_gpus'])} x {b['gpu']} "
            f"({b.get('strategy')}), {float(b['hours']):.3g} h{cost}; {front} setups on the cost-vs-hours "
            f"front of {len(group)} weighed."
        )
    return lines


def _validated(records: RunRecords) -> list[str]:
    """How far the estimates were from published measurements, when the run holds `tunecost validate` records."""
    from tunecost.report.fig_validation import validation_results
    from tunecost.validate.summary import memory_totals

    rows = validation_results(records)
    totals = memory_totals(rows) if rows else {}
    median = totals.get("peak_median_abs_pct_error")
    if median is None:
        return []
    return [
        f"Against {len(rows)} published measurements, peak-memory estimates were within {median:.1f} % "
        f"(median |error|, {totals['peak_rows_modelled']} rows modelled); see the accuracy section."
    ]


def _certainty(est: pd.DataFrame) -> str:
    estimators = sorted({str(e) for e in est.get("estimator", pd.Series(dtype=object)).dropna()})
    how = f"Estimator{'s' if len(estimators) > 1 else ''}: {', '.join(estimators) or 'not recorded'}"
    for low, high in (("usd_low", "usd_high"), ("queries_per_s_low", "queries_per_s_high")):
        if {low, high} <= set(est.columns):
            lo = pd.to_numeric(est[low], errors="coerce")
            hi = pd.to_numeric(est[high], errors="coerce")
            mid = pd.to_numeric(est["usd" if low == "usd_low" else "queries_per_s"], errors="coerce")
            rel = ((hi - lo) / (2 * mid)).replace([math.inf, -math.inf], float("nan")).dropna()
            if not rel.empty:
                return f"{how}; 95 % interval up to ±{100 * rel.max():.0f} %."
    return f"{how}; no interval recorded, so treat the figures as point estimates."


def summary_html(records: RunRecords) -> str:
    items = "".join(f"<li>{html.escape(line)}</li>" for line in summary_lines(records))
    return f"<section id='summary'><h2>Summary</h2><ul>{items}</ul></section>"
