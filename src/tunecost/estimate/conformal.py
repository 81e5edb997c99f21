"""Prediction intervals from held-out errors: the split-conformal quantile, or a Student-t bound when too few.

Used by the throughput model's intervals and by `validate`'s per-row intervals; docs/throughput-model.md,
"The interval", shows the coverage they reach.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

INTERVAL_LEVEL = 0.95
# fewer held-out errors of one stack do not describe it: the errors of the other stacks are used instead
MIN_STACK_ERRORS = 5


@dataclass(frozen=True)
class Halfwidth:
    value: float  # on the log scale of the quantity
    basis: str  # which errors set it, and how


@dataclass(frozen=True)
class ErrorInterval:
    low: float  # bounds on a new ln(predicted / measured)
    high: float
    basis: str

    def measured_range(self, predicted: float) -> tuple[float, float]:
        """Where the measurement of `predicted` lies: the error's high bound is the measurement's low one."""
        return predicted * math.exp(-self.high), predicted * math.exp(-self.low)


def normal_quantile(level: float) -> float:
    """Two-sided: the z with P(|Z| <= z) = level."""
    from scipy.special import ndtri

    return float(ndtri(0.5 + level / 2))


def conformal_rank(n: int, level: float = INTERVAL_LEVEL) -> int | None:
    """The rank (1-based) of the held-out |error| that bounds a new one with probability >= level; None when
    n errors are too few (fewer than 1 / (1 - level) - 1)."""
    k = math.ceil((n + 1) * level)
    return k if k <= n else None


def conformal_halfwidth(abs_errors: Sequence[float], source: str, level: float = INTERVAL_LEVEL) -> Halfwidth:
    """The split-conformal half-width of `abs_errors` (held-out |log errors|); with too few of them, the Student-t
    prediction bound of their root mean square (n degrees of freedom: the errors are centred on zero), never less
    than their largest (the conformal bound at level n / (n + 1), so a higher level is never narrower)."""
    from scipy.special import stdtrit

    errors = sorted(abs(e) for e in abs_errors)
    n = len(errors)
    if n == 0:
        raise ValueError("no held-out errors")
    k = conformal_rank(n, level)
    if k is not None:
        return Halfwidth(errors[k - 1], f"{source}: split-conformal, error {k} of {n}")
    rms = math.sqrt(sum(e * e for e in errors) / n)
    t = float(stdtrit(n, 0.5 + level / 2))
    bound = max(t * rms * math.sqrt(1 + 1 / n), errors[-1])
    return Halfwidth(bound, f"{source}: Student t on the RMS of {n} errors (too few to rank)")


def error_interval(log_errors: Sequence[float], source: str, level: float = INTERVAL_LEVEL) -> ErrorInterval:
    """Where a new ln(predicted / measured) lies with probability `level`, from held-out signed `log_errors`: within
    the split-conformal |error| quantile of zero (valid whatever their sign); with too few to rank, the Student-t
    prediction interval of a normal sample whose mean and spread are both estimated, so errors that share a sign
    put it on their side of the prediction, widened to hold every error (as a lower level's ranked bound does)."""
    n = len(log_errors)
    if conformal_rank(n, level) is not None or n < 3:
        ranked = conformal_halfwidth(log_errors, source, level)
        return ErrorInterval(-ranked.value, ranked.value, ranked.basis)
    mean, spread = statistics.fmean(log_errors), statistics.stdev(log_errors)
    from scipy.special import stdtrit

    h = float(stdtrit(n - 1, 0.5 + level / 2)) * spread * math.sqrt(1 + 1 / n)
    return ErrorInterval(
        min(mean - h, min(log_errors)),
        max(mean + h, max(log_errors)),
        f"{source}: Student t on the mean and spread of {n} errors (too few to rank)",
    )
