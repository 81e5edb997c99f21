"""Figures of the workload and the model: sequence lengths (Fig. 2) and accuracy per epoch (Fig. 3)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tunecost.report.base import (
    FigureResult,
    _need,
    _panels,
    _plt,
)
from tunecost.report.run_dir import RunRecords

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
