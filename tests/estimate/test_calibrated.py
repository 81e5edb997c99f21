"""The `calibrated` estimator (tunecost.estimate.calibrated) through the registry and the cost table."""

from __future__ import annotations

import pytest

from tunecost.errors import TunecostError
from tunecost.estimate import calibrated
from tunecost.estimate.cost import estimate_costs, estimate_job
from tunecost.estimate.estimators import EstimatorOptions, estimator_names, get_estimator

MEASUREMENTS_HEADER = "model,dataset,gpu,experts_per_token,batch_size,queries_per_s\n"


@pytest.fixture
def no_simulator(monkeypatch):
    """Size batches with eq. (1): the simulator's search takes minutes per GPU (its own tests cover it)."""

    def unavailable(req):
        raise TunecostError("no step simulator here")

    monkeypatch.setattr(calibrated, "_simulated_sizing", unavailable)


def fake_sizing(calls: list, batch: int):
    """A stand-in for the simulator's sizing that records (model, GPU, stack, behaviour) and answers `batch`."""
    from tunecost.estimate.estimators import Sizing
    from tunecost.estimate.simulated import sizing_note
    from tunecost.simulate.behaviour import DEFAULT_BEHAVIOUR

    def fake(job, gpu, behaviour=DEFAULT_BEHAVIOUR):
        calls.append((job.model, gpu.name, job.stack, behaviour))
        return Sizing(max_batch_size=batch, borderline_batch_size=batch, note=sizing_note(job, gpu, behaviour))

    return fake


def test_registered_with_a_description() -> None:
    assert "calibrated" in estimator_names()
    assert get_estimator("calibrated") is calibrated.calibrated_estimator


def test_estimates_every_gpu_from_the_a40_calibration(no_simulator, make_request) -> None:
    for gpu in ("A40", "A100-80GB", "H100"):
        point = calibrated.calibrated_estimator(make_request(gpu))
        assert point.max_batch_size >= 1 and point.queries_per_s > 0
        lo, hi = point.queries_per_s_interval
        assert lo < point.queries_per_s < hi
        assert any("eq. (1)" in n for n in point.notes)
        if gpu != "A40":
            assert any("cross-GPU transfer" in n for n in point.notes)


def test_cost_table_with_the_calibrated_estimator(no_simulator) -> None:
    job = estimate_job("mixtral-8x7b", dataset="math_14k", experts_per_token=2)
    rows = estimate_costs(job, ["A40", "H100"], epochs=10, options=EstimatorOptions(name="calibrated"))
    assert {r.gpu for r in rows} == {"A40-48GB", "H100-80GB-SXM"}
    for r in rows:
        assert r.estimator == "calibrated" and r.queries_per_s_low < r.queries_per_s < r.queries_per_s_high


def test_own_calibration_file_replaces_the_default(no_simulator, write_file, make_request) -> None:
    from tunecost.estimate.measurements import PAPER_A40_MEASUREMENTS

    rows = [line for line in PAPER_A40_MEASUREMENTS.read_text().splitlines()[2:] if "blackmamba" in line]
    path = write_file(
        "bm.csv", "model,dataset,gpu,experts_per_token,sparsity,batch_size,queries_per_s\n" + "\n".join(rows) + "\n"
    )
    point = calibrated.calibrated_estimator(make_request(calibrate=(path,)))
    assert any(f"{len(rows)} points of {path.name}" in n for n in point.notes)
    assert any("model mixtral-8x7b not in the calibration" in n for n in point.notes)
    with pytest.raises(TunecostError, match="calibration file not found"):
        calibrated.calibrated_estimator(make_request(calibrate=(path.with_name("missing.csv"),)))


def test_uses_the_simulator_when_it_answers(monkeypatch, make_request) -> None:
    calls: list = []
    monkeypatch.setattr(calibrated, "simulated_sizing", fake_sizing(calls, 3))
    point = calibrated.calibrated_estimator(make_request())
    assert point.max_batch_size == 3 and [c[:3] for c in calls] == [("mixtral-8x7b", "A40-48GB", "tunecost")]
    assert "step simulator (tunecost stack" in point.notes[0]


def test_the_stack_the_user_names_sizes_the_batch(monkeypatch, make_request) -> None:
    """`estimate --stack S`: the simulator sizes the batch on S, and the note names S, checkpointing and margin."""
    calls: list = []
    monkeypatch.setattr(calibrated, "simulated_sizing", fake_sizing(calls, 5))
    point = calibrated.calibrated_estimator(make_request(stack="hf-peft"))
    assert point.max_batch_size == 5 and [c[2] for c in calls] == ["hf-peft"]
    assert "step simulator (hf-peft stack, 512 tokens per query, gradient checkpointing on; " in point.notes[0]
    assert "safety margin against 44.34 GiB, the total CUDA reports (datasheet 48 GB)" in point.notes[0]


def test_the_stacks_recipe_options_size_the_batch(monkeypatch, make_request) -> None:
    """`estimate --stack torchtune --chunked-loss`: the options reach the simulator and the note names them."""
    from tunecost.simulate.behaviour import LOSS_TORCHTUNE_CHUNKED, StackBehaviour

    calls: list = []
    monkeypatch.setattr(calibrated, "simulated_sizing", fake_sizing(calls, 7))
    chunked = StackBehaviour(loss_code=LOSS_TORCHTUNE_CHUNKED)
    point = calibrated.calibrated_estimator(make_request(stack="torchtune", behaviour=chunked))
    assert point.max_batch_size == 7 and [(c[2], c[3]) for c in calls] == [("torchtune", chunked)]
    assert "torchtune stack" in point.notes[0] and "CEWithChunkedOutputLoss" in point.notes[0]


def test_model_without_batch_model_is_a_clear_error(monkeypatch, make_request) -> None:
    def refuse(job, gpu, behaviour=None):
        raise TunecostError(f"{job.model}: not simulated")

    monkeypatch.setattr(calibrated, "simulated_sizing", refuse)
    with pytest.raises(TunecostError, match=r"no maximum batch size for olmoe-1b-7b: .*not simulated.*eq\. \(1\)"):
        calibrated.calibrated_estimator(make_request(model="olmoe-1b-7b"))


def test_a_stack_the_calibration_did_not_measure_is_said() -> None:
    from tunecost.estimate.calibrated import PAPER_STACK, stack_note

    assert stack_note(PAPER_STACK) == []
    (note,) = stack_note("torchtune")
    assert "the job's stack torchtune was not measured" in note and PAPER_STACK in note
