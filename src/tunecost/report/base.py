"""What every report figure builds on: the result and section types, matplotlib set-up, record checks and
labels (routing, configuration)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tunecost.errors import TunecostWarning
from tunecost.report.run_dir import RunRecords

REQUIRED = "missing"


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


def _need(records: RunRecords, kind: str, columns: tuple[str, ...], *, every_row: bool = False) -> pd.DataFrame | str:
    """The `kind` records holding `columns`, or why a figure cannot be drawn. With `every_row`, records that lack
    one of `columns` (a hand edit, a partial write) are left out and reported once; the rest are drawn."""
    df = records.get(kind)
    if df is None:
        return f"no `{kind}.jsonl` records in this run"
    missing = [c for c in columns if c not in df.columns or df[c].isna().all()]
    if missing:
        return f"`{kind}.jsonl` lacks {', '.join(missing)} (written by an older or partial run)"
    incomplete = df[list(columns)].isna().any(axis=1)
    if every_row and incomplete.any():
        _note_incomplete(records, kind, df[incomplete], columns)
        df = df[~incomplete]
    return df


def _note_incomplete(records: RunRecords, kind: str, rows: pd.DataFrame, columns: tuple[str, ...]) -> None:
    """Once per kind: a `TunecostWarning` and a line in the report's list of records not read, naming the files
    and how many of their records lack a column a figure needs (those records are left out; the rest are drawn)."""
    if kind in records.incomplete_noted:
        return
    records.incomplete_noted.add(kind)
    lacking = sorted(c for c in columns if rows[c].isna().any())
    sources = rows["_source"] if "_source" in rows.columns else pd.Series(["."] * len(rows))
    for source, count in sorted(sources.fillna(".").value_counts().items()):
        name = f"{kind}.jsonl" if source == "." else f"{source}/{kind}.jsonl"
        note = f"{name}: {count} record(s) lack {' or '.join(lacking)}; left out of the figures"
        records.skipped.append(note)
        warnings.warn(
            f"{records.run_dir / name}: {count} record(s) lack {' or '.join(lacking)}; left out of the "
            "figures, the other records are drawn",
            TunecostWarning,
            stacklevel=2,
        )


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
    k: Any = row.get("experts_per_token")
    return f"{row.get('model', '?')} {routing_label(row)}" if k is not None else str(row.get("model"))


def _config_labels(df: pd.DataFrame) -> pd.Series:
    """ "model top-k bsz=B" per row, plus the experts implementation when the run compares several."""
    show_impl = "experts_impl" in df.columns and df["experts_impl"].dropna().nunique() > 1

    def label(r: pd.Series) -> str:
        impl = f" [{r.experts_impl}]" if show_impl and isinstance(r.get("experts_impl"), str) else ""
        return f"{_label(r)}{impl} bsz={r.batch_size}"

    return df.apply(label, axis=1)


def _stacked(ax, table: pd.DataFrame, colors: dict[str, str] | None = None) -> None:
    left = np.zeros(len(table))
    for col in table.columns:
        vals = np.nan_to_num(table[col].to_numpy(dtype=float))  # a part one config lacks (mamba vs attention): 0
        ax.barh(table.index, vals, left=left, label=col, color=(colors or {}).get(col))
        left += vals
