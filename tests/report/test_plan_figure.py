"""The plan figure (`tunecost.report.fig_plan`): a report of a `tunecost plan --out` run draws every setup with a
time and a price as cost vs hours; its step line is the plan's Pareto front and its star the recommended setup."""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pytest

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.estimate.cost import estimate_job
from tunecost.estimate.plan import make_plan
from tunecost.report.fig_plan import fig_plan
from tunecost.report.html import build_report
from tunecost.report.run_dir import load_run
from tunecost.results.plan_records import plan_rows, save_plan_records
from tunecost.results.records import write_records

SMALL = {"num_queries": 2000, "epochs": 1, "max_gpus": 2, "gpus_per_node": 8}


@pytest.fixture(scope="module")
def plan():
    """A small LoRA plan with a deadline between its fastest and slowest setup, so some setups are ruled out."""
    job = estimate_job("Qwen/Qwen2.5-0.5B", method="lora", seq_len=512)
    gpus = [resolve_gpu_name(g).gpu for g in ("H100", "RTX-4090")]
    hours = [o.hours for o in make_plan([job], gpus=gpus, **SMALL).front]
    return make_plan([job], gpus=gpus, deadline_h=math.sqrt(min(hours) * max(hours)), **SMALL)


@pytest.fixture(scope="module")
def run(plan, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("plan") / "run"
    save_plan_records(run, plan, command="tunecost plan --out run")
    return run


@pytest.fixture(scope="module")
def figure(run: Path):
    result = fig_plan(load_run(run))
    yield result
    plt.close("all")


def _offsets(ax) -> np.ndarray:
    return np.concatenate([c.get_offsets() for c in ax.collections])


def test_the_report_of_a_plan_run_has_the_figure(run: Path, plan) -> None:
    result = build_report(run)
    assert "plan" in result.sections_shown
    assert {p.name for p in result.figure_paths} == {"plan.png", "plan.svg"}
    page = result.html_path.read_text(encoding="utf-8")
    assert "<img alt='plan' src='data:image/png;base64," in page
    caption = re.search(r"<h2 id='plan'>.*?<p class='caption'>(.*?)</p>", page, re.S)
    assert (
        caption and "Pareto front" in caption.group(1) and "no other beats on both cost and hours" in caption.group(1)
    )
    assert f"{plan.model}: plan (cheapest within the deadline)" in page  # the summary names the answer


def test_its_front_is_the_plans_front(figure, plan) -> None:
    ax = figure.figure.axes[0]
    (line,) = [line for line in ax.lines if line.get_label() == "Pareto front"]
    assert line.get_drawstyle() == "steps-post"
    expected = sorted((o.hours, o.usd) for o in plan.front)
    np.testing.assert_allclose(line.get_xydata(), expected, rtol=1e-12)
    best = (plan.recommended.hours, plan.recommended.usd)
    table = set(zip(figure.table["hours"], figure.table["usd"]))  # the front and the recommended setup
    assert table == {*expected, best}


def test_every_setup_with_a_time_and_price_is_drawn_and_the_star_is_the_recommended(figure, plan) -> None:
    ax = figure.figure.axes[0]
    best = plan.recommended
    stars = [c for c in ax.collections if c.get_paths() and len(c.get_offsets()) == 1 and c.get_sizes()[0] > 200]
    (star,) = stars
    np.testing.assert_allclose(star.get_offsets()[0], (best.hours, best.usd), rtol=1e-12)
    drawable = [o for o in plan.options if math.isfinite(o.hours) and math.isfinite(o.usd)]
    points = {(round(x, 12), round(y, 12)) for x, y in _offsets(ax)}
    assert {(round(o.hours, 12), round(o.usd, 12)) for o in drawable} == points
    faint = [c for c in ax.collections if c.get_alpha() is not None and c.get_alpha() < 0.5]
    ruled_out = {(round(o.hours, 12), round(o.usd, 12)) for o in drawable if o.why_not}
    assert ruled_out and {(round(x, 12), round(y, 12)) for c in faint for x, y in c.get_offsets()} == ruled_out
    labels = [t.get_text() for t in ax.texts]
    assert any(t.startswith(f"recommended: lora, {best.setup.plan.num_gpus} x {best.setup.gpu.name}") for t in labels)


def test_axes_legend_and_label_stay_readable(figure) -> None:
    fig = figure.figure
    ax = fig.axes[0]
    assert "(h)" in ax.get_xlabel() and "(USD)" in ax.get_ylabel()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = ax.get_window_extent(renderer)
    legend = ax.get_legend().get_window_extent(renderer)
    assert legend.x0 >= box.x1  # beside the axes: it hides no setup
    (label,) = ax.texts
    text = matplotlib.text.Text.get_window_extent(label, renderer)
    assert box.x0 <= text.x0 and text.x1 <= box.x1 and box.y0 <= text.y0 and text.y1 <= box.y1


def test_a_plan_where_nothing_fits_is_omitted_with_the_reason(plan, tmp_path: Path) -> None:
    rows = [{**r, "hours": None, "usd": None, "on_front": False, "recommended": False} for r in plan_rows(plan)]
    write_records(tmp_path / "plan.jsonl", rows)
    reason = fig_plan(load_run(tmp_path))
    assert isinstance(reason, str) and "nothing to draw" in reason
