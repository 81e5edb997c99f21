"""Calibrate the cross-GPU throughput model on measurements, then predict any (model, GPU, batch) with an interval.

Sources and derivations: docs/throughput-model.md, section `tunecost.estimate.throughput.calibrate`.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from tunecost.catalog.gpu_terms import GpuTerms
from tunecost.catalog.gpus import GPU, resolve_gpu_name
from tunecost.catalog.host_cpus import REFERENCE_HOST
from tunecost.errors import TunecostError
from tunecost.estimate.conformal import INTERVAL_LEVEL, Halfwidth
from tunecost.estimate.throughput.counts import AnalyticStepCounts
from tunecost.estimate.throughput.coverage import ModelRange, coverage_notes, model_ranges, setup_label
from tunecost.estimate.throughput.disk_cache import (
    cached_evidence,
    cached_fit,
    evidence_cache_path,
    evidence_json,
    fit_cache_path,
)
from tunecost.estimate.throughput.intervals import (
    IntervalEvidence,
    batch_errors,
    combined_halfwidth,
    interval_parts,
    transfer_errors,
    workload_errors,
)
from tunecost.estimate.throughput.model import PARAM_NAMES, StackParams, catalog_gpu_terms, step_time
from tunecost.estimate.throughput.priors import PRIORS, Prior
from tunecost.estimate.throughput.targets import (
    CalibrationPoint,
    Prediction,
    ThroughputTarget,
    group_of,
    job_for,
    run_queries_per_s,
)
from tunecost.io import atomic_write_json
from tunecost.workload.job import FineTuneJob

FIT_NAMES = (*PARAM_NAMES, "run_overhead_s")
MIN_POINTS = len(FIT_NAMES) + 1
LOG_NOISE = 0.05  # assumed measurement noise on log throughput: weighs the data against the priors


@dataclass(frozen=True, kw_only=True)
class CalibratedModel:
    params: StackParams
    run_overhead_s: float
    log_residual_sd: float
    interval_log_halfwidth: float
    num_points: int
    in_sample_mape: float  # on the points as measured (their run length)
    ranges: Mapping[str, ModelRange]
    gpus: tuple[str, ...]
    source: str
    notes: tuple[str, ...] = ()
    gpu_terms: Mapping[str, GpuTerms] = field(default_factory=dict)  # measured profiles, by catalog name
    stacks: Mapping[str, CalibratedModel] = field(default_factory=dict)  # per method, where it had enough points
    run_queries: int | None = None  # the run length every calibration point shares (the paper's 1000), if one
    evidence: IntervalEvidence | None = None  # held-out errors that set the intervals (intervals.py)
    groups: frozenset[tuple[str, str, str]] = frozenset()  # (model, dataset or seqN, GPU) calibrated
    log_residual_dof: int = 1

    @property
    def source_names(self) -> str:
        """The calibration files by name, without their folders (for notes)."""
        return " + ".join(part.rsplit("/", 1)[-1] for part in self.source.split(" + "))

    def terms_for(self, gpu: GPU, host_cpu: str | None = None) -> GpuTerms:
        """A measured profile of the GPU (its machine's host times included), else the catalog's values on
        `host_cpu` (else the GPU's default host)."""
        return self.gpu_terms.get(gpu.name) or catalog_gpu_terms(gpu, host_cpu)

    def predict(self, target: ThroughputTarget, run_queries: int | None = None) -> Prediction:
        gpu = resolve_gpu_name(target.gpu).gpu
        job, counts = job_for(target)
        if own := self.method_fit(job):  # extrapolation judged on the whole calibration
            reasons = self._extrapolation(job, counts, gpu)
            pred = own.predict(target, run_queries)
            return replace(pred, extrapolation=bool(reasons), extrapolation_reasons=tuple(reasons))
        terms = self.terms_for(gpu, target.host_cpu)
        step = step_time(counts, terms, self.params)
        qps = run_queries_per_s(
            step.step_s, counts.queries_per_step, self.run_overhead_s / terms.host_speed, run_queries
        )
        reasons = self._extrapolation(job, counts, gpu)
        rng = self.ranges.get(job.model)
        calibrated = [self.terms_for(resolve_gpu_name(g).gpu) for g in self.gpus]
        parts = interval_parts(
            in_sample=Halfwidth(self.interval_log_halfwidth, f"in-sample scatter of {self.num_points} points"),
            evidence=self.evidence,
            target=terms,
            calibrated=calibrated,
            workload_calibrated=self._workload_calibrated(job, gpu),
            cross_architecture=gpu.architecture not in {resolve_gpu_name(g).gpu.architecture for g in self.gpus},
            batch_size=job.batch_size,
            calibrated_max_batch=rng.batch_sizes[1] if rng else None,
            host_fraction=step.exposed_host_s / step.step_s,
        )
        halfwidth = combined_halfwidth(parts)
        factor = math.exp(halfwidth)
        notes = [
            f"lengths: {counts.lengths.source}",
            f"counts: {counts.source} (the paper's stack)",
            f"GPU terms: {terms.source}",
        ]
        if terms.host and not terms.host_measured:
            notes.append(terms.host)
        return Prediction(
            target=target,
            gpu=gpu.name,
            experts_per_token=int(job.experts_per_token or 0),
            method=job.method,
            queries_per_s=qps,
            queries_per_s_low=qps / factor,
            queries_per_s_high=qps * factor,
            step=step,
            counts=counts,
            run_queries=run_queries,
            extrapolation=bool(reasons),
            extrapolation_reasons=tuple(reasons),
            notes=tuple(notes),
            host_cpu="" if terms.host_measured else (terms.host_cpu or REFERENCE_HOST),
            startup_s=self.run_overhead_s / terms.host_speed,
            interval_parts=tuple(parts),
        )

    def method_fit(self, job: FineTuneJob) -> CalibratedModel | None:
        """The parameters fitted on the points of the job's method alone, where they speak for its model: its model
        among their points, or several models (measured on one other model, a method's fit is that model's too)."""
        own = self.stacks.get(job.method)
        return own if own is not None and (job.model in own.ranges or len(own.ranges) > 1) else None

    def _extrapolation(self, job: FineTuneJob, counts: AnalyticStepCounts, gpu: GPU) -> list[str]:
        reasons = []
        if gpu.name not in self.gpus:
            reasons.append(f"GPU {gpu.name} not in the calibration ({', '.join(self.gpus)}): cross-GPU transfer")
        rng = self.ranges.get(job.model)
        if rng is None:
            return [*reasons, *self._workload_reasons(job)]
        lo, hi = rng.batch_sizes
        if not lo <= job.batch_size <= hi:
            far = " (far outside)" if job.batch_size > 2 * hi or job.batch_size * 2 < lo else ""
            reasons.append(f"batch {job.batch_size} outside calibrated {lo}..{hi} for {job.model}{far}")
        reasons += self._workload_reasons(job)
        t_lo, t_hi = rng.tokens_per_step
        tokens = counts.tokens_per_step / job.grad_accum  # a micro-batch's: the calibration has no accumulation
        if not 0.5 * t_lo <= tokens <= 2.0 * t_hi:
            reasons.append(f"{tokens:.0f} tokens per step, calibrated {t_lo:.0f}..{t_hi:.0f}")
        return reasons

    def _workload_calibrated(self, job: FineTuneJob, gpu: GPU) -> bool:
        """The target's (model, data) was calibrated on this GPU, or, on a GPU outside the calibration, on another
        GPU (the move is then the transfer's); else the held-out errors of unseen groups apply."""
        if self._workload_reasons(job):
            return False
        data = job.dataset or f"seq{job.seq_len}"
        if (job.model, data, gpu.name) in self.groups:
            return True
        return gpu.name not in self.gpus and any(g[:2] == (job.model, data) for g in self.groups)

    def _workload_reasons(self, job: FineTuneJob) -> list[str]:
        """What of the workload (model, top-k, method, setup) the calibration did not cover."""
        rng = self.ranges.get(job.model)
        if rng is None:
            return [f"model {job.model} not in the calibration ({', '.join(sorted(self.ranges))})"]
        reasons = []
        if job.experts_per_token not in rng.experts_per_token:
            reasons.append(
                f"top-{job.experts_per_token} not calibrated for {job.model} (have {sorted(rng.experts_per_token)})"
            )
        if job.method not in rng.methods:
            reasons.append(f"method {job.method} not calibrated for {job.model} (have {sorted(rng.methods)})")
        elif (setup := setup_label(job)) not in rng.setups:
            reasons.append(f"setup {setup} not calibrated for {job.model} (have {'; '.join(sorted(rng.setups))})")
        return reasons


def _prepared(point: CalibrationPoint, index: int, profiles: Mapping[str, GpuTerms]) -> tuple:
    """(point, GPU, job, counts, terms) for one calibration point; an error names the point's row (or index)."""
    try:
        gpu = resolve_gpu_name(point.target.gpu).gpu
        terms = profiles.get(gpu.name) or catalog_gpu_terms(gpu, point.target.host_cpu)
        return (point, gpu, *job_for(point.target), terms)
    except TunecostError as exc:
        raise TunecostError(f"{point.source or f'calibration point {index}'}: {exc}") from None


def _unpack(x: np.ndarray) -> tuple[StackParams, float]:
    values = {name: float(v) for name, v in zip(FIT_NAMES, np.exp(x))}
    run = values.pop("run_overhead_s")
    return StackParams(**values), run


@dataclass(frozen=True, kw_only=True)
class FitOptions:
    """How a fit treats its points (see `calibrate`): the priors and the measured GPU profiles."""

    use_priors: bool = True
    priors: Mapping[str, Prior] | None = None  # replaces some of PRIORS
    gpu_terms: Mapping[str, GpuTerms] | None = None  # measured GPU profiles by catalog name


def fit_stack(
    points: Sequence[CalibrationPoint], *, source: str = "measurements", options: FitOptions = FitOptions()
) -> CalibratedModel:
    """Fit one set of stack parameters to all of `points` (any models, methods and GPUs together)."""
    use_priors, priors, gpu_terms = options.use_priors, options.priors, options.gpu_terms
    from scipy.special import stdtrit  # Student t quantiles without scipy.stats' import time

    if len(points) < MIN_POINTS:
        raise TunecostError(
            f"calibration needs at least {MIN_POINTS} measurements ({len(FIT_NAMES)} shared parameters), got "
            f"{len(points)}; measure several batch sizes (ideally of two models)"
        )
    profiles = dict(gpu_terms or {})
    prepared = [_prepared(p, i, profiles) for i, p in enumerate(points, start=1)]
    y = np.log([p.queries_per_s for p in points])
    groups: dict[tuple[str, str, str], int] = defaultdict(int)
    keys = [
        (job.model, p.target.job.dataset or f"seq{p.target.job.seq_len}", gpu.name) for p, gpu, job, _, _ in prepared
    ]
    for key in keys:
        groups[key] += 1
    weights = np.sqrt([len(points) / (len(groups) * groups[k]) for k in keys])  # every group weighs the same
    prior = {**PRIORS, **(priors or {})}
    centre = np.log([prior[n].centre for n in FIT_NAMES])
    width = np.log([prior[n].factor for n in FIT_NAMES])
    bounds = (np.log([prior[n].lower for n in FIT_NAMES]), np.log([prior[n].upper for n in FIT_NAMES]))

    def predicted_log(x: np.ndarray) -> np.ndarray:
        params, run = _unpack(x)
        return np.log(
            [
                run_queries_per_s(
                    step_time(c, terms, params).step_s, c.queries_per_step, run / terms.host_speed, p.run_queries
                )
                for p, _, _, c, terms in prepared
            ]
        )

    def residuals(x: np.ndarray) -> np.ndarray:
        data = weights * (predicted_log(x) - y) / LOG_NOISE
        return np.concatenate([data, (x - centre) / width]) if use_priors else data

    # keyed by the model's predictions at the prior centre too: a change in the counts or the step time refits
    path = fit_cache_path(points, options, predicted_log(centre))
    x = cached_fit(path, len(FIT_NAMES))
    if x is None:
        from scipy.optimize import least_squares

        best = None
        for half_rows, overhead in ((64.0, 20e-6), (512.0, 5e-6), (64.0, 60e-6), (512.0, 60e-6)):
            start = centre.copy()
            start[FIT_NAMES.index("gemm_half_rows")] = math.log(half_rows)
            start[FIT_NAMES.index("kernel_overhead_s")] = math.log(overhead)
            fit = least_squares(residuals, np.clip(start, bounds[0] + 1e-9, bounds[1] - 1e-9), bounds=bounds)
            if best is None or fit.cost < best.cost:
                best = fit
        assert best is not None
        x = best.x
        with contextlib.suppress(TunecostError):  # a cache that cannot be written is refitted next time
            atomic_write_json(path, {"x": [float(v) for v in x]})
    params, run = _unpack(x)
    log_res = predicted_log(x) - y
    dof = len(points) - len(FIT_NAMES)
    sd = float(np.sqrt(np.sum(log_res**2) / dof))
    halfwidth = float(stdtrit(dof, 0.5 + INTERVAL_LEVEL / 2)) * sd
    return CalibratedModel(
        params=params,
        run_overhead_s=run,
        log_residual_sd=sd,
        interval_log_halfwidth=halfwidth,
        num_points=len(points),
        in_sample_mape=float(np.mean(np.abs(np.expm1(log_res)))),
        ranges=model_ranges(prepared),
        groups=frozenset(keys),
        gpus=tuple(sorted({gpu.name for _, gpu, _, _, _ in prepared})),
        source=source,
        notes=tuple(coverage_notes(prepared)),
        gpu_terms=profiles,
        log_residual_dof=dof,
    )


def calibrate(
    points: Sequence[CalibrationPoint],
    *,
    source: str = "measurements",
    use_priors: bool = True,
    priors: Mapping[str, Prior] | None = None,
    gpu_terms: Mapping[str, GpuTerms] | None = None,
    transfer_check: bool = True,
    fallback_evidence: Callable[[], IntervalEvidence | None] | None = None,
) -> CalibratedModel:
    """Fit the shared parameters to `points`; see docs/throughput-model.md. One set per software stack (method:
    qlora, lora, full) that has enough points of its own, used for targets of that method; the set fitted on all
    points serves the others. `priors` replaces some of `PRIORS`; `use_priors=False` drops them (plain least
    squares within the bounds); both are for sensitivity studies. `gpu_terms`: measured GPU profiles by catalog
    name. `transfer_check`: calibrate again without each GPU and each group to measure the held-out errors that
    set the intervals; `fallback_evidence` serves the kinds these points cannot hold out (one GPU)."""
    options = FitOptions(use_priors=use_priors, priors=priors, gpu_terms=gpu_terms)
    model = _calibrate(points, source, options)
    if not transfer_check:
        return model
    evidence = held_out_evidence(points, options, model)
    fallback = fallback_evidence() if evidence.transfer is None and fallback_evidence is not None else None
    if fallback is not None:
        evidence = replace(
            evidence, transfer=fallback.transfer, note=f"{evidence.note}; to another GPU: {fallback.note}"
        )
    stacks = {m: replace(s, evidence=evidence) for m, s in model.stacks.items()}
    return replace(model, evidence=evidence, stacks=stacks, notes=(*model.notes, evidence.note))


def held_out_evidence(
    points: Sequence[CalibrationPoint], options: FitOptions, model: CalibratedModel
) -> IntervalEvidence:
    """Leave-one-GPU-out, leave-one-group-out and larger-batches-out errors of `points`, kept on disk."""
    path = evidence_cache_path(points, options, model.params)
    if (kept := cached_evidence(path)) is not None:
        return kept

    def rest(pts: list[CalibrationPoint]) -> CalibratedModel:
        return _calibrate(pts, "measurements", options)

    transfer = transfer_errors(points, rest, MIN_POINTS)
    workload = workload_errors(points, rest, group_of)
    batch = batch_errors(points, rest, MIN_POINTS)
    if transfer.errors:
        note = f"interval to another GPU from {len(transfer.errors)} held-out errors ({transfer.source})"
    else:
        note = "one GPU calibrated: no held-out error of a move to another GPU"
    evidence = IntervalEvidence(
        transfer=transfer if transfer.errors else None, workload=workload, note=note, batch=batch
    )
    with contextlib.suppress(TunecostError):  # a cache that cannot be written is recomputed next time
        atomic_write_json(path, evidence_json(evidence))
    return evidence


def _calibrate(points: Sequence[CalibrationPoint], source: str, options: FitOptions) -> CalibratedModel:
    model = fit_stack(points, source=source, options=options)
    by_method: dict[str, list[CalibrationPoint]] = defaultdict(list)
    for p in points:
        by_method[p.target.job.method].append(p)
    stacks = {}
    if len(by_method) > 1:
        for method, pts in sorted(by_method.items()):
            if len(pts) >= MIN_POINTS:
                stacks[method] = fit_stack(pts, source=f"{source} ({method} points)", options=options)
    model = replace(model, stacks=stacks)
    log_res = [
        math.log(model.predict(p.target, run_queries=p.run_queries).queries_per_s / p.queries_per_s) for p in points
    ]
    notes = list(model.notes)
    if stacks:
        notes.append(
            "one parameter set per software stack: "
            + "; ".join(f"{m} ({s.num_points} points)" for m, s in stacks.items())
        )
    return replace(
        model,
        in_sample_mape=float(np.mean(np.abs(np.expm1(log_res)))),
        notes=tuple(notes),
        run_queries=next(iter(lengths)) if len(lengths := {p.run_queries for p in points}) == 1 else None,
    )
