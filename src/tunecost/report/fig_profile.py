"""Figures of where a step's time goes: stages (Fig. 4), layers (Fig. 5), MoE kernels (Fig. 6), tokens per expert
(Fig. 11) and SM / DRAM utilization (Figs. 9, 10)."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pandas as pd

from tunecost.report.base import (
    FigureResult,
    _config_labels,
    _device_of,
    _need,
    _panels,
    _plt,
    _stacked,
    routing_label,
)
from tunecost.report.colors import kernel_colors
from tunecost.report.run_dir import RunRecords

# --- Fig. 4: forward / backward / optimizer --------------------------------------------------------------------


def fig_stages(records: RunRecords) -> FigureResult | str:
    df = _need(records, "stages", ("model", "experts_per_token", "batch_size", "stage", "seconds"), every_row=True)
    if isinstance(df, str):
        return df
    df = df[df.stage.isin(["forward", "backward", "optimizer"])]
    if df.empty:
        return "no forward/backward/optimizer stage rows"
    plt = _plt()
    df = df.assign(config=_config_labels(df))
    table = df.pivot_table(index="config", columns="stage", values="seconds", aggfunc="median")
    table = table[[c for c in ("forward", "backward", "optimizer") if c in table.columns]] * 1e3
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(table) + 1.4))
    _stacked(ax, table, {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "tab:green"})
    ax.set_xlabel("time per training step (ms)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return FigureResult(
        fig,
        f"Median stage time per step on {_device_of(df)} (Fig. 4 analogue); table in ms per step.",
        table.round(2).reset_index(),
    )


# --- Fig. 5: per-layer breakdown --------------------------------------------------------------------------------


def fig_layers(records: RunRecords) -> FigureResult | str:
    df = _need(records, "layers", ("model", "experts_per_token", "batch_size", "component", "seconds"), every_row=True)
    if isinstance(df, str):
        return df
    plt = _plt()
    pass_col = "pass" if "pass" in df.columns else None
    df = df.assign(config=_config_labels(df))
    # Sum over layers and passes (forward + backward + recompute) per step: the paper's per-layer time.
    table = df.pivot_table(index="config", columns="component", values="seconds", aggfunc="sum")
    steps = df.groupby("config")["step"].nunique() if "step" in df.columns else None
    if steps is not None:
        table = table.div(steps.reindex(table.index).clip(lower=1), axis=0)
    table = table * 1e3
    share = table.div(table.sum(axis=1), axis=0) * 100
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(share) + 1.6))
    _stacked(ax, share)
    ax.set_xlabel("share of layer time (%)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    moe_cols = [c for c in share.columns if str(c).startswith("moe")]
    moe = share[moe_cols].sum(axis=1).mean() if moe_cols else float("nan")
    passes = ", ".join(sorted(df[pass_col].unique())) if pass_col else "forward"
    return FigureResult(
        fig,
        f"Per-layer time split ({passes}) on {_device_of(df)}; MoE share averages "
        f"{moe:.0f} % (Fig. 5 analogue; the paper: 85 %); table in ms per step.",
        table.round(3).reset_index(),
    )


# --- Fig. 6: MoE kernel breakdown ------------------------------------------------------------------------------


def fig_kernels(records: RunRecords) -> FigureResult | str:
    df = _need(
        records, "kernels", ("model", "experts_per_token", "batch_size", "kernel_class", "seconds"), every_row=True
    )
    if isinstance(df, str):
        return df
    plt = _plt()
    df = df.assign(config=_config_labels(df))
    table = df.pivot_table(index="config", columns="kernel_class", values="seconds", aggfunc="sum") * 1e3
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(table) + 1.6))
    _stacked(ax, table.fillna(0), kernel_colors(table.columns))
    ax.set_xlabel("MoE-layer time by kernel class (ms, profiled steps)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    src = ", ".join(sorted(df["source"].dropna().unique())) if "source" in df.columns else "torch.profiler"
    return FigureResult(
        fig,
        f"MoE kernel classes from {src} on {_device_of(df)} (Fig. 6 analogue); table in ms over the profiled steps.",
        table.round(3).reset_index(),
    )


# --- Fig. 11: tokens per expert ---------------------------------------------------------------------------------


def fig_expert_load(records: RunRecords) -> FigureResult | str:
    df = _need(records, "expert_load", ("model", "phase", "expert", "tokens"), every_row=True)
    if isinstance(df, str):
        return df
    plt = _plt()
    keys: list[tuple[Any, Any]] = (
        [cast(tuple[Any, Any], key) for key in df.groupby(["model", "experts_per_token"]).groups]  # (model, k)
        if "experts_per_token" in df.columns
        else [(m, None) for m in df.model.unique()]
    )
    fig, axes = _panels(plt, len(keys), 4.2, 3.4)
    rows = []
    for ax, (model, k) in zip(axes, keys):
        sel = df[(df.model == model) & ((df.experts_per_token == k) if k is not None else True)]
        width = 0.4
        for i, phase in enumerate(("before", "after")):
            p = sel[sel.phase == phase].groupby("expert")["tokens"].sum()
            if p.empty:
                continue
            var = float(np.var(p.to_numpy(dtype=float)))
            ax.bar(p.index.to_numpy() + (i - 0.5) * width, p.to_numpy(), width, label=f"{phase} (var {var:.0f})")
            rows.append(
                {
                    "model": model,
                    "experts_per_token": k,
                    "phase": phase,
                    "variance": round(var, 1),
                    **{f"expert_{e}": int(t) for e, t in p.items()},
                }
            )
        ax.set_title(f"{model} {routing_label(sel.iloc[0]) if k is not None else ''}".rstrip(), fontsize=9)
        ax.set_xlabel("expert")
        ax.set_ylabel("tokens routed (all MoE layers)")
        ax.set_ylim(top=1.3 * ax.get_ylim()[1])  # headroom: the legend sits above the bars, never over them
        ax.legend(fontsize=8, loc="upper center", ncol=2)
    fig.tight_layout()
    return FigureResult(
        fig,
        "Tokens per expert before and after fine-tuning, with the variance across experts (Fig. 11 analogue).",
        pd.DataFrame(rows),
    )


# --- Figs. 9 / 10: SM and DRAM utilization ----------------------------------------------------------------------------


def fig_counters(records: RunRecords) -> FigureResult | str:
    df = _need(records, "counters", ("kernel_class", "batch_size", "duration_s", "sm_pct", "dram_pct"))
    if isinstance(df, str):
        return df
    df = df.dropna(subset=["sm_pct", "dram_pct"])
    if df.empty:
        return "kernel counters have no SM/DRAM readings (ncu unavailable: durations only)"
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, col, label in ((axes[0], "sm_pct", "SM utilization (%)"), (axes[1], "dram_pct", "DRAM bandwidth (%)")):
        w = df.assign(w=df[col] * df.duration_s).groupby(["kernel_class", "batch_size"])[["w", "duration_s"]].sum()
        t = (w.w / w.duration_s).unstack("batch_size")
        t.plot.bar(ax=ax, legend=False)
        ax.set_ylabel(f"time-weighted {label}")
        ax.set_xlabel("")
    fig.tight_layout()
    # one legend below both panels (inside a panel it covered bars)
    fig.legend(
        *axes[0].get_legend_handles_labels(),
        title="batch size (queries)",
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=t.shape[1],
        fontsize=8,
        title_fontsize=8,
        frameon=False,
    )
    return FigureResult(
        fig,
        f"Time-weighted SM and DRAM utilization per MoE kernel class on {_device_of(df)} (Figs. 9 and 10 analogue).",
    )
