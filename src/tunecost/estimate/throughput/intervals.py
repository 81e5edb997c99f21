"""The 95 % prediction interval of the throughput model, and the uncertainty of moving to another GPU.

On log throughput, with t the Student quantile at the calibration's degrees of freedom:

    halfwidth = t * sqrt(sd_in^2 + (s_gpu * d_gpu)^2 + (s_host * f_host)^2 + (s_batch * d_batch)^2)

- sd_in: the calibration's in-sample scatter (root mean square log residual).
- d_gpu: how far the target GPU is from the nearest calibrated one, |ln(speed_target / speed_nearest)|, with a
  GPU's speed the geometric mean of its achieved matmul rate and bandwidth (0 on a calibrated GPU).
- s_gpu: log error per unit of that distance, measured by leave-one-GPU-out: calibrate without each GPU in turn
  (where enough points remain), predict its points, and divide their RMS log error by their distance; the largest
  such ratio is used, and never less than `TRANSFER_SD_PER_LOG_SPEED_MIN`. With one GPU, or where no GPU can be
  left out, it is `TRANSFER_SD_PER_LOG_SPEED_ONE_GPU` and the interval says the transfer is unconstrained.
- f_host: the predicted share of the step that is host time (kernel launches and the empty step), counted only on
  a GPU that is not in the calibration, or on a host other than the calibration's: it runs in another machine,
  whose CPU, driver and Python may launch kernels faster or slower. The model already scales host time by the
  host's catalog speed (`catalog.host_cpus`: the CPU the user names, else the GPU's reference system's, else the
  reference host's); s_host is what that leaves unknown: `HOST_SPEED_LOG_SD` when the host is assumed (clouds put
  GPUs in servers of other CPU generations, which differ in single-thread speed by tens of percent),
  `HOST_NAMED_LOG_SD` when the user named it (the catalog's per-clock factors chain vendors' claims). A GPU profile
  that measured the launch and host times of the machine replaces this guess with data, and the term is then left
  out.
- d_batch: ln(batch / largest calibrated batch of the model) when above it, else 0; s_batch =
  `BATCH_SD_PER_LOG` (an assumption: the padding and GEMM-shape terms carry the batch trend beyond the data).
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

INTERVAL_LEVEL = 0.95
# Stated assumptions (not fitted): see the module docstring and docs/throughput-model.md.
TRANSFER_SD_PER_LOG_SPEED_MIN = 0.10
TRANSFER_SD_PER_LOG_SPEED_ONE_GPU = 0.45  # a one-GPU calibration cannot split host from GPU time
BATCH_SD_PER_LOG = 0.10
HOST_SPEED_LOG_SD = 0.25  # one sd of ln(host speed) between machines: about x/÷ 1.28
HOST_NAMED_LOG_SD = 0.15  # one sd of ln(host speed) of a named catalog CPU: its per-clock factor is a chain of claims


def speed_of(terms: GpuTerms) -> float:
    return math.sqrt(terms.matmul_flops_per_s * terms.memory_bytes_per_s)


def gpu_distance(target: GpuTerms, calibrated: Sequence[GpuTerms]) -> float:
    """|ln(speed ratio)| to the nearest calibrated GPU (0 when the target is one of them)."""
    if not calibrated:
        return 0.0
    return min(abs(math.log(speed_of(target) / speed_of(c))) for c in calibrated)


@dataclass(frozen=True, kw_only=True)
class TransferSpread:
    sd_per_log_speed: float  # log error per unit of |ln(speed ratio)|
    measured: tuple[tuple[str, float, float], ...]  # (held-out GPU, RMS log error, distance) per check
    note: str


def transfer_spread(
    points: Sequence[Any], calibrate_rest: Callable[[list[Any]], Any], min_points: int
) -> TransferSpread:
    """Leave-one-GPU-out on `points` (CalibrationPoints); `calibrate_rest(points)` returns a CalibratedModel."""
    by_gpu: dict[str, list[Any]] = defaultdict(list)
    for p in points:
        by_gpu[resolve_gpu_name(p.target.gpu).gpu.name].append(p)
    if len(by_gpu) < 2:
        return TransferSpread(
            sd_per_log_speed=TRANSFER_SD_PER_LOG_SPEED_ONE_GPU,
            measured=(),
            note=f"calibrated on one GPU ({next(iter(by_gpu), '?')}): the split of host and GPU time is not "
            f"constrained by data, so the transfer to other GPUs is unconstrained (interval: "
            f"{TRANSFER_SD_PER_LOG_SPEED_ONE_GPU} log-sd per e-fold of GPU speed, assumed)",
        )
    measured = []
    for gpu, held in sorted(by_gpu.items()):
        rest = [p for p in points if p not in held]
        if len(rest) < min_points:
            continue
        model = calibrate_rest(rest)
        target = model.terms_for(resolve_gpu_name(gpu).gpu)
        dist = gpu_distance(target, [model.terms_for(resolve_gpu_name(g).gpu) for g in model.gpus])
        errs = [
            math.log(model.predict(p.target, run_queries=p.run_queries).queries_per_s / p.queries_per_s) for p in held
        ]
        measured.append((gpu, float(np.sqrt(np.mean(np.square(errs)))), dist))
    if not measured:
        return TransferSpread(
            sd_per_log_speed=TRANSFER_SD_PER_LOG_SPEED_ONE_GPU,
            measured=(),
            note="no GPU could be left out (too few points without it): cross-GPU uncertainty assumed "
            f"({TRANSFER_SD_PER_LOG_SPEED_ONE_GPU} log-sd per e-fold of GPU speed)",
        )
    ratios = [rms / dist for _, rms, dist in measured if dist > 0]
    sd = max([TRANSFER_SD_PER_LOG_SPEED_MIN, *ratios])
    checks = ", ".join(f"without {g}: {100 * math.expm1(r):.1f} % RMS at distance {d:.2f}" for g, r, d in measured)
    return TransferSpread(
        sd_per_log_speed=sd,
        measured=tuple(measured),
        note=f"cross-GPU interval: {sd:.3f} log-sd per e-fold of GPU speed (leave-one-GPU-out {checks})",
    )


def interval_log_halfwidth(
    sd_in: float,
    dof: int,
    spread: TransferSpread | None,
    target: GpuTerms,
    calibrated: Sequence[GpuTerms],
    *,
    batch_size: int,
    calibrated_max_batch: int | None,
    host_fraction: float = 0.0,
) -> float:
    """Half-width of the 95 % interval on log throughput (see the module docstring)."""
    from scipy.stats import t as student_t

    s_gpu = spread.sd_per_log_speed if spread else 0.0
    d_gpu = gpu_distance(target, calibrated)
    d_batch = math.log(batch_size / calibrated_max_batch) if calibrated_max_batch else 0.0
    # another machine: a GPU outside the calibration, or a calibrated GPU on another host than the calibration's
    other_machine = not any(c.name == target.name and c.host_cpu == target.host_cpu for c in calibrated)
    s_host = (HOST_NAMED_LOG_SD if target.host_named else HOST_SPEED_LOG_SD) if other_machine else 0.0
    s_host = 0.0 if target.host_measured else s_host
    sd = math.sqrt(
        sd_in**2 + (s_gpu * d_gpu) ** 2 + (s_host * host_fraction) ** 2 + (BATCH_SD_PER_LOG * max(0.0, d_batch)) ** 2
    )
    return float(student_t.ppf(0.5 + INTERVAL_LEVEL / 2, max(dof, 1))) * sd
