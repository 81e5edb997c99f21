"""A job of a stack family nobody calibrated (`estimate.throughput.stack_priors`): its family's prior scales the
calibrated throughput, the held-out errors of that kind widen the interval, and the estimate says so."""

from __future__ import annotations

import math

import pytest

from tunecost.catalog.held_out_errors import (
    PRIOR_KIND,
    StackEfficiency,
    held_out_errors,
    quantity_class,
    stack_efficiencies,
)
from tunecost.errors import TunecostError
from tunecost.estimate import calibrated
from tunecost.estimate.throughput.stack_priors import (
    CALIBRATED_FAMILY,
    FRAMEWORK_FAMILIES,
    INTERVAL_KIND,
    family_efficiency,
    framework_family,
    job_family,
    model_kind,
    stack_prior,
)


@pytest.fixture
def batch_three(monkeypatch):
    """Every stack sizes batch 3 (the simulator's search has its own tests): the throughputs compare alike."""
    from tunecost.estimate.estimators import Sizing

    def fake(job, gpu, behaviour=None):
        return Sizing(max_batch_size=3, borderline_batch_size=3, note=f"sized on {job.stack}")

    monkeypatch.setattr(calibrated, "simulated_sizing", fake)


def _efficiency(stack: str, family: str, value: float) -> StackEfficiency:
    return StackEfficiency(stack=stack, stack_cell="", gpu="A100-80GB-SXM", family=family, gemm_efficiency=value)


def test_a_torchtune_job_gets_its_familys_prior_and_a_wider_interval(batch_three, make_request) -> None:
    # a full fine-tune: no adapters, whose dtype differs between the families (`counts`), so the counts agree
    hf = calibrated.calibrated_estimator(make_request(stack="hf-peft", method="full"))
    req = make_request(stack="torchtune", method="full")
    tt = calibrated.calibrated_estimator(req)
    prior = stack_prior("torchtune", kind=model_kind(req.job.model))
    assert prior is not None and prior.family == "torchtune" and prior.log_halfwidth > 0
    assert prior.note in tt.notes and not any("is not calibrated" in n for n in hf.notes)
    assert tt.queries_per_s == pytest.approx(hf.queries_per_s * prior.factor)
    (hf_low, hf_high), (tt_low, tt_high) = hf.queries_per_s_interval, tt.queries_per_s_interval
    assert tt_high / tt_low > hf_high / hf_low
    # widened in quadrature on the log scale
    assert math.log(tt_high / tt.queries_per_s) == pytest.approx(
        math.hypot(math.log(hf_high / hf.queries_per_s), prior.log_halfwidth)
    )
    (kinds,) = [n for n in tt.notes if n.startswith("95 % interval: ")]
    assert INTERVAL_KIND in kinds


def test_the_calibrated_family_is_as_calibrated(batch_three, make_request) -> None:
    for stack in ("tunecost", "hf-2024", "hf-peft"):
        assert job_family(stack) == CALIBRATED_FAMILY and stack_prior(stack) is None
        req = make_request(stack=stack)
        pred = calibrated.calibrated_model().predict(calibrated.request_target(req, 3))
        assert calibrated.for_job_software(req, pred) == (pred, None)
        point, tail = calibrated.calibrated_estimator(req), calibrated.stack_note(stack)
        assert list(point.notes[len(point.notes) - len(tail) :]) == tail
        assert not any("is not calibrated" in n for n in point.notes)
    assert stack_prior("hf-peft", "llamafactory") is None


def test_the_framework_of_a_config_picks_the_family() -> None:
    from tunecost.workload.frameworks.registry import frameworks

    assert {f.name for f in frameworks()} <= set(FRAMEWORK_FAMILIES)
    assert job_family("tunecost", "nemo") == "nemo-te"
    assert job_family("tunecost", "litgpt") == job_family("torchtune") == "torchtune"
    assert job_family("hf-peft", "hf-training-args+peft-lora+deepspeed") == CALIBRATED_FAMILY
    assert framework_family("accelerate+torchtune") == "torchtune"
    with pytest.raises(TunecostError, match="framework 'megatron-x'"):
        framework_family("megatron-x")


def test_a_family_with_no_group_falls_back_to_every_family() -> None:
    effs = [_efficiency("hf-trainer", "hf-eager", 0.9), _efficiency("unsloth", "fused-kernels", 0.5)]
    every, base = family_efficiency(effs, "nemo-te"), family_efficiency(effs, CALIBRATED_FAMILY)
    assert every is not None and base is not None and every.family == "every family" and every.groups == len(effs)
    prior = stack_prior("tunecost", "nemo", efficiencies=effs)
    assert prior is not None and "every family's median" in prior.note
    assert prior.factor == pytest.approx(every.value / base.value)
    own = stack_prior("tunecost", "nemo", efficiencies=[*effs, _efficiency("nemo", "nemo-te", 0.6)])
    assert own is not None and "its family's prior" in own.note and own.factor == pytest.approx(0.6 / 0.9)


def test_the_shipped_data_set_the_prior_and_its_interval() -> None:
    shipped = {e.family for e in stack_efficiencies()}
    missing = sorted(set(FRAMEWORK_FAMILIES.values()) - shipped)
    for family in missing:  # a family no shipped group has: every family's median, and the note says so
        framework = next(f for f, fam in FRAMEWORK_FAMILIES.items() if fam == family)
        prior = stack_prior("tunecost", framework)
        assert prior is not None and "every family's median" in prior.note
    rows = [e for e in held_out_errors() if e.kind == PRIOR_KIND and quantity_class(e.quantity) == "throughput"]
    for kind in ("dense", "moe"):  # each kind of model takes its own rows' errors
        mine = [e for e in rows if e.model_kind == kind]
        prior = stack_prior("torchtune", kind=kind)
        assert prior is not None and f"{len(mine)} held-out rows of {kind} models predicted" in prior.note
        assert prior.log_halfwidth <= max(abs(e.log_error) for e in mine)


def test_no_held_out_errors_leave_the_interval_as_it_is() -> None:
    prior = stack_prior("torchtune", errors=())
    assert prior is not None and prior.log_halfwidth == 0 and "not at all" in prior.note


def test_a_nemo_job_counts_transformer_engine_layers(batch_three, make_request) -> None:
    """A NeMo / Megatron-LM config's job runs Megatron Core's TE layers: its target counts their fused element-wise
    work (`counts.analytic_step_counts(te_layers=True)`); the calibrated family's does not."""
    nemo = calibrated.request_target(make_request(framework="nemo"), 3)
    hf = calibrated.request_target(make_request(framework="llamafactory"), 3)
    assert nemo.te_layers and not hf.te_layers
    assert nemo.lora_compute_dtype and not hf.lora_compute_dtype  # NeMo's adapters in the compute dtype
    tune = calibrated.request_target(make_request(framework="torchtune"), 3)
    assert tune.lora_compute_dtype and not tune.te_layers
    model = calibrated.calibrated_model()
    assert model.predict(nemo).queries_per_s > model.predict(hf).queries_per_s
