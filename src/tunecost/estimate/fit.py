"""Fitting eq. (2) to throughput measurements with scipy, one fit per (model, dataset, GPU) group.

Sources and derivations: docs/throughput-model.md, section `tunecost.estimate.fit`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tunecost.errors import TunecostError
from tunecost.estimate.measurements import Measurement
from tunecost.estimate.paper import EQ2_ARTIFACT_C3, throughput_eq2_artifact, throughput_eq2_printed

if TYPE_CHECKING:
    import numpy as np

Form = Literal["artifact", "printed"]
FORMS: tuple[str, ...] = ("artifact", "printed")
NUM_FREE_COEFFICIENTS = 2


@dataclass(frozen=True, kw_only=True)
class ThroughputFit:
    model: str
    dataset: str
    gpu: str
    form: str
    coefficients: dict[str, float]
    rmse: float  # queries/s, in-sample
    mape: float  # fraction, in-sample
    num_points: int
    batch_size_range: tuple[int, int]
    note: str

    def predict_queries_per_s(self, *, batch_size: float, sparsity: float) -> float:
        c = self.coefficients
        if self.form == "artifact":
            return throughput_eq2_artifact(batch_size=batch_size, sparsity=sparsity, a=c["a"], b=c["b"], c3=c["c3"])
        return throughput_eq2_printed(batch_size=batch_size, sparsity=sparsity, c2=c["C2"], c3=c["C3"], c4=c["C4"])


def default_c3(model: str) -> float:
    return EQ2_ARTIFACT_C3.get(model, 1.0)


def _linear_least_squares(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Fit y = p0 + p1 * x with scipy.optimize.curve_fit (both forms are linear in their free coefficients)."""
    import numpy as np
    from scipy.optimize import curve_fit

    params, _ = curve_fit(lambda xs, p0, p1: p0 + p1 * xs, x, y, p0=[float(np.mean(y)), 0.0])
    return float(params[0]), float(params[1])


def fit_group(points: Sequence[Measurement], form: Form = "artifact", c3: float | None = None) -> ThroughputFit:
    import numpy as np

    if form not in FORMS:
        raise TunecostError(f"unknown eq. (2) form {form!r}; choose one of {', '.join(FORMS)}")
    first = points[0]
    name = f"{first.model}/{first.dataset}/{first.gpu}"
    if len(points) <= NUM_FREE_COEFFICIENTS:
        raise TunecostError(
            f"group {name} has {len(points)} point(s): eq. (2) has {NUM_FREE_COEFFICIENTS} free coefficients "
            f"and needs at least {NUM_FREE_COEFFICIENTS + 1} points to fit"
        )
    if len({p.batch_size for p in points}) < 2:
        raise TunecostError(
            f"group {name}: every point has the same batch size; eq. (2) needs at least 2 distinct "
            "batch sizes to fit its slope"
        )
    c3 = default_c3(first.model) if c3 is None else c3
    batch = np.array([p.batch_size for p in points], dtype=float)
    sparsity = np.array([p.sparsity for p in points], dtype=float)
    y = np.array([p.queries_per_s for p in points], dtype=float)
    if form == "artifact":
        x = np.log(batch) / (sparsity * c3)
        a, b = _linear_least_squares(x, y)
        coefficients = {"a": a, "b": b, "c3": c3}
        note = f"artifact form a + b*log(B)/(sparsity*c3), c3={c3} fixed"
    else:
        x = np.log(batch / (sparsity * c3))
        c4, c2 = _linear_least_squares(x, y)
        coefficients = {"C2": c2, "C3": c3, "C4": c4}
        note = f"printed form C2*log(B/(sparsity*C3))+C4, C3={c3} fixed (not identifiable with C4)"
    fit = ThroughputFit(
        model=first.model,
        dataset=first.dataset,
        gpu=first.gpu,
        form=form,
        coefficients=coefficients,
        rmse=0.0,
        mape=0.0,
        num_points=len(points),
        batch_size_range=(int(batch.min()), int(batch.max())),
        note=note,
    )
    pred = np.array([fit.predict_queries_per_s(batch_size=p.batch_size, sparsity=p.sparsity) for p in points])
    rmse = math.sqrt(float(np.mean((pred - y) ** 2)))
    mape = float(np.mean(np.abs(pred - y) / y))
    return ThroughputFit(**{**fit.__dict__, "rmse": rmse, "mape": mape})


def group_measurements(points: Sequence[Measurement]) -> dict[tuple[str, str, str], list[Measurement]]:
    groups: dict[tuple[str, str, str], list[Measurement]] = defaultdict(list)
    for p in points:
        groups[(p.model, p.dataset, p.gpu)].append(p)
    return dict(sorted(groups.items()))


def fit_all(points: Sequence[Measurement], form: Form = "artifact") -> list[ThroughputFit]:
    """One fit per (model, dataset, GPU) group; a group with too few points is an error naming it."""
    if not points:
        raise TunecostError("no measurements to fit")
    return [fit_group(group, form) for group in group_measurements(points).values()]
