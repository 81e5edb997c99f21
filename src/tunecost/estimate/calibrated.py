"""The `calibrated` estimator: the cross-GPU throughput model (`throughput.model`) at the maximum batch size.

`tunecost estimate --estimator calibrated [--calibrate FILE]`. Calibration: FILE when given (it replaces the
default), else the bundled copy of the paper's A40 measurements. The maximum batch size comes from the step
simulator (`tunecost.simulate.simulated_max_batch_size`, at --seq-len or the paper's 512 tokens per query; it
simulates each candidate batch, so allow tens of seconds per GPU the first time), else from the paper's eq. (1)
where it has coefficients (Mixtral-8x7B, BlackMamba-2.8B); the note on each row says which. The throughput is the
steady-state one (no per-run start-up), with the calibration's prediction interval.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from tunecost.errors import TunecostError
from tunecost.estimate.estimators import EstimatePoint, EstimateRequest, paper_max_batch_size, register_estimator
from tunecost.estimate.measurements import PAPER_A40_MEASUREMENTS
from tunecost.estimate.paper import EQ1_ARTIFACT_SEQ_LEN
from tunecost.estimate.throughput.calibrate import CalibratedModel, ThroughputTarget, calibrate_file

ESTIMATOR_NAME = "calibrated"
SIMULATOR_STACKS = ("hf-2024", "tunecost")  # the paper's stack first: the throughput model describes it


@lru_cache(maxsize=8)
def _calibrated(path: str, mtime_ns: int) -> CalibratedModel:
    return calibrate_file(path)


def calibrated_model(path: str | Path | None = None) -> CalibratedModel:
    """The calibration of `path` (default: the paper's A40 measurements), cached per file version."""
    path = Path(path) if path is not None else PAPER_A40_MEASUREMENTS
    if not path.is_file():
        raise TunecostError(f"calibration file not found: {path}")
    return _calibrated(str(path.resolve()), path.stat().st_mtime_ns)


def _simulated_max_batch(req: EstimateRequest) -> tuple[int, str] | None:
    """The step simulator's answer when it exists: the paper's stack ("hf-2024") first, as the throughput model
    describes that stack, else tunecost's own. None when there is no simulator."""
    try:
        from tunecost.simulate import simulated_max_batch_size
    except ImportError:
        return None
    from tunecost.workload.job import FineTuneJob

    seq_len = req.seq_len or EQ1_ARTIFACT_SEQ_LEN
    job = FineTuneJob(
        model=req.spec.name,
        method=req.method,  # type: ignore[arg-type]
        experts_per_token=req.experts_per_token,
        seq_len=seq_len,
        gradient_checkpointing=req.method != "full",
    )
    errors = []
    for stack in SIMULATOR_STACKS:
        try:
            mbs = int(simulated_max_batch_size(job, req.gpu, stack=stack))
        except TunecostError as exc:  # e.g. a stack that does not support this model
            errors.append(f"{stack}: {exc}")
            continue
        return mbs, f"max batch size from the step simulator ({stack} stack, {seq_len} tokens per query)"
    raise TunecostError("the step simulator could not size a batch: " + "; ".join(errors))


def max_batch_size_for(req: EstimateRequest) -> tuple[int, str]:
    """(max batch size, where it came from): the simulator, else eq. (1); both failing is one error."""
    try:
        simulated = _simulated_max_batch(req)
    except TunecostError as exc:
        simulated, why = None, str(exc)
    else:
        why = "no step simulator installed"
    if simulated is not None:
        return simulated
    try:
        mbs, note = paper_max_batch_size(req)
    except TunecostError as exc:
        raise TunecostError(f"no maximum batch size for {req.spec.name}: {why}; and {exc}") from None
    return mbs, f"{note} ({why})"


@register_estimator(
    ESTIMATOR_NAME,
    "cross-GPU throughput model (rooflines per op class + overheads) calibrated on "
    "measurements (default: the paper's A40 data); max batch from the simulator or "
    "eq. (1)",
)
def calibrated_estimator(req: EstimateRequest) -> EstimatePoint:
    model = calibrated_model(req.calibrate)
    mbs, mbs_note = max_batch_size_for(req)
    if mbs < 1:
        return EstimatePoint(
            max_batch_size=0, batch_size=0, queries_per_s=None, notes=(mbs_note, "does not fit: no room for a batch")
        )
    target = ThroughputTarget(
        model=req.spec.name,
        gpu=req.gpu.name,
        batch_size=mbs,
        experts_per_token=req.experts_per_token,
        dataset=None if req.seq_len else req.dataset,
        seq_len=req.seq_len,
        method=req.method,
    )
    pred = model.predict(target)
    notes = [
        mbs_note,
        f"calibrated on {model.num_points} points of {model.source} "
        f"(in-sample MAPE {100 * model.in_sample_mape:.1f} %); steady-state throughput",
    ]
    if pred.extrapolation:
        notes.append("extrapolation: " + "; ".join(pred.extrapolation_reasons))
    return EstimatePoint(
        max_batch_size=mbs,
        batch_size=mbs,
        queries_per_s=pred.queries_per_s,
        queries_per_s_interval=(pred.queries_per_s_low, pred.queries_per_s_high),
        notes=tuple(notes),
    )
