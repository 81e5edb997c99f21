"""Eq. (2) fits (tunecost.estimate.fit) on the paper's A40 measurements and on synthetic data."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from tunecost.errors import TunecostError
from tunecost.estimate.fit import fit_all, fit_group, group_measurements
from tunecost.estimate.measurements import PAPER_A40_MEASUREMENTS, Measurement, load_measurements

GROUPS = {
    ("blackmamba-2.8b", "commonsense_15k", "A40-48GB"): 26,
    ("blackmamba-2.8b", "math_14k", "A40-48GB"): 13,
    ("mixtral-8x7b", "commonsense_15k", "A40-48GB"): 10,
    ("mixtral-8x7b", "math_14k", "A40-48GB"): 5,
}  # points per group, counted in the paper artifact's A40 measurements (tests/fixtures/measurements)


@pytest.fixture
def paper_points(paper_a40_csv: Path) -> list[Measurement]:
    return load_measurements(paper_a40_csv)


def _by_group(fits):
    return {(f.model, f.dataset, f.gpu): f for f in fits}


def test_artifact_fit_reproduces_paper_rmse(paper_points) -> None:
    """The artifact's fit gives in-sample RMSE 0.055 (Mixtral CS) and 0.022 (Mixtral MATH) on these points."""
    fits = _by_group(fit_all(paper_points, "artifact"))
    assert {k: f.num_points for k, f in fits.items()} == GROUPS  # all four groups fitted
    cs = fits[("mixtral-8x7b", "commonsense_15k", "A40-48GB")]
    math_ = fits[("mixtral-8x7b", "math_14k", "A40-48GB")]
    assert cs.rmse == pytest.approx(0.055, abs=0.005)
    assert math_.rmse == pytest.approx(0.022, abs=0.003)
    for fit in fits.values():
        assert fit.form == "artifact"
        assert set(fit.coefficients) == {"a", "b", "c3"}
        assert fit.coefficients["b"] > 0  # throughput grows with batch size
        assert 0 <= fit.mape < 1 and fit.rmse > 0
    # c3 fixed per model (the artifact's eq. (2) fit): 1.8 Mixtral, 2.5 BlackMamba
    assert cs.coefficients["c3"] == 1.8
    assert fits[("blackmamba-2.8b", "math_14k", "A40-48GB")].coefficients["c3"] == 2.5
    assert cs.batch_size_range == (1, 8)
    assert math_.batch_size_range == (1, 4)


def test_rmse_and_mape_are_in_sample(paper_points) -> None:
    for fit in fit_all(paper_points, "artifact"):
        group = [p for p in paper_points if (p.model, p.dataset, p.gpu) == (fit.model, fit.dataset, fit.gpu)]
        pred = np.array([fit.predict_queries_per_s(batch_size=p.batch_size, sparsity=p.sparsity) for p in group])
        y = np.array([p.queries_per_s for p in group])
        assert fit.rmse == pytest.approx(math.sqrt(np.mean((pred - y) ** 2)), rel=1e-12)
        assert fit.mape == pytest.approx(np.mean(np.abs(pred - y) / y), rel=1e-12)


def test_packaged_measurements_equal_the_papers(paper_points) -> None:
    # The catalog ships a copy of the paper's CSV (with a comment line); it must hold the same points.
    assert load_measurements(PAPER_A40_MEASUREMENTS) == paper_points


def test_printed_form_equals_free_three_parameter_fit(paper_points) -> None:
    """With C3 fixed, the printed form spans the same family as a free (C2, C3, C4) fit: C2*log(1/C3) is a
    constant that C4 absorbs. So the in-sample RMSE of both must agree."""
    from scipy.optimize import OptimizeWarning, curve_fit

    def printed(xs, c2, c3, c4):
        batch, sparsity = xs
        return c2 * np.log(batch / (sparsity * c3)) + c4

    for fit in fit_all(paper_points, "printed"):
        assert set(fit.coefficients) == {"C2", "C3", "C4"}
        group = [p for p in paper_points if (p.model, p.dataset, p.gpu) == (fit.model, fit.dataset, fit.gpu)]
        xs = (np.array([p.batch_size for p in group], float), np.array([p.sparsity for p in group], float))
        y = np.array([p.queries_per_s for p in group])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OptimizeWarning)  # C3 and C4 are not separately identifiable
            params, _ = curve_fit(
                printed,
                xs,
                y,
                p0=[1.0, 1.0, float(y.mean())],
                bounds=([-np.inf, 1e-6, -np.inf], [np.inf, np.inf, np.inf]),
            )
        free_rmse = math.sqrt(float(np.mean((printed(xs, *params) - y) ** 2)))
        assert fit.rmse == pytest.approx(free_rmse, rel=1e-4, abs=1e-6), fit.model + "/" + fit.dataset


def _synthetic(model: str, values) -> list[Measurement]:
    return [
        Measurement(
            model=model, dataset="d", gpu="g", experts_per_token=k, sparsity=k / 8, batch_size=b, queries_per_s=q
        )
        for k, b, q in values
    ]


def test_artifact_fit_recovers_known_coefficients() -> None:
    a, b, c3 = 0.4, 0.3, 1.8  # mixtral-8x7b's fixed c3
    values = [(k, batch, a + b * math.log(batch) / ((k / 8) * c3)) for k in (2, 8) for batch in (1, 2, 3, 5, 8)]
    fit = fit_group(_synthetic("mixtral-8x7b", values), "artifact")
    assert fit.coefficients["a"] == pytest.approx(a, abs=1e-8)
    assert fit.coefficients["b"] == pytest.approx(b, abs=1e-8)
    assert fit.rmse == pytest.approx(0.0, abs=1e-8)
    assert fit.mape == pytest.approx(0.0, abs=1e-8)


def test_printed_fit_recovers_known_coefficients() -> None:
    c2, c3, c4 = 0.5, 2.5, 1.2  # blackmamba-2.8b's fixed C3
    values = [(k, batch, c2 * math.log(batch / ((k / 8) * c3)) + c4) for k in (2, 8) for batch in (1, 2, 4, 7)]
    fit = fit_group(_synthetic("blackmamba-2.8b", values), "printed")
    assert fit.coefficients["C2"] == pytest.approx(c2, abs=1e-8)
    assert fit.coefficients["C3"] == 2.5
    assert fit.coefficients["C4"] == pytest.approx(c4, abs=1e-8)
    assert fit.rmse == pytest.approx(0.0, abs=1e-8)
    # Given another C3, C4 absorbs C2*log(c3/C3) and the fit is as exact (C3 is not identifiable).
    other = fit_group(_synthetic("blackmamba-2.8b", values), "printed", c3=1.0)
    assert other.coefficients["C2"] == pytest.approx(c2, abs=1e-8)
    assert other.coefficients["C4"] == pytest.approx(c4 - c2 * math.log(c3 / 1.0), abs=1e-8)
    assert other.rmse == pytest.approx(0.0, abs=1e-8)


def test_unknown_model_gets_c3_one() -> None:
    values = [(2, batch, 1.0 + 0.1 * math.log(batch) / 0.25) for batch in (1, 2, 4)]
    fit = fit_group(_synthetic("my-model", values), "artifact")
    assert fit.coefficients["c3"] == 1.0
    assert fit.coefficients["b"] == pytest.approx(0.1, abs=1e-8)


def test_too_few_points_names_the_group() -> None:
    ok = _synthetic("m", [(2, 1, 1.0), (2, 2, 1.5), (2, 4, 1.9)])
    short = [
        Measurement(
            model="m", dataset="tiny", gpu="L4", experts_per_token=2, sparsity=0.25, batch_size=b, queries_per_s=q
        )
        for b, q in ((1, 1.0), (2, 1.4))
    ]
    with pytest.raises(TunecostError, match=r"group m/tiny/L4 has 2 point\(s\).*at least 3 points"):
        fit_all(ok + short, "artifact")
    assert len(fit_all(ok, "artifact")) == 1


def test_no_points_and_unknown_form() -> None:
    with pytest.raises(TunecostError, match="no measurements"):
        fit_all([], "artifact")
    pts = _synthetic("m", [(2, 1, 1.0), (2, 2, 1.5), (2, 4, 1.9)])
    with pytest.raises(TunecostError, match="artifact, printed"):
        fit_all(pts, "quadratic")  # type: ignore[arg-type]


def test_group_measurements_keys_sorted(paper_points) -> None:
    groups = group_measurements(paper_points)
    assert list(groups) == sorted(GROUPS)
    assert {k: len(v) for k, v in groups.items()} == GROUPS
