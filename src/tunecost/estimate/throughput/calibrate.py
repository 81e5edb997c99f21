"""Calibrate the cross-GPU throughput model on measurements, then predict any (model, GPU, batch) with an interval.

`calibrate(points)` fits six numbers shared by every model and GPU in the file: the five `StackParams` and a fixed
time per measured run (`run_overhead_s`: start-up, warm-up and checkpointing inside the trainer's train_runtime,
which the paper divides 1000 queries by; host work like the step's host time, so it is given on the reference host
and divided by the host's speed). It is a maximum-a-posteriori least squares on log throughput
(scipy.optimize.least_squares): every (model, dataset, GPU) group weighs the same, and each parameter has a weak
log-normal prior (`PRIORS`, stated with its reason) so that parameters the data cannot separate stay physical.
What each GPU achieves comes from `GpuTerms`: the catalog's (`model.catalog_gpu_terms`) or a measured GPU profile
given in `gpu_terms` (keyed by catalog name). The 95 % prediction interval adds to the in-sample scatter the
uncertainty of moving to another GPU and to larger batches (`intervals.py` says how). A target outside what was
calibrated (another GPU, model, method, top-k, or batch range) is flagged as an extrapolation, with the reasons.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

import numpy as np

from tunecost.catalog.gpus import GPU, resolve_gpu_name
from tunecost.catalog.host_cpus import REFERENCE_HOST, resolve_host_cpu
from tunecost.catalog.models import resolve_model
from tunecost.errors import TunecostError
from tunecost.estimate.paper import PAPER_METHOD
from tunecost.estimate.throughput.counts import AnalyticStepCounts, analytic_step_counts
from tunecost.estimate.throughput.coverage import ModelRange, coverage_notes, model_ranges
from tunecost.estimate.throughput.gpu_terms import GpuTerms
from tunecost.estimate.throughput.intervals import TransferSpread, interval_log_halfwidth, transfer_spread
from tunecost.estimate.throughput.lengths import PAPER_CUTOFF_TOKENS, dataset_lengths, empirical_lengths, fixed_lengths
from tunecost.estimate.throughput.model import PARAM_NAMES, StackParams, StepTime, catalog_gpu_terms, step_time
from tunecost.estimate.throughput.priors import PRIORS, Prior
from tunecost.workload.job import FineTuneJob, Method

PAPER_RUN_QUERIES = 1000  # the paper's throughput = 1000 queries / train_runtime
FIT_NAMES = (*PARAM_NAMES, "run_overhead_s")
MIN_POINTS = len(FIT_NAMES) + 1
LOG_NOISE = 0.05  # assumed measurement noise on log throughput: weighs the data against the priors
INTERVAL_LEVEL = 0.95


@dataclass(frozen=True, kw_only=True)
class ThroughputTarget:
    """One workload to predict: the job (model, method, top-k, batch, a dataset or a fixed seq_len) on a GPU."""

    job: FineTuneJob
    gpu: str
    host_cpu: str | None = None  # the host CPU that runs the GPU, when known (catalog.host_cpus)


def throughput_target(
    *,
    model: str,
    gpu: str,
    batch_size: int,
    experts_per_token: int | None = None,
    dataset: str | None = None,
    seq_len: int | None = None,
    method: str | None = None,
    host_cpu: str | None = None,
    lengths: tuple[int, ...] | None = None,
) -> ThroughputTarget:
    """The target of a TARGETS.csv or measurement row, with the paper's setup as the default: its method for its
    models (else qlora), the model's own top-k, gradient checkpointing except for a full fine-tune. The job checks
    the batch size and sequence length. `lengths`: the data's tokens per query (`seq_len` then is the cutoff)."""
    if experts_per_token is not None and experts_per_token < 1:  # None (not 0) means the default
        raise TunecostError(f"experts per token must be >= 1, got {experts_per_token}")
    if dataset is None and seq_len is None and not lengths:
        raise TunecostError(f"{model} on {gpu}: give a dataset or a seq_len (or the data's lengths)")
    spec = resolve_model(model)
    chosen = cast("Method", method or PAPER_METHOD.get(spec.name, "qlora"))  # FineTuneJob validates it
    job = FineTuneJob(
        model=spec.name,
        method=chosen,
        experts_per_token=experts_per_token or spec.default_experts_per_token,
        batch_size=batch_size,
        seq_len=seq_len,
        lengths=lengths,
        dataset=dataset,
        gradient_checkpointing=chosen != "full",
    )  # the paper: checkpointing for Mixtral QLoRA only
    if host_cpu:
        host_cpu = resolve_host_cpu(host_cpu).name
    return ThroughputTarget(job=job, gpu=gpu, host_cpu=host_cpu or None)


@dataclass(frozen=True, kw_only=True)
class CalibrationPoint:
    target: ThroughputTarget
    queries_per_s: float
    run_queries: int | None = PAPER_RUN_QUERIES  # queries in the measured run; None: steady state
    source: str = ""  # where it came from, for error messages ("file: row N")


@dataclass(frozen=True, kw_only=True)
class Prediction:
    target: ThroughputTarget
    gpu: str  # canonical catalog name
    experts_per_token: int  # as resolved (the model's default when the target left it out)
    method: str  # as resolved (the paper's setup for its models)
    queries_per_s: float
    queries_per_s_low: float
    queries_per_s_high: float
    step: StepTime
    counts: AnalyticStepCounts
    run_queries: int | None
    extrapolation: bool
    extrapolation_reasons: tuple[str, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    host_cpu: str = ""  # the host CPU the prediction assumes ("" when a GPU profile measured the host times)
    startup_s: float = 0.0  # one run's start-up (the calibrated time per run on this host), outside steady state


def job_for(target: ThroughputTarget) -> tuple[FineTuneJob, AnalyticStepCounts]:
    """The target's job sized for the step counts (a dataset's job at its cutoff length) and its analytic step
    counts over the job's own lengths: its real lengths (each batch padded to its longest, cut at seq_len if given,
    else at the longest), else its fixed seq_len, else its dataset's length distribution."""
    job = target.job
    if job.lengths:
        cutoff = job.seq_len if job.seq_len is not None else max(job.lengths)
        source = f"{job.dataset}: measured lengths" if job.dataset else "measured lengths"
        lengths = empirical_lengths(
            job.lengths, job.batch_size, source=f"{source}, padded to the longest in the batch", cutoff_tokens=cutoff
        )
        job = replace(job, seq_len=cutoff)
    elif job.seq_len is not None:
        lengths = fixed_lengths(job.seq_len, job.batch_size)
    else:
        lengths = dataset_lengths(str(job.dataset), job.batch_size)
        job = replace(job, seq_len=PAPER_CUTOFF_TOKENS)
    return job, analytic_step_counts(resolve_model(job.model), job, lengths)


def run_queries_per_s(step_s: float, batch_size: int, run_overhead_s: float, run_queries: int | None) -> float:
    """Throughput of a run of `run_queries` queries with a fixed overhead; steady state when None."""
    if run_queries is None:
        return batch_size / step_s
    return run_queries / (run_overhead_s + run_queries / batch_size * step_s)


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
    spread: TransferSpread | None = None  # how far predictions move from GPU to GPU (intervals.py)
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
        if job.method in self.stacks:  # its own stack's parameters; extrapolation judged on the whole calibration
            reasons = self._extrapolation(job, counts, gpu)
            pred = self.stacks[job.method].predict(target, run_queries)
            return replace(pred, extrapolation=bool(reasons), extrapolation_reasons=tuple(reasons))
        terms = self.terms_for(gpu, target.host_cpu)
        step = step_time(counts, terms, self.params)
        qps = run_queries_per_s(step.step_s, target.job.batch_size, self.run_overhead_s / terms.host_speed, run_queries)
        reasons = self._extrapolation(job, counts, gpu)
        rng = self.ranges.get(job.model)
        halfwidth = interval_log_halfwidth(
            self.log_residual_sd,
            self.log_residual_dof,
            self.spread,
            terms,
            [self.terms_for(resolve_gpu_name(g).gpu) for g in self.gpus],
            batch_size=job.batch_size,
            calibrated_max_batch=rng.batch_sizes[1] if rng else None,
            host_fraction=step.exposed_host_s / step.step_s,
        )
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
        )

    def _extrapolation(self, job: FineTuneJob, counts: AnalyticStepCounts, gpu: GPU) -> list[str]:
        reasons = []
        if gpu.name not in self.gpus:
            reasons.append(f"GPU {gpu.name} not in the calibration ({', '.join(self.gpus)}): cross-GPU transfer")
        rng = self.ranges.get(job.model)
        if rng is None:
            return [*reasons, f"model {job.model} not in the calibration ({', '.join(sorted(self.ranges))})"]
        lo, hi = rng.batch_sizes
        if not lo <= job.batch_size <= hi:
            far = " (far outside)" if job.batch_size > 2 * hi or job.batch_size * 2 < lo else ""
            reasons.append(f"batch {job.batch_size} outside calibrated {lo}..{hi} for {job.model}{far}")
        if job.experts_per_token not in rng.experts_per_token:
            reasons.append(
                f"top-{job.experts_per_token} not calibrated for {job.model} (have {sorted(rng.experts_per_token)})"
            )
        if job.method not in rng.methods:
            reasons.append(f"method {job.method} not calibrated for {job.model} (have {sorted(rng.methods)})")
        t_lo, t_hi = rng.tokens_per_step
        if not 0.5 * t_lo <= counts.tokens_per_step <= 2.0 * t_hi:
            reasons.append(f"{counts.tokens_per_step:.0f} tokens per step, calibrated {t_lo:.0f}..{t_hi:.0f}")
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
    from scipy.optimize import least_squares
    from scipy.stats import t as student_t

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
                    step_time(c, terms, params).step_s, p.target.job.batch_size, run / terms.host_speed, p.run_queries
                )
                for p, _, _, c, terms in prepared
            ]
        )

    def residuals(x: np.ndarray) -> np.ndarray:
        data = weights * (predicted_log(x) - y) / LOG_NOISE
        return np.concatenate([data, (x - centre) / width]) if use_priors else data

    best = None
    for half_rows, overhead in ((64.0, 20e-6), (512.0, 5e-6), (64.0, 60e-6), (512.0, 60e-6)):
        start = centre.copy()
        start[FIT_NAMES.index("gemm_half_rows")] = math.log(half_rows)
        start[FIT_NAMES.index("kernel_overhead_s")] = math.log(overhead)
        fit = least_squares(residuals, np.clip(start, bounds[0] + 1e-9, bounds[1] - 1e-9), bounds=bounds)
        if best is None or fit.cost < best.cost:
            best = fit
    assert best is not None
    params, run = _unpack(best.x)
    log_res = predicted_log(best.x) - y
    dof = len(points) - len(FIT_NAMES)
    sd = float(np.sqrt(np.sum(log_res**2) / dof))
    halfwidth = float(student_t.ppf(0.5 + INTERVAL_LEVEL / 2, dof)) * sd
    return CalibratedModel(
        params=params,
        run_overhead_s=run,
        log_residual_sd=sd,
        interval_log_halfwidth=halfwidth,
        num_points=len(points),
        in_sample_mape=float(np.mean(np.abs(np.expm1(log_res)))),
        ranges=model_ranges(prepared),
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
) -> CalibratedModel:
    """Fit the shared parameters to `points`; see the module docstring. One set per software stack (method:
    qlora, lora, full) that has enough points of its own, used for targets of that method; the set fitted on all
    points serves the others. `priors` replaces some of `PRIORS`; `use_priors=False` drops them (plain least
    squares within the bounds); both are for sensitivity studies. `gpu_terms`: measured GPU profiles by catalog
    name. `transfer_check`: calibrate again without each GPU to size the cross-GPU part of the interval
    (`intervals.transfer_spread`)."""
    options = FitOptions(use_priors=use_priors, priors=priors, gpu_terms=gpu_terms)
    return _calibrate(points, source, options, transfer_check)


def _calibrate(
    points: Sequence[CalibrationPoint], source: str, options: FitOptions, transfer_check: bool
) -> CalibratedModel:

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
    spread = None
    if transfer_check:
        spread = transfer_spread(points, lambda rest: _calibrate(rest, "measurements", options, False), MIN_POINTS)
        notes.append(spread.note)
    model = replace(
        model,
        in_sample_mape=float(np.mean(np.abs(np.expm1(log_res)))),
        notes=tuple(notes),
        spread=spread,
        run_queries=next(iter(lengths)) if len(lengths := {p.run_queries for p in points}) == 1 else None,
        stacks={m: replace(s, spread=spread) for m, s in stacks.items()},
    )
    return model
