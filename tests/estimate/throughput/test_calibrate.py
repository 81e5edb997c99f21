"""Calibration and prediction (tunecost.estimate.throughput.calibrate), on the paper's A40 points and on
synthetic points made by a known set of parameters."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest

from tunecost.catalog.gpus import get_gpu
from tunecost.errors import TunecostError
from tunecost.estimate.throughput.calibrate import MIN_POINTS, CalibratedModel, calibrate
from tunecost.estimate.throughput.model import StackParams, catalog_gpu_terms, step_time
from tunecost.estimate.throughput.sources import load_calibration_points
from tunecost.estimate.throughput.targets import (
    CalibrationPoint,
    ThroughputTarget,
    job_for,
    run_queries_per_s,
    throughput_target,
)

# the paper's A40 points (verbatim copy under tests/fixtures, see tests/conftest.py)
PAPER_A40_CSV = Path(__file__).parents[2] / "fixtures" / "measurements" / "measured_throughput_a40.csv"

TRUTH = StackParams(
    gemm_efficiency=0.5, gemm_half_rows=100, memory_efficiency=0.8, kernel_overhead_s=2e-5, step_overhead_s=0.05
)
TRUTH_RUN_S = 20.0


@pytest.fixture(scope="module")
def paper_model() -> CalibratedModel:
    return calibrate(load_calibration_points(PAPER_A40_CSV), source="paper A40")


def _target(**kw) -> ThroughputTarget:
    return throughput_target(
        **{"model": "mixtral-8x7b", "gpu": "A40", "batch_size": 4, "experts_per_token": 2, "dataset": "math_14k", **kw}
    )


def _truth_point(target: ThroughputTarget) -> CalibrationPoint:
    _, counts = job_for(target)
    step = step_time(counts, catalog_gpu_terms(get_gpu(target.gpu)), TRUTH)
    return CalibrationPoint(
        target=target, queries_per_s=run_queries_per_s(step.step_s, target.job.batch_size, TRUTH_RUN_S, 1000)
    )


def test_paper_a40_points_in_sample_mape_at_most_8_percent(paper_model: CalibratedModel) -> None:
    assert paper_model.num_points == 54
    assert paper_model.in_sample_mape <= 0.08
    assert paper_model.gpus == ("A40-48GB",)
    assert set(paper_model.ranges) == {"mixtral-8x7b", "blackmamba-2.8b"}


def test_a40_prediction_in_range_has_an_interval_and_no_flag(paper_model: CalibratedModel) -> None:
    pred = paper_model.predict(_target(), run_queries=1000)
    assert pred.queries_per_s_low < pred.queries_per_s < pred.queries_per_s_high
    assert not pred.extrapolation and pred.extrapolation_reasons == ()
    assert pred.method == "qlora" and pred.experts_per_token == 2
    # the measured point (1.005 qps at batch 4) lies inside the 95 % interval
    assert pred.queries_per_s_low < 1.005 < pred.queries_per_s_high


def test_paper_observations_hold_in_the_calibrated_model(paper_model: CalibratedModel) -> None:
    a40 = [paper_model.predict(_target(batch_size=b, dataset="commonsense_15k")).queries_per_s for b in (1, 2, 4, 8)]
    gains = [b / a for a, b in itertools.pairwise(a40)]
    assert a40 == sorted(a40) and gains == sorted(gains, reverse=True)  # Takeaway 5: saturation
    for b in (1, 2):  # Takeaway 4: sparse beats dense at the same batch
        assert (
            paper_model.predict(_target(batch_size=b, experts_per_token=2)).queries_per_s
            > paper_model.predict(_target(batch_size=b, experts_per_token=8)).queries_per_s
        )
    # the H100 is nowhere near its datasheet ratio over the A40 (6.6x bf16 peak, 4.8x bandwidth)
    ratio = paper_model.predict(_target(gpu="H100")).queries_per_s / paper_model.predict(_target()).queries_per_s
    assert 1.0 < ratio < 4.8


def test_other_gpu_and_far_batch_are_flagged(paper_model: CalibratedModel) -> None:
    pred = paper_model.predict(_target(gpu="H100", batch_size=64))
    assert pred.extrapolation and pred.gpu == "H100-80GB-SXM"
    text = "; ".join(pred.extrapolation_reasons)
    assert "cross-GPU" in text and "batch 64 outside calibrated 1..8" in text and "far outside" in text
    assert paper_model.predict(_target(method="full")).extrapolation_reasons[0].startswith("method full")


def test_unknown_gpu_and_model_are_clear_errors(paper_model: CalibratedModel) -> None:
    with pytest.raises(TunecostError, match=r"unknown GPU 'H900'.*Valid choices"):
        paper_model.predict(_target(gpu="H900"))
    with pytest.raises(TunecostError, match=r"unknown model 'mixtral-9x9b'"):
        paper_model.predict(_target(model="mixtral-9x9b"))
    with pytest.raises(TunecostError, match="give a dataset or a seq_len"):
        _target(dataset=None)


def test_too_few_points_is_a_clear_error(write_file) -> None:
    one = write_file(
        "one.csv",
        "model,dataset,gpu,experts_per_token,batch_size,queries_per_s\nmixtral-8x7b,math_14k,A40-48GB,2,1,0.33\n",
    )
    with pytest.raises(TunecostError, match=rf"at least {MIN_POINTS} measurements .* got 1"):
        calibrate(load_calibration_points(one))


def test_optional_method_and_run_length_columns(write_file) -> None:
    path = write_file(
        "m.csv",
        "model,dataset,gpu,experts_per_token,batch_size,queries_per_s,method,num_queries\n"
        "mixtral-8x7b,math_14k,A40,2,1,0.33,lora,500\n",
    )
    (point,) = load_calibration_points(path)
    assert point.target.job.method == "lora" and point.run_queries == 500


def test_known_parameters_are_recovered_and_transfer_across_gpus() -> None:
    """Points generated by the model itself with known parameters: calibration on A40 points only must reproduce
    them and predict other GPUs (where the truth is known by construction)."""
    targets = [
        _target(batch_size=b, experts_per_token=k, dataset="commonsense_15k")
        for k, batches in ((2, range(1, 7)), (8, (1, 2)))
        for b in batches
    ]
    targets += [_target(model="blackmamba-2.8b", batch_size=b) for b in range(1, 9)]
    model = calibrate([_truth_point(t) for t in targets])
    assert model.in_sample_mape < 0.01
    for gpu in ("H100", "A100-80GB"):
        for batch in (4, 16):
            target = _target(gpu=gpu, batch_size=batch)
            truth = _truth_point(target).queries_per_s
            assert model.predict(target, run_queries=1000).queries_per_s == pytest.approx(truth, rel=0.06)


def test_steady_state_excludes_the_run_overhead(paper_model: CalibratedModel) -> None:
    steady = paper_model.predict(_target()).queries_per_s
    measured_run = paper_model.predict(_target(), run_queries=1000).queries_per_s
    assert steady > measured_run
    assert steady == pytest.approx(4 / paper_model.predict(_target()).step.step_s)


def test_bundled_and_fixture_copies_agree() -> None:
    from tunecost.estimate.measurements import PAPER_A40_MEASUREMENTS

    strip = lambda p: [line for line in Path(p).read_text().splitlines() if not line.startswith("#")]  # noqa: E731
    assert strip(PAPER_A40_MEASUREMENTS) == strip(PAPER_A40_CSV)


def test_a_methods_own_fit_speaks_only_for_the_models_it_measured(paper_model: CalibratedModel) -> None:
    """The paper measured each method on one model (QLoRA: Mixtral, full: BlackMamba), so a method's own fit cannot
    tell the method from the model: another model gets the fit of all points whatever its method, and its LoRA,
    which does less work than its full fine-tune, is not priced slower than it."""
    assert set(paper_model.stacks) == {"full", "qlora"}
    shared = dataclasses.replace(paper_model, stacks={})
    mixtral = _target()
    assert paper_model.predict(mixtral).queries_per_s != shared.predict(mixtral).queries_per_s
    assert paper_model.method_fit(job_for(mixtral)[0]) is paper_model.stacks["qlora"]
    dense = {"model": "llama-3.1-8b", "dataset": None, "seq_len": 1024, "batch_size": 1}
    qps = {m: paper_model.predict(_target(**dense, method=m)).queries_per_s for m in ("lora", "qlora", "full")}
    for method, value in qps.items():
        assert value == shared.predict(_target(**dense, method=method)).queries_per_s
    assert qps["lora"] > qps["full"] and qps["lora"] > qps["qlora"]
