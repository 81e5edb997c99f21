"""The 95 % interval of the throughput model, set by held-out errors per kind of extrapolation.

Each kind that applies to a target contributes a half-width on log throughput; they add in quadrature. A kind's
half-width is the split-conformal quantile of its held-out errors (`conformal_halfwidth`), or a stated assumption
where no held-out error of that kind exists. docs/throughput-model.md, "The interval", says which evidence each
kind uses and shows the coverage.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunecost.catalog.gpu_terms import GpuTerms
from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.errors import TunecostError
from tunecost.estimate.conformal import INTERVAL_LEVEL, Halfwidth, conformal_halfwidth, normal_quantile

# Stated assumptions, used only where no held-out error of the kind exists (docs/throughput-model.md).
BATCH_SD_PER_LOG = 0.10  # log error per e-fold of batch beyond the largest calibrated one
TRANSFER_LOG_SD_ASSUMED = 0.45  # per e-fold of GPU speed, where no GPU was ever held out
# ln(host speed) of a catalog CPU other than the calibration's: its per-clock chain is "uncertain by about ±15 %"
HOST_CLOCK_CHAIN_LOG_HALFWIDTH = 0.15


def speed_of(terms: GpuTerms) -> float:
    return math.sqrt(terms.matmul_flops_per_s * terms.memory_bytes_per_s)


def gpu_distance(target: GpuTerms, calibrated: Sequence[GpuTerms]) -> float:
    """|ln(speed ratio)| to the nearest calibrated GPU (0 when the target is one of them)."""
    if not calibrated:
        return 0.0
    return min(abs(math.log(speed_of(target) / speed_of(c))) for c in calibrated)


@dataclass(frozen=True, kw_only=True)
class HeldOut:
    """Held-out log errors of one kind: |ln(predicted / measured)|, per e-fold of GPU speed for transfers."""

    kind: str
    errors: tuple[float, ...]
    source: str  # how they were obtained (shown with the interval)
    cross_architecture: tuple[bool, ...] = ()  # transfers: the held-out GPU's architecture was not calibrated
    distances: tuple[float, ...] = ()  # batches: e-folds of batch each held-out point lay beyond the rest's largest


@dataclass(frozen=True, kw_only=True)
class IntervalEvidence:
    """What a calibration's own held-out checks (or, lacking them, the bundled calibration's) measured."""

    transfer: HeldOut | None  # leave-one-GPU-out, per e-fold of GPU speed
    workload: HeldOut | None  # leave-one-(model, dataset, GPU)-group-out
    note: str
    batch: HeldOut | None = None  # each model's batches above its median held out

    def transfer_halfwidth(self, cross_architecture: bool) -> Halfwidth | None:
        """The per-e-fold half-width of a move to another GPU (another architecture: its own errors if any)."""
        if self.transfer is None or not self.transfer.errors:
            return None
        same = [e for e, x in zip(self.transfer.errors, self.transfer.cross_architecture, strict=True) if not x]
        other = [e for e, x in zip(self.transfer.errors, self.transfer.cross_architecture, strict=True) if x]
        if cross_architecture and other:
            return conformal_halfwidth(other, f"{self.transfer.source}, to another architecture")
        return conformal_halfwidth(same or other, self.transfer.source)


def _by_gpu(points: Sequence[Any]) -> dict[str, list[Any]]:
    by_gpu: dict[str, list[Any]] = defaultdict(list)
    for p in points:
        by_gpu[resolve_gpu_name(p.target.gpu).gpu.name].append(p)
    return by_gpu


def _log_errors(model: Any, held: Sequence[Any]) -> list[float]:
    return [math.log(model.predict(p.target, run_queries=p.run_queries).queries_per_s / p.queries_per_s) for p in held]


def _held_out(
    points: Sequence[Any], held: Sequence[Any], calibrate_rest: Callable[[list[Any]], Any], min_points: int
) -> tuple[Any, list[float]] | None:
    """The calibration without `held` and its log errors on them; None when the rest cannot be calibrated."""
    rest = [p for p in points if p not in held]
    if not held or len(rest) < min_points:
        return None
    try:
        model = calibrate_rest(rest)
    except TunecostError:
        return None
    return model, _log_errors(model, held)


def transfer_errors(points: Sequence[Any], calibrate_rest: Callable[[list[Any]], Any], min_points: int) -> HeldOut:
    """Leave-one-GPU-out on `points` (CalibrationPoints): each held-out error divided by the GPU's distance."""
    errors: list[float] = []
    cross: list[bool] = []
    checks = []
    for gpu, held in sorted(_by_gpu(points).items()):
        if (done := _held_out(points, held, calibrate_rest, min_points)) is None:
            continue  # the rest cannot be calibrated: this GPU cannot be held out
        model, errs = done
        target = model.terms_for(resolve_gpu_name(gpu).gpu)
        dist = gpu_distance(target, [model.terms_for(resolve_gpu_name(g).gpu) for g in model.gpus])
        if dist <= 0:
            continue
        arch = resolve_gpu_name(gpu).gpu.architecture
        other_arch = arch not in {resolve_gpu_name(g).gpu.architecture for g in model.gpus}
        errors += [abs(e) / dist for e in errs]
        cross += [other_arch] * len(errs)
        rms = float(np.sqrt(np.mean(np.square(errs))))
        checks.append(
            f"without {gpu}: {100 * math.expm1(rms):.1f} % RMS over {len(errs)} points at distance {dist:.2f}"
        )
    return HeldOut(
        kind="other GPU",
        errors=tuple(errors),
        source="leave-one-GPU-out (" + ("; ".join(checks) or "no GPU could be left out") + ")",
        cross_architecture=tuple(cross),
    )


def workload_errors(
    points: Sequence[Any], calibrate_rest: Callable[[list[Any]], Any], group_of: Callable[[Any], tuple]
) -> HeldOut:
    """Leave-one-group-out on `points`: each (model, dataset, GPU) group predicted by a calibration without it."""
    groups: dict[tuple, list[Any]] = defaultdict(list)
    for p in points:
        groups[group_of(p)].append(p)
    errors: list[float] = []
    for _, held in sorted(groups.items()) if len(groups) > 1 else ():
        if (done := _held_out(points, held, calibrate_rest, 1)) is not None:  # else: too few points without it
            errors += [abs(e) for e in done[1]]
    return HeldOut(
        kind="workload not calibrated",
        errors=tuple(errors),
        source=f"leave-one-group-out over {len(groups)} (model, dataset, GPU) groups",
    )


def batch_errors(points: Sequence[Any], calibrate_rest: Callable[[list[Any]], Any], min_points: int) -> HeldOut:
    """Each model's batches above its median batch held out and predicted by a calibration on the rest: the
    errors of extrapolating the batch (by up to the ratio the source states)."""
    errors: list[float] = []
    distances: list[float] = []
    checks = []
    for model in sorted({p.target.job.model for p in points}):
        sizes = sorted({p.target.job.batch_size for p in points if p.target.job.model == model})
        cut = sizes[(len(sizes) - 1) // 2]
        held = [p for p in points if p.target.job.model == model and p.target.job.batch_size > cut]
        if (done := _held_out(points, held, calibrate_rest, min_points)) is None:
            continue  # the rest cannot be calibrated: these batches cannot be held out
        errors += [abs(e) for e in done[1]]
        distances += [math.log(p.target.job.batch_size / cut) for p in held]
        top = max(p.target.job.batch_size for p in held)
        checks.append(f"{model}: {len(held)} points of batch {cut + 1}-{top} from batches up to {cut}")
    source = "larger batches held out (" + ("; ".join(checks) or "none") + ")"
    return HeldOut(kind="batch beyond calibrated", errors=tuple(errors), source=source, distances=tuple(distances))


def interval_parts(
    *,
    in_sample: Halfwidth,
    evidence: IntervalEvidence | None,
    target: GpuTerms,
    calibrated: Sequence[GpuTerms],
    workload_calibrated: bool,
    cross_architecture: bool,
    batch_size: int,
    calibrated_max_batch: int | None,
    host_fraction: float = 0.0,
) -> list[tuple[str, float, str]]:
    """(kind, half-width on log throughput, basis) for each kind of extrapolation that applies to the target."""
    parts = []
    workload = evidence.workload if evidence else None
    if workload_calibrated or workload is None or not workload.errors:
        parts.append(("calibrated workload", in_sample.value, in_sample.basis))
    else:
        w = conformal_halfwidth(workload.errors, workload.source)
        parts.append((workload.kind, w.value, w.basis))
    d_gpu = gpu_distance(target, calibrated)
    if d_gpu > 0:
        kind = "other architecture" if cross_architecture else "other GPU"
        per = evidence.transfer_halfwidth(cross_architecture) if evidence else None
        if per is None:
            z = normal_quantile(INTERVAL_LEVEL)
            per = Halfwidth(z * TRANSFER_LOG_SD_ASSUMED, f"assumed: {TRANSFER_LOG_SD_ASSUMED} log-sd per e-fold")
        parts.append((kind, per.value * d_gpu, f"{per.basis}, x {d_gpu:.2f} e-folds of GPU speed"))
    hosts = {c.host_cpu for c in calibrated}
    if host_fraction > 0 and not target.host_measured and target.host_cpu not in hosts:
        parts.append(
            (
                "other host CPU",
                HOST_CLOCK_CHAIN_LOG_HALFWIDTH * host_fraction,
                f"assumed: ±{HOST_CLOCK_CHAIN_LOG_HALFWIDTH} on the log of the catalog's host speed x host share "
                f"{host_fraction:.2f}",
            )
        )
    if calibrated_max_batch and batch_size > calibrated_max_batch:
        d_batch = math.log(batch_size / calibrated_max_batch)
        held = evidence.batch if evidence else None
        if held is not None and held.errors:
            h = conformal_halfwidth(held.errors, held.source)
            # the errors grew with the distance: beyond the farthest held out, the bound grows in proportion
            reach = max(held.distances, default=d_batch)  # none recorded: the bound as measured
            scale = max(1.0, d_batch / reach)
            part = (
                h.value * scale,
                f"{h.basis}; batch {batch_size} beyond {calibrated_max_batch}"
                + (f", x {scale:.2f}: {d_batch:.2f} e-folds beyond, held out up to {reach:.2f}" if scale > 1 else ""),
            )
        else:
            z = normal_quantile(INTERVAL_LEVEL)
            part = (z * BATCH_SD_PER_LOG * d_batch, f"assumed: {BATCH_SD_PER_LOG} log-sd per e-fold beyond batch")
        parts.append(("batch beyond calibrated", *part))
    return parts


def combined_halfwidth(parts: Sequence[tuple[str, float, str]]) -> float:
    return math.sqrt(sum(h * h for _, h, _ in parts))
