"""The embedded demo: every part of tunecost on built-in data, on a CPU, in minutes.

Stages write tidy records into one run directory (docs/dev/records.md); the report is built from them.
The demo adds no logic of its own: each stage calls the same library function as its CLI command.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tunecost.results.io import append_jsonl, atomic_write_json

ProgressFn = Callable[[int, int, str], None]

DEMO_GPUS = ("A40-48GB", "A100-40GB", "A100-80GB-SXM", "H100-80GB-SXM", "H200-141GB", "L40S-48GB")


@dataclass(frozen=True, kw_only=True)
class DemoStage:
    name: str
    description: str
    run: Callable[[Path, ProgressFn | None], None]


def _stage_fit(out: Path, on_progress: ProgressFn | None) -> None:
    """Eq. (2) refitted on the paper's A40 measurements (Fig. 14)."""
    from tunecost.estimate.fit import fit_all
    from tunecost.estimate.measurements import PAPER_A40_MEASUREMENTS, load_measurements

    points = load_measurements(PAPER_A40_MEASUREMENTS)
    path = out / "fit.jsonl"
    path.unlink(missing_ok=True)
    for p in points:
        append_jsonl(out / "fit.jsonl", {"schema_version": 1, "kind": "fit_point", **dataclasses.asdict(p),
                                         "source": "paper A40 measurements (bundled)"})
    for form in ("artifact", "printed"):
        for f in fit_all(points, form):  # type: ignore[arg-type]
            append_jsonl(path, {"schema_version": 1, "kind": "fit", **dataclasses.asdict(f)})


def _stage_estimate(out: Path, on_progress: ProgressFn | None) -> None:
    """Cost of fine-tuning the real Mixtral-8x7B (QLoRA) and BlackMamba-2.8B (full) on catalog GPUs."""
    from tunecost.catalog.models import model_catalog
    from tunecost.estimate.cost import estimate_costs
    from tunecost.estimate.estimators import estimator_names

    path = out / "estimate.jsonl"
    path.unlink(missing_ok=True)
    jobs = [("mixtral-8x7b", "qlora"), ("blackmamba-2.8b", "full")]
    jobs = [(m, meth) for m, meth in jobs if m in model_catalog()]
    names = [e for e in ("paper", "simulate", "calibrated") if e in estimator_names()]
    total = len(jobs) * len(names) * 2
    done = 0
    for model, method in jobs:
        for estimator in names:
            for k in (2, 8):
                rows = estimate_costs(model=model, gpus=list(DEMO_GPUS), epochs=10, dataset="math_14k",
                                      method=method, experts_per_token=k, estimator=estimator)
                for row in rows:
                    append_jsonl(path, {"schema_version": 1, "kind": "estimate", "experts_per_token": k,
                                        "method": method, **dataclasses.asdict(row)})
                done += 1
                if on_progress:
                    on_progress(done, total, f"estimate {model} top-{k} ({estimator})")


STAGES: tuple[DemoStage, ...] = (
    DemoStage(name="fit", description="fit eq. (2) to the paper's A40 measurements", run=_stage_fit),
    DemoStage(name="estimate", description="estimate costs on catalog GPUs", run=_stage_estimate),
)


def run_demo(out_dir: Path, *, on_stage: Callable[[DemoStage], None] | None = None,
             on_progress: ProgressFn | None = None) -> dict[str, float]:
    """Run every demo stage into `out_dir`; returns seconds per stage."""
    out_dir.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    for stage in STAGES:
        if on_stage:
            on_stage(stage)
        start = time.perf_counter()
        stage.run(out_dir, on_progress)
        seconds[stage.name] = time.perf_counter() - start
    atomic_write_json(out_dir / "demo.json", {"schema_version": 1, "stages_seconds": seconds})
    return seconds
