"""Figures of measured throughput and memory: eq. (2) fitted (Fig. 14), throughput vs batch size (Fig. 8) and the
maximum batch size (Fig. 13, Table III)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tunecost.estimate.fit import ThroughputFit
from tunecost.report.base import (
    FigureResult,
    _device_of,
    _need,
    _panels,
    _plt,
    is_dense,
    routing_label,
)
from tunecost.report.run_dir import RunRecords

# --- Fig. 14: eq. (2) fitted to measurements --------------------------------------------------------------


def fig_throughput_fit(records: RunRecords) -> FigureResult | str:
    df = _need(
        records,
        "fit",
        (
            "kind",
            "model",
            "dataset",
            "gpu",
            "form",
            "coefficients",
            "rmse",
            "mape",
            "num_points",
            "batch_size_range",
            "note",
            "experts_per_token",
            "sparsity",
            "batch_size",
            "queries_per_s",
        ),
    )
    if isinstance(df, str):
        return df
    points, fits = df[df["kind"] == "fit_point"], df[(df["kind"] == "fit") & (df.get("form") == "artifact")]
    if points.empty or fits.empty:
        return "no fitted eq. (2) in this run"
    plt = _plt()
    groups = list(fits.itertuples())
    fig, axes = _panels(plt, len(groups), 3.6, 3.4, max_cols=2)
    rows = []
    for ax, f in zip(axes, groups):
        _plot_fit(ax, f, points)
        rows.append(_fit_row(f))
    fig.tight_layout()
    handles = {lbl: h for ax in axes for h, lbl in zip(*ax.get_legend_handles_labels())}
    fig.legend(
        handles.values(),
        handles.keys(),
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=len(handles),
        fontsize=8,
        frameon=False,
    )
    caption = (
        "Measured: the paper's A40 throughput (its artifact's data, bundled). Estimator: eq. (2), artifact "
        "form a + b·log(B)/(sparsity·c3), fitted per (model, dataset, GPU) with scipy."
    )
    return FigureResult(fig, caption, pd.DataFrame(rows))


def _plot_fit(ax: Any, f: Any, points: pd.DataFrame) -> None:
    """One (model, dataset, GPU) panel: the measured points and eq. (2)'s curve per routing, with the fit's error."""

    fit = ThroughputFit(
        model=f.model,
        dataset=f.dataset,
        gpu=f.gpu,
        form=f.form,
        coefficients=f.coefficients,
        rmse=f.rmse,
        mape=f.mape,
        num_points=f.num_points,
        batch_size_range=tuple(f.batch_size_range),
        note=f.note,
    )
    sel = points[(points.model == f.model) & (points.dataset == f.dataset) & (points.gpu == f.gpu)]
    for k in sorted(sel.experts_per_token.dropna().unique()):
        s = sel[sel.experts_per_token == k]
        routing = "dense" if is_dense(s.iloc[0]) else "sparse"
        color = "tab:red" if routing == "dense" else "tab:blue"
        ax.plot(s.batch_size, s.queries_per_s, "o", color=color, label=f"measured {routing}")
        b = np.linspace(1, s.batch_size.max(), 50)
        sp = float(s.sparsity.iloc[0])
        ax.plot(
            b,
            [fit.predict_queries_per_s(batch_size=x, sparsity=sp) for x in b],
            "-",
            color=color,
            label=f"eq. (2) {routing}",
        )
    ax.set_title(f"{f.model}\n{f.dataset} on {f.gpu}", fontsize=9)
    ax.set_xlabel("batch size (queries)")
    ax.set_ylabel("throughput (queries/s)")
    ax.text(
        0.97,
        0.05,
        f"RMSE {f.rmse:.3f} q/s\nMAPE {100 * f.mape:.1f} %",
        transform=ax.transAxes,
        ha="right",
        va="bottom",
        fontsize=8,
    )


def _fit_row(f: Any) -> dict[str, Any]:
    return {
        "model": f.model,
        "dataset": f.dataset,
        "gpu": f.gpu,
        "rmse_qps": round(f.rmse, 4),
        "mape_pct": round(100 * f.mape, 2),
        "points": f.num_points,
        "coefficients": ", ".join(f"{k}={v:.4g}" for k, v in f.coefficients.items()),
    }


# --- Fig. 8: throughput vs batch size --------------------------------------------------------------------------


def fig_throughput(records: RunRecords) -> FigureResult | str:
    df = _need(records, "throughput", ("model", "experts_per_token", "batch_size", "queries_per_s"), every_row=True)
    if isinstance(df, str):
        return df
    plt = _plt()
    models = sorted(df.model.unique())
    fig, axes = _panels(plt, len(models), 4.2, 3.4)
    for ax, model in zip(axes, models):
        sel = df[df.model == model]
        impls = sel["experts_impl"].dropna().unique() if "experts_impl" in sel.columns else []
        keys = ["experts_per_token", "experts_impl"] if len(impls) > 1 else ["experts_per_token"]
        for key, g in sel.groupby(keys):
            _k, impl = (key if isinstance(key, tuple) else (key,)) + ((None,) if len(keys) == 1 else ())
            first = g.iloc[0]
            g = g.groupby("batch_size", as_index=False)["queries_per_s"].median()
            ax.plot(
                g.batch_size,
                g.queries_per_s,
                "o-",
                label=routing_label(first) + (f" [{impl}]" if impl else ""),
            )
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("batch size (queries)")
        ax.set_ylabel("throughput (queries/s)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return FigureResult(fig, f"Measured fine-tuning throughput on {_device_of(df)} (Fig. 8 analogue).")


# --- Fig. 13 / Table III: maximum batch size ---------------------------------------------------------------------


def fig_max_batch(records: RunRecords) -> FigureResult | str:
    df = _need(records, "max_batch", ("model", "max_batch_size"), every_row=True)
    if isinstance(df, str):
        return df
    plt = _plt()
    mem_col = "gpu_memory_gb" if "gpu_memory_gb" in df.columns else None
    if mem_col is None:
        return FigureResult(
            None, "Maximum batch sizes (Table III analogue).", df.drop(columns=["_source"], errors="ignore")
        )
    models = sorted(df.model.unique())
    fig, axes = _panels(plt, len(models), 4.6, 3.6, max_cols=2)
    est_col = "estimator" if "estimator" in df.columns else ("source" if "source" in df.columns else None)
    names = sorted(df[est_col].dropna().unique()) if est_col else [None]
    colors = {n: f"C{i}" for i, n in enumerate(names)}
    for ax, model in zip(axes, models):
        sel = df[df.model == model]
        ks = sorted(sel.experts_per_token.dropna().unique()) if "experts_per_token" in sel.columns else [None]
        for name in names:
            for j, k in enumerate(ks):
                g = sel[
                    ((sel[est_col] == name) if est_col else True)
                    & ((sel.experts_per_token == k) if k is not None else True)
                ].sort_values(mem_col)
                if g.empty:
                    continue
                routing = "" if k is None else routing_label(g.iloc[0])
                ax.plot(
                    g[mem_col],
                    g.max_batch_size,
                    marker="o",
                    ls=("-", "--", ":")[j % 3],
                    color=colors[name],
                    label=f"{name or ''} {routing}".strip(),
                )
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("GPU memory (GB)")
        ax.set_ylabel("maximum batch size (queries)")
        ax.legend(fontsize=6.5, loc="upper left")
    fig.tight_layout()
    seq = sorted(df.seq_len.dropna().unique()) if "seq_len" in df.columns else []
    return FigureResult(
        fig,
        "Maximum batch size vs GPU memory: the paper's eq. (1) beside the step simulator "
        f"(Fig. 13 analogue{'; ' + ', '.join(str(int(x)) for x in seq) + ' tokens per query' if seq else ''}); "
        "solid = sparse, dashed = dense.",
        df.drop(columns=["_source", "schema_version", "kind"], errors="ignore"),
    )
