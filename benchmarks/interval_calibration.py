"""How well the 95 % intervals are calibrated: nominal level against the share of held-out measurements inside.

    PYTHONPATH=src .venv/bin/python benchmarks/interval_calibration.py [--plot docs/img/interval_calibration.png]

- validate (shipped corpus): each row's interval at levels 50-99 % from the held-out errors of other rows
  (validate.intervals), per quantity class, and of every throughput row predicted from its stack family's prior
  (its own stack left out), per kind of model;
- the throughput model (bundled A40 and A100-40GB points): each (model, dataset, GPU) group predicted by a
  calibration without it, whose own held-out checks set the interval (nested leave-one-group-out), at 95 %; and each
  model's batches above 4 predicted by a calibration without them (the batch term beyond its held-out reach).
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

from tunecost.catalog.held_out_errors import MODEL_KINDS, held_out_errors, quantity_class
from tunecost.estimate.measurements import BUNDLED_MEASUREMENTS
from tunecost.estimate.throughput.calibrate import calibrate
from tunecost.estimate.throughput.sources import load_calibration_points
from tunecost.estimate.throughput.targets import group_of
from tunecost.validate import read_corpus, validate_rows
from tunecost.validate.intervals import with_intervals
from tunecost.validate.summary import interval_coverage

LEVELS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)


def _classes(rows) -> list[str]:
    return sorted({quantity_class(r.quantity) for r in rows if r.inside is not None})


def validate_coverage() -> dict[str, list[tuple[float, float, int, float]]]:
    """Per quantity class: (level, coverage, rows, median half-width %) at each level."""
    rows = validate_rows(read_corpus(None), held_out=())
    priors = [r for r in validate_rows(read_corpus(None), held_out=(), prior_only=True) if r.prior]
    errors = held_out_errors()
    out: dict[str, list[tuple[float, float, int, float]]] = {}
    for level in LEVELS:
        judged = with_intervals(rows, errors, level)
        classes = {kind: [r for r in judged if quantity_class(r.quantity) == kind] for kind in _classes(judged)}
        for model_kind in MODEL_KINDS:  # every throughput row predicted from its family's prior, per kind of model
            mine = [r for r in with_intervals(priors, errors, level) if r.model_kind == model_kind]
            classes[f"stack prior, {model_kind}"] = mine
        for kind, members in classes.items():
            c = interval_coverage(members)
            out.setdefault(kind, []).append(
                (
                    level,
                    float(c["coverage_pct"] or 0) / 100,
                    int(c["with_interval"] or 0),
                    float(c["median_halfwidth_pct"] or 0),
                )
            )
    return out


def throughput_model_coverage() -> list[tuple[tuple[str, str, str], int, int, float, str]]:
    """Nested leave-one-group-out: (group, points, inside, median half-width %, interval kinds) at 95 %."""
    points = [p for f in BUNDLED_MEASUREMENTS for p in load_calibration_points(f)]
    out = []
    for key in sorted({group_of(p) for p in points}):
        held = [p for p in points if group_of(p) == key]
        model = calibrate([p for p in points if group_of(p) != key], source="all but " + "/".join(key))
        inside, widths, kinds = 0, [], ""
        for p in held:
            pred = model.predict(p.target, run_queries=p.run_queries)
            inside += pred.queries_per_s_low <= p.queries_per_s <= pred.queries_per_s_high
            widths.append(100 * (pred.queries_per_s_high / pred.queries_per_s - 1))
            kinds = ", ".join(k for k, _, _ in pred.interval_parts)
        out.append((key, len(held), inside, statistics.median(widths), kinds))
    return out


def batch_reach_coverage(cut: int = 4) -> list[tuple[str, int, int, int, float, float, float]]:
    """Each model's batches above `cut` held out and predicted by a calibration on the rest, whose own held-out
    checks (its larger batches held out) set the interval: (model, points, inside, inside had the batch term stayed
    flat beyond its held-out reach, median half-width %, largest error %, farthest e-folds of batch beyond) at 95 %."""
    points = [p for f in BUNDLED_MEASUREMENTS for p in load_calibration_points(f)]
    out = []
    for name in sorted({p.target.job.model for p in points}):
        held = [p for p in points if p.target.job.model == name and p.target.job.batch_size > cut]
        model = calibrate([p for p in points if p not in held], source=f"all but {name} batches above {cut}")
        reach = max(model.evidence.batch.distances) if model.evidence and model.evidence.batch else 0.0
        inside, flat_inside, widths, errors = 0, 0, [], []
        for p in held:
            pred = model.predict(p.target, run_queries=p.run_queries)
            inside += pred.queries_per_s_low <= p.queries_per_s <= pred.queries_per_s_high
            d = math.log(p.target.job.batch_size / cut)
            scale = max(1.0, d / reach) if reach else 1.0
            flat = [h / scale if kind == "batch beyond calibrated" else h for kind, h, _ in pred.interval_parts]
            flat_inside += abs(math.log(pred.queries_per_s / p.queries_per_s)) <= math.hypot(*flat)
            widths.append(100 * (pred.queries_per_s_high / pred.queries_per_s - 1))
            errors.append(100 * (pred.queries_per_s / p.queries_per_s - 1))
        far = max(math.log(p.target.job.batch_size / cut) for p in held)
        out.append((name, len(held), inside, flat_inside, statistics.median(widths), max(errors, key=abs), far))
    return out


def widths_table() -> None:
    """Mixtral-8x7B math, 1000-query runs: the 95 % half-width on the A100-80GB and H100, calibrated on both bundled
    GPUs and on the A40 alone (the A40-only calibration borrows the bundled transfer errors)."""
    from tunecost.estimate.throughput.sources import calibrate_files
    from tunecost.estimate.throughput.targets import throughput_target

    for files in (list(BUNDLED_MEASUREMENTS), [f for f in BUNDLED_MEASUREMENTS if "a40" in f.name]):
        model = calibrate_files(files)
        cells = []
        for gpu, batch in (
            ("A100-80GB", 1),
            ("A100-80GB", 8),
            ("A100-80GB", 17),
            ("H100", 1),
            ("H100", 4),
            ("H100", 17),
        ):
            pred = model.predict(
                throughput_target(model="mixtral-8x7b", gpu=gpu, batch_size=batch, dataset="math_14k"), run_queries=1000
            )
            cells.append(f"{gpu} b{batch} ±{100 * (pred.queries_per_s_high / pred.queries_per_s - 1):.1f} %")
        print(f"  {' + '.join(f.name for f in files)}: " + ", ".join(cells))


def plot(curves: dict[str, list[tuple[float, float, int, float]]], model_cover: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    ax.plot([0.45, 1.0], [0.45, 1.0], color="0.6", linestyle="--", label="calibrated")
    for kind, pts in curves.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"validate: {kind} ({pts[0][2]} rows)")
    ax.plot(
        [0.95],
        [model_cover],
        marker="*",
        markersize=14,
        linestyle="",
        color="black",
        label="throughput model, nested leave-one-group-out",
    )
    ax.set_xlabel("nominal level of the interval")
    ax.set_ylabel("held-out measurements inside")
    ax.set_xlim(0.45, 1.0)
    ax.set_ylim(0.3, 1.02)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("Interval calibration (held out)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args(argv)
    curves = validate_coverage()
    print("validate, held-out intervals per quantity class: level -> coverage (median half-width)")
    for kind, pts in curves.items():
        cells = "  ".join(f"{100 * lv:.0f}%: {100 * c:.1f} (±{w:.0f} %)" for lv, c, _, w in pts)
        print(f"  {kind:21s} n={pts[0][2]:3d}  {cells}")
    print("throughput model, 95 % half-widths of Mixtral-8x7B math on GPUs outside the calibration:")
    widths_table()
    print("throughput model, nested leave-one-group-out at 95 %:")
    groups = throughput_model_coverage()
    for key, n, inside, width, kinds in groups:
        print(f"  {'/'.join(key):40s} {inside:2d} of {n:2d} inside, median ±{width:.1f} %  ({kinds})")
    total, inside = sum(g[1] for g in groups), sum(g[2] for g in groups)
    print(f"  all: {inside} of {total} inside ({100 * inside / total:.1f} %)")
    print("throughput model, each model's batches above 4 held out at 95 % (its calibration's own batch check):")
    for name, n, ins, flat, width, worst, far in batch_reach_coverage():
        print(
            f"  {name:40s} {ins:2d} of {n:2d} inside ({flat} with the batch term flat beyond its held-out reach), "
            f"median ±{width:.1f} %, largest error {worst:+.0f} %, up to {far:.2f} e-folds of batch beyond"
        )
    if args.plot:
        plot(curves, inside / total, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
