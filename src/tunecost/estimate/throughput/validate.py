"""Validation of the calibrated throughput model: in-sample errors, leave-one-group-out, leave-one-GPU-out.

Leave-one-group-out: for each (model, dataset, GPU) group, calibrate on every other group and predict the held-out
points as they were measured (same run length). This is the honest error for a workload the calibration has not
seen; `docs/throughput-model.md` reports it beside the paper's eq. (2), which cannot predict a held-out group at
all (its coefficients are fitted per group). Leave-one-GPU-out: calibrate without every point of one GPU and
predict them, the error of a GPU never measured.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tunecost.estimate.throughput.calibrate import MIN_POINTS, CalibratedModel, calibrate
from tunecost.estimate.throughput.targets import CalibrationPoint, group_of


@dataclass(frozen=True, kw_only=True)
class PointCheck:
    point: CalibrationPoint
    predicted_queries_per_s: float

    @property
    def error(self) -> float:
        """Signed relative error, predicted / measured - 1."""
        return self.predicted_queries_per_s / self.point.queries_per_s - 1.0


@dataclass(frozen=True, kw_only=True)
class GroupCheck:
    group: tuple[str, str, str]  # model, dataset (or seqN), GPU
    checks: tuple[PointCheck, ...]
    model: CalibratedModel  # the calibration that predicted them

    @property
    def mape(self) -> float:
        return mape(self.checks)

    @property
    def max_ape(self) -> float:
        return max(abs(c.error) for c in self.checks)


def mape(checks: Sequence[PointCheck]) -> float:
    return float(np.mean([abs(c.error) for c in checks])) if checks else float("nan")


def check_points(model: CalibratedModel, points: Sequence[CalibrationPoint]) -> list[PointCheck]:
    """Predict each point as measured (same run length) with `model`."""
    return [
        PointCheck(point=p, predicted_queries_per_s=model.predict(p.target, run_queries=p.run_queries).queries_per_s)
        for p in points
    ]


def leave_one_group_out(
    points: Sequence[CalibrationPoint], on_progress: Callable[[int, int, str], None] | None = None
) -> list[GroupCheck]:
    """Calibrate without each group in turn and predict it."""
    groups: dict[tuple[str, str, str], list[CalibrationPoint]] = defaultdict(list)
    for p in points:
        groups[group_of(p)].append(p)
    out = []
    for i, (key, held) in enumerate(sorted(groups.items())):
        if on_progress is not None:
            on_progress(i, len(groups), "/".join(key))
        rest = [p for p in points if group_of(p) != key]
        model = calibrate(rest, source=f"all but {'/'.join(key)}", transfer_check=False)
        out.append(GroupCheck(group=key, checks=tuple(check_points(model, held)), model=model))
    if on_progress is not None:
        on_progress(len(groups), len(groups), "done")
    return out


def leave_one_gpu_out(
    points: Sequence[CalibrationPoint], on_progress: Callable[[int, int, str], None] | None = None
) -> list[GroupCheck]:
    """Calibrate without each GPU in turn and predict its points: the error of moving to a GPU never measured.
    A GPU whose removal leaves fewer points than a calibration needs is skipped (named in no result)."""
    gpus = sorted({group_of(p)[2] for p in points})
    out = []
    for i, gpu in enumerate(gpus):
        if on_progress is not None:
            on_progress(i, len(gpus), gpu)
        held = [p for p in points if group_of(p)[2] == gpu]
        rest = [p for p in points if group_of(p)[2] != gpu]
        if len(rest) < MIN_POINTS or not rest:
            continue
        model = calibrate(rest, source=f"all but {gpu}", transfer_check=False)
        out.append(GroupCheck(group=("*", "*", gpu), checks=tuple(check_points(model, held)), model=model))
    if on_progress is not None:
        on_progress(len(gpus), len(gpus), "done")
    return out
