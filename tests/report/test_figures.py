"""The report's figures (tunecost.report.figures): one per section with data, labelled axes with units, legends,
no overlapping text (checked on the drawn figure); the omitted reason when data is missing."""

from __future__ import annotations

import json
import re
from itertools import combinations
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pytest

from tunecost.report.figures import SECTIONS, FigureResult
from tunecost.report.run_dir import load_run

SECTION_KEYS = [s.key for s in SECTIONS]
# The unit each section's axes must name (a label containing it), from the paper's figures.
UNITS = {
    "lengths": "tokens",
    "trainability": "(%)",
    "stages": "(ms)",
    "layers": "(%)",
    "kernels": "ms",
    "throughput": "(queries/s)",
    "counters": "(%)",
    "expert_load": "tokens",
    "max_batch": "(GB)",
    "fit": "(queries/s)",
    "costs": "(USD)",
    "validation": "(GiB)",
    "multi_gpu": "(GB)",
    "ranks": "(s)",
    "plan": "(USD)",
}


@pytest.fixture(scope="module")
def built(full_run: Path) -> dict[str, FigureResult | str]:
    records = load_run(full_run)
    out = {s.key: s.build(records) for s in SECTIONS}
    yield out
    plt.close("all")


def _is_number(text: str) -> bool:
    return re.fullmatch(r"[−\-+]?\d+(\.\d+)?(e[−\-+]?\d+)?%?", text.strip()) is not None


def _drawn_tick_labels(axis) -> list:
    """Tick labels matplotlib draws: those of ticks inside the view (the others keep stale positions)."""
    lo, hi = sorted(axis.get_view_interval())
    eps = 1e-9 * max(1.0, abs(hi - lo))
    return [
        tick.label1
        for tick, loc in zip(axis.get_major_ticks(), axis.get_majorticklocs())
        if lo - eps <= loc <= hi + eps
    ]


def _texts(fig) -> list:
    """Every visible, non-empty text drawn in the figure, legend texts and drawn tick labels included."""
    fig.canvas.draw()
    ticks = {
        id(t)
        for ax in fig.axes
        for axis in (ax.xaxis, ax.yaxis)
        for tick in axis.get_major_ticks() + axis.get_minor_ticks()
        for t in (tick.label1, tick.label2)
    }
    drawn = [
        t for ax in fig.axes if ax.get_visible() for axis in (ax.xaxis, ax.yaxis) for t in _drawn_tick_labels(axis)
    ]
    others = [t for t in fig.findobj(matplotlib.text.Text) if id(t) not in ticks]
    return [
        t
        for t in others + drawn
        if t.get_visible()
        and t.get_text().strip()
        and t.get_window_extent().width > 0
        and (t.axes is None or t.axes.get_visible())
    ]


def overlapping_texts(fig, tolerance_px: float = 1.0) -> list[tuple[str, str]]:
    """Pairs of texts whose boxes overlap, and texts covered by a legend they do not belong to."""
    texts = _texts(fig)
    boxes = [(t.get_text(), t.get_window_extent().expanded(1.0, 1.0).padded(-tolerance_px)) for t in texts]
    pairs = [(a, b) for (a, ba), (b, bb) in combinations(boxes, 2) if ba.overlaps(bb)]
    legends = [lg for ax in fig.axes if (lg := ax.get_legend()) is not None] + list(fig.legends)
    for legend in legends:
        frame = legend.get_window_extent().padded(-tolerance_px)
        own = {id(t) for t in legend.get_texts()} | {id(legend.get_title())}
        for t in texts:
            if id(t) not in own and frame.overlaps(t.get_window_extent()):
                pairs.append((f"legend {[x.get_text() for x in legend.get_texts()][:3]}", t.get_text()))
    return pairs


def data_under_legends(fig, tolerance_px: float = 1.0) -> list[str]:
    """Data points (line vertices, markers) and bars that a legend covers."""
    fig.canvas.draw()
    hidden = []
    for ax in (a for a in fig.axes if a.get_visible()):
        legends = [lg for lg in (ax.get_legend(), *fig.legends) if lg is not None]
        frames = [lg.get_window_extent().padded(-tolerance_px) for lg in legends]
        for line in ax.lines:
            points = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
            for frame in frames:
                if any(frame.contains(x, y) for x, y in points):
                    hidden.append(f"{line.get_label()} under a legend")
        for patch in ax.patches:
            box = patch.get_window_extent()
            if box.width > 0 and box.height > 0 and any(frame.overlaps(box) for frame in frames):
                hidden.append(f"bar {patch.get_label() or ''} under a legend")
    return hidden


def test_overlap_check_catches_a_legend_over_the_axis_label() -> None:
    """The checker itself: the report's first layout (legend at y=-0.25 below a short axes) covered the label."""
    fig, ax = plt.subplots(figsize=(7.5, 2.5))
    for i in range(8):
        ax.barh(["a", "b"], [1, 2], label=f"class {i}")
    ax.set_xlabel("MoE-layer time by kernel class (ms)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4)
    fig.tight_layout()
    assert any("MoE-layer time" in b for _, b in overlapping_texts(fig))
    plt.close(fig)


@pytest.mark.parametrize("key", SECTION_KEYS)
def test_each_section_draws_from_full_records(built, key: str) -> None:
    result = built[key]
    assert isinstance(result, FigureResult), result
    assert result.caption
    assert result.figure is not None


@pytest.mark.parametrize("key", SECTION_KEYS)
def test_axes_are_labelled_with_units_and_legends(built, key: str) -> None:
    fig = built[key].figure
    fig.canvas.draw()
    labels = []
    for ax in (a for a in fig.axes if a.get_visible()):
        for axis, label in ((ax.xaxis, ax.get_xlabel()), (ax.yaxis, ax.get_ylabel())):
            ticks = [t.get_text() for t in axis.get_ticklabels() if t.get_text()]
            categorical = ticks and not all(_is_number(t) for t in ticks)
            assert label or categorical, f"{key}: an axis has neither a label nor category ticks"
            labels.append(label)
        handles, _ = ax.get_legend_handles_labels()
        if len(handles) > 1:
            assert ax.get_legend() is not None or fig.legends, f"{key}: several series and no legend"
    assert any(UNITS[key] in label for label in labels), f"{key}: no axis label names {UNITS[key]!r}: {labels}"


@pytest.mark.parametrize("key", SECTION_KEYS)
def test_no_overlapping_text(built, key: str) -> None:
    assert overlapping_texts(built[key].figure) == []


@pytest.mark.parametrize("key", SECTION_KEYS)
def test_legends_hide_no_data(built, key: str) -> None:
    assert data_under_legends(built[key].figure) == []


def test_panels_wrap_instead_of_one_long_row(built) -> None:
    """Fig. 14 has four (model, dataset) groups: two rows of two, so the page does not shrink its text."""
    fig = built["fit"].figure
    visible = [a for a in fig.axes if a.get_visible()]
    assert len(visible) == 4
    assert fig.get_size_inches()[0] <= 8.0


def test_expert_variance_is_across_experts_of_summed_tokens(built, full_run: Path, rows) -> None:
    table = built["expert_load"].table
    for phase in ("before", "after"):
        per_expert: dict[int, int] = {}
        for r in rows(full_run, "expert_load"):
            if (r["model"], r["phase"]) == ("tiny-blackmamba", phase):
                per_expert[r["expert"]] = per_expert.get(r["expert"], 0) + r["tokens"]
        mean = sum(per_expert.values()) / len(per_expert)
        variance = sum((t - mean) ** 2 for t in per_expert.values()) / len(per_expert)  # population variance
        shown = table[(table.phase == phase) & (table.model == "tiny-blackmamba")]["variance"].item()
        assert shown == pytest.approx(variance, abs=0.05 + 1e-9)  # shown rounded to 0.1


def test_layers_are_per_step_sums_over_layers_and_passes(built, full_run: Path, rows) -> None:
    table = built["layers"].table.set_index("config")
    raw = [
        r
        for r in rows(full_run, "layers")
        if (r["model"], r["experts_per_token"], r["component"]) == ("tiny-mixtral", 2, "moe_experts")
    ]
    per_step_ms = 1e3 * sum(r["seconds"] for r in raw) / len({r["step"] for r in raw})
    assert table.loc["tiny-mixtral top-2 bsz=4", "moe_experts"] == pytest.approx(per_step_ms, abs=5e-4)


@pytest.mark.parametrize("key", ["stages", "layers", "kernels"])
def test_stacked_bars_draw_every_config_to_its_total(built, key: str) -> None:
    """Each row's bar ends at the row's total; a part that one architecture lacks (mamba vs attention) must not
    stop the parts after it from being drawn."""
    result = built[key]
    table = result.table.set_index("config")
    ax = result.figure.axes[0]
    ends: dict[str, float] = {}
    labels = [t.get_text() for t in ax.get_yticklabels()]
    for patch in ax.patches:
        width = patch.get_width()
        assert np.isfinite(width) and np.isfinite(patch.get_x()), f"{key}: a bar with a NaN position or width"
        row = labels[round(patch.get_y() + patch.get_height() / 2)]
        ends[row] = max(ends.get(row, 0.0), patch.get_x() + width)
    assert set(ends) == set(table.index)
    assert len(table) == {"stages": 8, "layers": 4, "kernels": 4}[key]  # 2 models x dense/top-2 (x 2 batch sizes)
    for config, end in ends.items():
        total = 100.0 if key == "layers" else table.loc[config].sum()  # the table is rounded to 0.01 ms
        assert end == pytest.approx(total, rel=1e-6, abs=0.02), config


def test_lengths_legend_shows_the_median(built, full_run: Path, rows) -> None:
    import statistics

    fig = built["lengths"].figure
    legend_texts = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    for dataset in ("commonsense_15k", "math_14k"):
        med = statistics.median(r["length"] for r in rows(full_run, "lengths") if r["dataset"] == dataset)
        assert f"median = {med:.0f}" in legend_texts


def test_counters_without_sm_readings_are_omitted_with_the_reason(tmp_path: Path, make_run) -> None:
    run = make_run(tmp_path / "run", kinds=("counters",))
    path = run / "counters.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    path.write_text(
        "".join(json.dumps({**r, "sm_pct": None, "dram_pct": None, "source": "torch.profiler"}) + "\n" for r in rows),
        encoding="utf-8",
    )
    counters = next(s for s in SECTIONS if s.key == "counters")
    reason = counters.build(load_run(run))
    assert isinstance(reason, str) and "lacks sm_pct, dram_pct" in reason


@pytest.mark.parametrize(
    ("kind", "column"),
    [
        ("throughput", "queries_per_s"),
        ("stages", "stage"),
        ("layers", "component"),
        ("kernels", "kernel_class"),
        ("expert_load", "phase"),
        ("trainability", "accuracy"),
        ("lengths", "length"),
        ("max_batch", "max_batch_size"),
        ("counters", "duration_s"),
        ("fit", "rmse"),
        ("fit", "coefficients"),
        ("estimate", "usd_per_hour"),
    ],
)
def test_a_missing_column_omits_the_section_with_its_name(tmp_path: Path, make_run, kind: str, column: str) -> None:
    run = make_run(tmp_path / "run", kinds=(kind,), drop_columns={kind: (column,)})
    key = "costs" if kind == "estimate" else kind
    section = next(s for s in SECTIONS if s.key == key)
    reason = section.build(load_run(run))
    assert reason == f"`{kind}.jsonl` lacks {column} (written by an older or partial run)"


def test_lengths_from_data_stats_histogram_rows(tmp_path: Path) -> None:
    """`tunecost data stats --out RUN/lengths.jsonl` writes summary + histogram rows, not one row per query."""
    from tunecost.cli.commands.data import stats_rows

    summary = {"dataset": "d", "tokenizer": "mistral", "template": "none", "num_queries": 6, "median_tokens": 15.0}
    histogram = [{"lo": 10, "hi": 20, "count": 4}, {"lo": 20, "hi": 30, "count": 2}]
    run = tmp_path / "run"
    run.mkdir()
    (run / "lengths.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in stats_rows(summary, histogram, {})), encoding="utf-8"
    )
    section = next(s for s in SECTIONS if s.key == "lengths")
    result = section.build(load_run(run))
    assert not isinstance(result, str), result
    legend = [t.get_text() for ax in result.figure.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert legend == ["median = 15"]
    assert result.table.to_dict("records")[0]["queries"] == 6


def test_runs_comparing_experts_implementations_label_each() -> None:
    import pandas as pd

    from tunecost.report.figures import _config_labels

    df = pd.DataFrame(
        [{"model": "m", "experts_per_token": 2, "batch_size": 4, "experts_impl": impl} for impl in ("stock", "fast")]
    )
    assert list(_config_labels(df)) == ["m top-2 [stock] bsz=4", "m top-2 [fast] bsz=4"]
    assert list(_config_labels(df.assign(experts_impl="fast"))) == ["m top-2 bsz=4"] * 2


def test_validation_caption_counts_the_fits_verdict_of_runs_that_ran(built) -> None:
    """12 peak rows that ran (tunecost says one of them does not fit) and one oom row it gets right."""
    caption = built["validation"].caption
    assert "fits/out-of-memory right on 12 of 13 (out of memory on 1 of 1)" in caption
