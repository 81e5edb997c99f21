"""The report's figures: each a pure function from run records to a matplotlib figure and a caption, or
the reason it cannot be drawn (the section is then omitted with that line, never filled with placeholders).

Figure numbers refer to Xia et al., IISWC 2024.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pandas as pd

from tunecost.report.records import RunRecords


@dataclass
class FigureResult:
    figure: object | None  # matplotlib Figure, or None for a table-only section
    caption: str
    table: pd.DataFrame | None = None


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    build: Callable[[RunRecords], FigureResult | str]  # a str is the reason the section is omitted


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "figure.dpi": 110,
            "font.size": 10,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    )
    return plt


def _panels(plt, num: int, width: float, height: float, max_cols: int = 3) -> tuple[Any, list[Any]]:
    """`num` panels of `width` x `height` inches, at most `max_cols` a row (one long row shrank the text on the
    page); unused cells of the last row are hidden."""
    cols = max(1, min(num, max_cols))
    rows = -(-num // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[num:]:
        ax.set_visible(False)
    return fig, flat[:num]


def _need(records: RunRecords, kind: str, columns: tuple[str, ...]) -> pd.DataFrame | str:
    df = records.get(kind)
    if df is None:
        return f"no `{kind}.jsonl` records in this run"
    missing = [c for c in columns if c not in df.columns or df[c].isna().all()]
    if missing:
        return f"`{kind}.jsonl` lacks {', '.join(missing)} (written by an older or partial run)"
    return df


def _device_of(df: pd.DataFrame) -> str:
    if "device" in df.columns:
        return ", ".join(sorted({str(d) for d in df["device"].dropna()})) or "unknown device"
    return "unknown device"


# Records written before rows carried `num_experts` come from Mixtral-8x7B and BlackMamba runs, 8 experts each.
LEGACY_NUM_EXPERTS = 8


def _present(value: object) -> bool:
    return value is not None and not (isinstance(value, float) and np.isnan(value))


def is_dense(row: pd.Series | dict) -> bool:
    """Dense routing: top-k == the model's number of experts, read from the row (`num_experts`, else the row's
    `sparsity` k/E == 1, else `LEGACY_NUM_EXPERTS` for records older than the `num_experts` column)."""
    k: Any = row.get("experts_per_token")
    if not _present(k):
        return False
    num_experts: Any = row.get("num_experts")
    if _present(num_experts):
        return int(k) >= int(num_experts)
    sparsity: Any = row.get("sparsity")
    if _present(sparsity):
        return float(sparsity) >= 1.0
    return int(k) >= LEGACY_NUM_EXPERTS


def routing_label(row: pd.Series | dict) -> str:
    """ "dense" or "top-k" for a row with `experts_per_token`."""
    return "dense" if is_dense(row) else f"top-{int(row['experts_per_token'])}"


def _label(row: pd.Series) -> str:
    k = row.get("experts_per_token")
    return f"{row.get('model', '?')} {routing_label(row)}" if k is not None else str(row.get("model"))


def _config_labels(df: pd.DataFrame) -> pd.Series:
    """ "model top-k bsz=B" per row, plus the experts implementation when the run compares several."""
    show_impl = "experts_impl" in df.columns and df["experts_impl"].dropna().nunique() > 1

    def label(r: pd.Series) -> str:
        impl = f" [{r.experts_impl}]" if show_impl and isinstance(r.get("experts_impl"), str) else ""
        return f"{_label(r)}{impl} bsz={r.batch_size}"

    return df.apply(label, axis=1)


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
    from tunecost.estimate.fit import ThroughputFit

    plt = _plt()
    groups = list(fits.itertuples())
    fig, axes = _panels(plt, len(groups), 3.6, 3.4, max_cols=2)
    rows = []
    for ax, f in zip(axes, groups):
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
        rows.append(
            {
                "model": f.model,
                "dataset": f.dataset,
                "gpu": f.gpu,
                "rmse_qps": round(f.rmse, 4),
                "mape_pct": round(100 * f.mape, 2),
                "points": f.num_points,
                "coefficients": ", ".join(f"{k}={v:.4g}" for k, v in f.coefficients.items()),
            }
        )
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


# --- Table IV: cost per GPU and provider --------------------------------------------------------------------


def table_costs(records: RunRecords) -> FigureResult | str:
    df = _need(
        records,
        "estimate",
        (
            "model",
            "gpu",
            "usd",
            "estimator",
            "provider",
            "price_date",
            "experts_per_token",
            "usd_per_hour",
            "max_batch_size",
            "queries_per_s",
            "hours",
            "num_queries",
            "epochs",
            "dataset",
        ),
    )
    if isinstance(df, str):
        return df
    df = df[df["usd"].notna()]
    if df.empty:
        return "no estimate has both a throughput and a price"
    best = df.sort_values("usd").groupby(["model", "experts_per_token", "estimator", "gpu"], as_index=False).first()
    table = best[
        [
            "model",
            "experts_per_token",
            "estimator",
            "gpu",
            "provider",
            "price_date",
            "usd_per_hour",
            "max_batch_size",
            "queries_per_s",
            "hours",
            "usd",
        ]
    ].copy()
    table = table.sort_values(["model", "experts_per_token", "estimator", "usd"])
    for col, nd in (("queries_per_s", 3), ("hours", 1), ("usd", 2)):
        table[col] = table[col].astype(float).round(nd)
    plt = _plt()
    keys = list(table.groupby(["model", "experts_per_token", "estimator"]).groups)
    fig, axes = _panels(plt, len(keys), 3.8, 3.6)
    for ax, key in zip(axes, keys):
        sel = table[(table.model == key[0]) & (table.experts_per_token == key[1]) & (table.estimator == key[2])]
        ax.barh(sel.gpu + " (" + sel.provider + ")", sel.usd, color="tab:green")
        ax.set_xlabel("cost of the fine-tune (USD)")
        ax.set_title(f"{key[0]} {routing_label(sel.iloc[0])}\nestimator: {key[2]}", fontsize=9)
        ax.invert_yaxis()
    fig.tight_layout()
    q = df.iloc[0]
    caption = (
        f"Cheapest provider per GPU for {int(q['num_queries'])} queries x {q['epochs']:g} epochs of "
        f"{q['dataset']}; price dates in the table. Estimators named per panel."
    )
    return FigureResult(fig, caption, table)


# --- Fig. 8: throughput vs batch size --------------------------------------------------------------------------


def fig_throughput(records: RunRecords) -> FigureResult | str:
    df = _need(records, "throughput", ("model", "experts_per_token", "batch_size", "queries_per_s"))
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


# --- Fig. 4: forward / backward / optimizer --------------------------------------------------------------------


def _stacked(ax, table: pd.DataFrame, colors: dict[str, str] | None = None) -> None:
    left = np.zeros(len(table))
    for col in table.columns:
        vals = np.nan_to_num(table[col].to_numpy(dtype=float))  # a part one config lacks (mamba vs attention): 0
        ax.barh(table.index, vals, left=left, label=col, color=(colors or {}).get(col))
        left += vals


def fig_stages(records: RunRecords) -> FigureResult | str:
    df = _need(records, "stages", ("model", "experts_per_token", "batch_size", "stage", "seconds"))
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
    df = _need(records, "layers", ("model", "experts_per_token", "batch_size", "component", "seconds"))
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
    df = _need(records, "kernels", ("model", "experts_per_token", "batch_size", "kernel_class", "seconds"))
    if isinstance(df, str):
        return df
    plt = _plt()
    df = df.assign(config=_config_labels(df))
    table = df.pivot_table(index="config", columns="kernel_class", values="seconds", aggfunc="sum") * 1e3
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(table) + 1.6))
    _stacked(ax, table.fillna(0))
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
    df = _need(records, "expert_load", ("model", "phase", "expert", "tokens"))
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


# --- Fig. 3: accuracy per epoch -----------------------------------------------------------------------------------


def fig_trainability(records: RunRecords) -> FigureResult | str:
    df = _need(records, "trainability", ("epoch", "accuracy"))
    if isinstance(df, str):
        return df
    plt = _plt()
    key = "routing" if "routing" in df.columns else "experts_per_token"
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for name, g in df.groupby(key):
        g = g.sort_values("epoch")
        ax.plot(g.epoch, 100 * g.accuracy.astype(float), "o-", label=str(name))
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8, loc="lower right")  # accuracy rises: the lower right stays empty
    fig.tight_layout()
    table = df.pivot_table(index="epoch", columns=key, values="accuracy", aggfunc="last").round(3).reset_index()
    model = ", ".join(sorted(map(str, df["model"].unique()))) if "model" in df.columns else ""
    return FigureResult(
        fig, f"Accuracy per epoch, dense vs sparse, {model} on the embedded task (Fig. 3 analogue).", table
    )


# --- Fig. 2: sequence lengths ---------------------------------------------------------------------------------------


def _length_histograms(df: pd.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray, float | None]]:
    """Per dataset: (bin edges, counts, median) from per-query `length` rows, or from the histogram and summary
    rows `tunecost data stats --out` writes."""
    out: dict[str, tuple[np.ndarray, np.ndarray, float | None]] = {}
    for name, g in df.groupby("dataset"):
        if "length" in g.columns and g["length"].notna().any():
            lengths = g["length"].dropna().astype(float).to_numpy()
            lo, hi = lengths.min(), lengths.max()
            # Token counts are integers: one bar per length when the range is narrow, else 40 bins.
            bins = np.arange(lo - 0.5, hi + 1.5) if hi - lo < 60 else 40
            counts, edges = np.histogram(lengths, bins=bins)
            out[str(name)] = (edges, counts, float(np.median(lengths)))
        elif {"bin_lo", "bin_hi", "count"} <= set(g.columns) and g["count"].notna().any():
            h = g.dropna(subset=["count"]).sort_values("bin_lo")
            edges = np.append(h.bin_lo.to_numpy(dtype=float), float(h.bin_hi.iloc[-1]))
            med = g["median_tokens"].dropna() if "median_tokens" in g.columns else pd.Series(dtype=float)
            out[str(name)] = (edges, h["count"].to_numpy(dtype=float), float(med.iloc[0]) if len(med) else None)
    return out


def fig_lengths(records: RunRecords) -> FigureResult | str:
    df = _need(records, "lengths", ("dataset",))
    if isinstance(df, str):
        return df
    hists = _length_histograms(df)
    if not hists:
        return "`lengths.jsonl` lacks length (written by an older or partial run)"  # nor histogram rows
    plt = _plt()
    fig, axes = _panels(plt, len(hists), 4.2, 3.2)
    rows = []
    for ax, (name, (edges, counts, med)) in zip(axes, sorted(hists.items())):
        ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="tab:blue", alpha=0.8)
        if med is not None:
            ax.axvline(med, color="tab:red", ls="--", label=f"median = {med:.0f}")
            ax.legend(fontsize=8)
        ax.set_xlabel("tokens per query")
        ax.set_ylabel("queries")
        ax.set_title(name, fontsize=9)
        rows.append(
            {"dataset": name, "queries": int(counts.sum()), "median_tokens": med, "max_tokens_bin": float(edges[-1])}
        )
    fig.tight_layout()
    tok = ", ".join(sorted(map(str, df["tokenizer"].dropna().unique()))) if "tokenizer" in df.columns else "?"
    return FigureResult(fig, f"Sequence-length distribution (Fig. 2 analogue); tokenizer: {tok}.", pd.DataFrame(rows))


# --- Fig. 13 / Table III: maximum batch size ---------------------------------------------------------------------


def fig_max_batch(records: RunRecords) -> FigureResult | str:
    df = _need(records, "max_batch", ("model", "max_batch_size"))
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


SECTIONS: tuple[Section, ...] = (
    Section("lengths", "Fig. 2 — Sequence lengths", fig_lengths),
    Section("trainability", "Fig. 3 — Accuracy per epoch, dense vs sparse", fig_trainability),
    Section("stages", "Fig. 4 — Forward / backward / optimizer", fig_stages),
    Section("layers", "Fig. 5 — Per-layer breakdown", fig_layers),
    Section("kernels", "Fig. 6 — MoE kernel breakdown", fig_kernels),
    Section("throughput", "Fig. 8 — Throughput vs batch size", fig_throughput),
    Section("counters", "Figs. 9 and 10 — SM and DRAM utilization", fig_counters),
    Section("expert_load", "Fig. 11 — Tokens per expert", fig_expert_load),
    Section("max_batch", "Fig. 13 and Table III — Maximum batch size", fig_max_batch),
    Section("fit", "Fig. 14 — Eq. (2) fitted to measured throughput", fig_throughput_fit),
    Section("costs", "Table IV — Cost per GPU and provider", table_costs),
)
