"""`tunecost plan --out RUN`: every setup the plan weighed, the fine-tune's cost against its hours (`plan.jsonl`,
results/plan_records.py). Colour: method; marker: GPU (hollow: owned); the Pareto front as a step line; the
recommended setup starred and labelled; setups ruled out by the budget, deadline or batch faint; those with no
time or price (they do not fit) are counted in the caption, not drawn."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tunecost.report.base import FigureResult, _need, _panels, _plt
from tunecost.report.run_dir import RunRecords

COLUMNS = ("model", "goal", "method", "gpu", "num_gpus", "strategy", "offload", "owned", "why_not", "on_front")
VALUES = ("hours", "usd", "recommended")
TABLE = (
    *("model", "method", "gpu", "num_gpus", "strategy", "offload", "micro_batch", "accumulation"),
    *("hours", "hours_low", "hours_high", "usd", "usd_low", "usd_high", "recommended"),
)
METHOD_COLORS = {"full": "C3", "lora": "C0", "qlora": "C2"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")  # the star is the recommended setup's
OTHER_MARKER = "."  # GPUs beyond the markers (a whole-catalog plan): one shared marker
LOG_SPREAD = 10.0  # an axis whose largest value is this many times its smallest is drawn on a log scale
FAINT = 0.2  # alpha of the ruled-out setups


def fig_plan(records: RunRecords) -> FigureResult | str:
    df = _need(records, "plan", COLUMNS)
    if isinstance(df, str):
        return df
    missing = [c for c in VALUES if c not in df.columns]
    if missing:
        return f"`plan.jsonl` lacks {', '.join(missing)} (written by an older or partial run)"
    df = _clean(df)
    if not df["_drawn"].any():
        return "no setup of the plan has both a time and a price (none fits): nothing to draw"
    models = sorted(set(df["model"]))
    plt = _plt()
    fig, axes = _panels(plt, len(models), 8.0, 4.4, max_cols=1)
    drawn = [_draw(ax, df[df["model"] == model]) for ax, model in zip(axes, models, strict=True)]
    fig.tight_layout()
    for _, label in drawn:
        if label is not None:  # placed once the layout has set the axes' size
            _place(label.axes, label)
    captions = [caption for caption, _ in drawn]
    caption = " ".join(captions) + (
        " The step line is the Pareto front: the setups no other beats on both cost and hours; any setup above and "
        "to the right of it costs more or takes longer than one on it, for nothing. Estimated, not measured: hours "
        "and dollars from the multi-GPU estimate at each setup's micro-batch (table: the front, with the 95 % "
        "interval of the throughput)."
    )
    return FigureResult(fig, caption, _table(df))


def _clean(df: pd.DataFrame) -> pd.DataFrame:
    """Numbers as floats, flags as bools; `_drawn`: has a finite time and price; `_in`: drawn and qualifies."""
    hours = pd.to_numeric(df["hours"], errors="coerce")
    usd = pd.to_numeric(df["usd"], errors="coerce")
    why_not = df["why_not"].fillna("").astype(str)
    drawn = np.isfinite(hours) & np.isfinite(usd) & (hours > 0) & (usd >= 0)
    flags = {c: df[c].eq(True) for c in ("owned", "on_front", "recommended")}  # a missing flag: False
    return df.assign(hours=hours, usd=usd, why_not=why_not, _drawn=drawn, _in=drawn & (why_not == ""), **flags)


def _styles(shown: pd.DataFrame) -> tuple[dict[str, str], dict[str, str]]:
    """(method -> colour, GPU -> marker): the GPUs on the front or recommended first; the rest share a marker."""
    methods = sorted(set(shown["method"]))
    spare = [f"C{i}" for i in range(10) if f"C{i}" not in METHOD_COLORS.values()]
    colors = {m: METHOD_COLORS.get(m) or spare[i % len(spare)] for i, m in enumerate(methods)}
    key = shown["on_front"] | shown["recommended"]
    first = sorted(set(shown.loc[key, "gpu"]))
    gpus = [*first, *sorted(set(shown["gpu"]) - set(first))]
    return colors, {g: MARKERS[i] if i < len(MARKERS) else OTHER_MARKER for i, g in enumerate(gpus)}


def _draw(ax, sel: pd.DataFrame) -> tuple[str, Any]:
    """One model's plan on `ax`: its caption sentence, and the recommended setup's label (None without one)."""
    shown = sel[sel["_drawn"]]
    colors, markers = _styles(shown)
    for (method, gpu, owned), group in shown.groupby(["method", "gpu", "owned"], sort=True):
        color, marker = colors[method], markers[gpu]
        for part, alpha in ((group[group["_in"]], 0.9), (group[~group["_in"]], FAINT)):
            if part.empty:
                continue
            face = "none" if owned and marker != OTHER_MARKER else color
            ax.scatter(part["hours"], part["usd"], s=30, marker=marker, facecolors=face, edgecolors=color, alpha=alpha)
    front = shown[shown["on_front"] & shown["_in"]].sort_values("hours")
    ax.step(front["hours"], front["usd"], where="post", color="black", linewidth=1.2, label="Pareto front", zorder=3)
    ax.scatter(front["hours"], front["usd"], s=90, facecolors="none", edgecolors="black", linewidths=0.8, zorder=3)
    best = shown[shown["recommended"]]
    label = _star(ax, best.iloc[0], colors[best.iloc[0]["method"]]) if not best.empty else None
    for axis, values in ((ax.xaxis, shown["hours"]), (ax.yaxis, shown["usd"])):
        _scale(ax, axis, values)
    ax.set_xlabel("hours of the fine-tune (h)")
    ax.set_ylabel("cost of the fine-tune (USD)")
    goal = str(sel["goal"].iloc[0])
    ax.set_title(f"{sel['model'].iloc[0]}: {goal}", fontsize=9)
    _legend(ax, shown, colors, markers)
    return _caption(sel, shown, front, goal), label


def _star(ax, row: pd.Series, color: str) -> Any:
    """The recommended setup: a star, and its label (an annotation that `_place` moves)."""
    ax.scatter([row["hours"]], [row["usd"]], s=260, marker="*", facecolors=color, edgecolors="black", zorder=5)
    offload = f" + {row['offload']} offload" if row["offload"] != "none" else ""
    owned = " (owned)" if row["owned"] else ""
    layout = row.get("layout") if isinstance(row.get("layout"), str) else row["strategy"]  # older rows: no layout
    text = (
        f"recommended: {row['method']}, {int(row['num_gpus'])} x {row['gpu']}{owned}, {layout}{offload}\n"
        f"{row['hours']:.3g} h, "
        + (f"${row['usd']:,.2f}" if row["usd"] >= 1 or row["usd"] == 0 else f"${row['usd']:.2g}")
    )
    label = ax.annotate(
        text,
        xy=(row["hours"], row["usd"]),
        xytext=(0, 0),
        textcoords="offset points",
        fontsize=8,
        multialignment="left",
        arrowprops={"arrowstyle": "->", "color": "black", "linewidth": 0.8, "shrinkB": 8},
        bbox={"boxstyle": "round,pad=0.3", "facecolor": "white", "edgecolor": "grey", "alpha": 0.9},
        zorder=6,
    )
    label.set_in_layout(False)  # placed inside the axes after the layout
    return label


# (offset in points, horizontal, vertical alignment): below-left first (nothing lies on the front's lower left),
# then left (from the star's height up), above-right, above-left, right, below-right; then further out.
PLACES = tuple(
    ((sx * d, sy * d), "right" if sx < 0 else "left", "top" if sy < 0 else "bottom")
    for d in (18, 40)
    for sx, sy in ((-1, -1), (-1, 0), (1, 1), (-1, 1), (1, 0), (1, -1))
)


def _place(ax, label) -> None:
    """Move `label` to the place of `PLACES` that lies inside the axes and covers the fewest drawn points."""
    from matplotlib.text import Text

    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = ax.get_window_extent(renderer)
    drawn = [c.get_offset_transform().transform(c.get_offsets()) for c in ax.collections]
    points = np.concatenate(drawn) if drawn else np.empty((0, 2))
    best: tuple[int, int] | None = None
    for i, (offset, ha, va) in enumerate(PLACES):
        label.set_position(offset)
        label.set_ha(ha)
        label.set_va(va)
        label.update_positions(renderer)
        pad = label.get_fontsize() * fig.dpi / 72  # the box's padding, about one line
        extent = Text.get_window_extent(label, renderer).padded(pad / 2)  # the text, not the arrow
        inside = box.x0 <= extent.x0 and extent.x1 <= box.x1 and box.y0 <= extent.y0 and extent.y1 <= box.y1
        covered = int(sum(extent.contains(x, y) for x, y in points)) + (0 if inside else 10_000)
        if best is None or (covered, i) < best:
            best = (covered, i)
    offset, ha, va = PLACES[best[1] if best else 0]
    label.set_position(offset)
    label.set_ha(ha)
    label.set_va(va)


def _scale(ax, axis, values: pd.Series) -> None:
    """Log scale where the values span `LOG_SPREAD` or more (and none is 0: owned GPUs cost $0)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    lo, hi = float(values.min()), float(values.max())
    if lo <= 0 or hi / lo < LOG_SPREAD:
        return
    (ax.set_xscale if axis is ax.xaxis else ax.set_yscale)("log")
    decades = np.log10(hi / lo)
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 3 else (1.0,)))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _legend(ax, shown: pd.DataFrame, colors: dict[str, str], markers: dict[str, str]) -> None:
    from matplotlib.lines import Line2D

    def handle(label: str, **style) -> Line2D:
        return Line2D([], [], linestyle="", label=label, **style)

    handles = [handle(m, marker="o", color=c) for m, c in colors.items()]
    named = [g for g, m in markers.items() if m != OTHER_MARKER]
    handles += [handle(g, marker=markers[g], color="grey") for g in named]
    if len(named) < len(markers):
        handles.append(handle(f"{len(markers) - len(named)} other GPUs", marker=OTHER_MARKER, color="grey"))
    handles.append(Line2D([], [], color="black", linewidth=1.2, label="Pareto front"))
    if shown["recommended"].any():
        handles.append(handle("recommended", marker="*", markersize=12, color="grey", markeredgecolor="black"))
    if shown["owned"].any():
        handles.append(handle("owned (hollow)", marker="o", color="grey", markerfacecolor="none"))
    if (~shown["_in"]).any():
        handles.append(handle("ruled out (faint)", marker="o", color="grey", alpha=FAINT))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)


def _caption(sel: pd.DataFrame, shown: pd.DataFrame, front: pd.DataFrame, goal: str) -> str:
    hidden = len(sel) - len(shown)
    reasons = sorted({w.split(":")[0] for w in shown.loc[~shown["_in"], "why_not"] if w})
    text = f"{sel['model'].iloc[0]}: the {len(shown)} of {len(sel)} setups weighed that have a time and a price"
    text += f" (the other {hidden} do not fit or have no price)" if hidden else ""
    text += f"; colour: method, marker: GPU. {len(front)} on the front; "
    text += "the star is the one recommended" if shown["recommended"].any() else "none is recommended"
    text += f" ({goal})."
    if reasons:
        text += f" Faint: ruled out ({', '.join(reasons)})."
    return text


def _table(df: pd.DataFrame) -> pd.DataFrame:
    """The front and the recommended setup of each model, cheapest first, with their intervals."""
    rows = df[df["_drawn"] & ((df["on_front"] & df["_in"]) | df["recommended"])]
    return rows[[c for c in TABLE if c in df.columns]].sort_values(["model", "usd", "hours"])
