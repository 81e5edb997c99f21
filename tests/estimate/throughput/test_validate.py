"""Leave-one-group-out validation (tunecost.estimate.throughput.validate) on the paper's A40 points."""

from __future__ import annotations

import math
from pathlib import Path

from tunecost.estimate.throughput.sources import load_calibration_points
from tunecost.estimate.throughput.validate import check_points, group_of, leave_one_group_out, mape

PAPER_A40_CSV = Path(__file__).parents[2] / "fixtures" / "measurements" / "measured_throughput_a40.csv"


def test_leave_one_group_out_holds_out_each_group_once() -> None:
    points = load_calibration_points(PAPER_A40_CSV)
    progress: list[str] = []
    results = leave_one_group_out(points, on_progress=lambda done, total, label: progress.append(label))
    assert [r.group[:2] for r in results] == [
        ("blackmamba-2.8b", "commonsense_15k"),
        ("blackmamba-2.8b", "math_14k"),
        ("mixtral-8x7b", "commonsense_15k"),
        ("mixtral-8x7b", "math_14k"),
    ]
    assert sum(len(r.checks) for r in results) == len(points)
    for r in results:
        assert r.model.num_points == len(points) - len(r.checks)  # calibrated without the held-out group
        assert all(group_of(c.point) == r.group for c in r.checks)
        assert math.isfinite(r.mape) and 0 <= r.mape <= r.max_ape < 1.0
    assert progress[-1] == "done"


def test_check_points_errors_are_signed() -> None:
    from tunecost.estimate.throughput.calibrate import calibrate

    points = load_calibration_points(PAPER_A40_CSV)
    checks = check_points(calibrate(points), points)
    assert mape(checks) <= 0.08  # in-sample MAPE on the A40 points, as the validation reports it
    assert any(c.error > 0 for c in checks) and any(c.error < 0 for c in checks)
