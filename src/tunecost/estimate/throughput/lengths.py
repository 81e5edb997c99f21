"""Sequence lengths as the throughput model sees them: tokens per padded batch and the attention work.

Sources and derivations: docs/throughput-model.md, section `tunecost.estimate.throughput.lengths`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np

from tunecost.catalog.datasets import find_dataset_facts, get_dataset_facts
from tunecost.errors import TunecostError
from tunecost.workload.lengths import PAD_TO_MULTIPLE_OF

if TYPE_CHECKING:
    from tunecost.catalog.datasets import DatasetFacts

PAPER_CUTOFF_TOKENS = 1024  # LLaMA-Factory --cutoff_len in the artifact's scripts
# Std. dev. of log(tokens per query). The paper gives medians only. Measured here: 0.32 on LLM-Adapters'
# math_data.json (3000 queries, Mixtral tokenizer, prompt + response); the commonsense mix of eight tasks with
# different medians is wider. 0.35 for both; docs/throughput-model.md shows the sensitivity.
DEFAULT_LOG_SIGMA = 0.35
Z_95 = NormalDist().inv_cdf(0.95)  # 1.645: the 95th percentile of a standard normal
_GRID_POINTS = 4000


@dataclass(frozen=True, kw_only=True)
class SeqLengths:
    """What one batch of `batch_size` queries costs in tokens."""

    batch_size: int
    padded_len_tokens: float  # E[longest query in the batch]: every query of the batch is padded to it
    mean_len_tokens: float  # E[real length]: tokens that carry loss
    mean_sq_len_tokens2: float  # E[l^2]: FlashAttention-2 varlen work per query (l^2 / 2 causal)
    source: str
    queries_per_row: float = 1.0  # queries one row of the batch holds (packing: several)
    attention_seqs_per_row: float = 1.0  # causal sequences per row whose E[l], E[l^2] are the two above

    @property
    def tokens_per_step(self) -> float:
        return self.batch_size * self.padded_len_tokens


def _check_batch(batch_size: int) -> None:
    if batch_size < 1:
        raise TunecostError(f"batch size must be >= 1, got {batch_size}")


def fixed_lengths(seq_len: int, batch_size: int) -> SeqLengths:
    """Every query exactly `seq_len` tokens (no padding waste, no rounding: the caller chose the length)."""
    _check_batch(batch_size)
    if seq_len < 1:
        raise TunecostError(f"sequence length must be >= 1, got {seq_len}")
    return SeqLengths(
        batch_size=batch_size,
        padded_len_tokens=float(seq_len),
        mean_len_tokens=float(seq_len),
        mean_sq_len_tokens2=float(seq_len) ** 2,
        source=f"fixed seq_len {seq_len}",
    )


def _pad_up(xs: np.ndarray, multiple: int) -> np.ndarray:
    return np.ceil(xs / multiple) * multiple if multiple > 1 else xs


def expected_max_of_sample(sorted_lengths: Sequence[float], batch_size: int, pad_to_multiple_of: int = 1) -> float:
    """E[max of `batch_size` draws with replacement] from an empirical distribution (exact order statistics):
    sum_i x_(i) * ((i/n)^B - ((i-1)/n)^B), each length first padded up to a multiple (max commutes with it)."""
    _check_batch(batch_size)
    xs = _pad_up(np.sort(np.asarray(sorted_lengths, dtype=float)), pad_to_multiple_of)
    n = len(xs)
    if n == 0:
        raise TunecostError("no lengths given")
    cdf = np.arange(n + 1, dtype=float) / n
    weights = cdf[1:] ** batch_size - cdf[:-1] ** batch_size
    return float(np.dot(xs, weights))


def empirical_lengths(
    lengths: Sequence[int],
    batch_size: int,
    *,
    source: str = "measured lengths",
    cutoff_tokens: int = PAPER_CUTOFF_TOKENS,
) -> SeqLengths:
    xs = np.minimum(np.asarray(lengths, dtype=float), cutoff_tokens)
    if xs.size == 0 or np.any(xs < 1):
        raise TunecostError("lengths must be a non-empty list of positive token counts")
    return SeqLengths(
        batch_size=batch_size,
        padded_len_tokens=expected_max_of_sample(xs, batch_size, PAD_TO_MULTIPLE_OF),
        mean_len_tokens=float(xs.mean()),
        mean_sq_len_tokens2=float(np.mean(xs**2)),
        source=f"{source} ({xs.size} queries, cut at {cutoff_tokens})",
    )


def lognormal_quantiles(median_tokens: float, log_sigma: float, cutoff_tokens: int, batch_size: int = 1) -> np.ndarray:
    """The longest of `batch_size` log-normal lengths at `_GRID_POINTS` evenly spaced probabilities v (midpoints):
    Q(v^(1/B)), cut at `cutoff_tokens`; batch 1: the distribution's own quantiles."""
    from scipy.special import ndtri

    v = (np.arange(_GRID_POINTS) + 0.5) / _GRID_POINTS  # midpoint rule, smooth in B
    return np.minimum(median_tokens * np.exp(log_sigma * ndtri(v ** (1.0 / batch_size))), cutoff_tokens)


def lognormal_lengths(
    median_tokens: float,
    batch_size: int,
    *,
    log_sigma: float = DEFAULT_LOG_SIGMA,
    cutoff_tokens: int = PAPER_CUTOFF_TOKENS,
    source: str = "",
) -> SeqLengths:
    """Log-normal lengths with this median: E[max of B] = integral over v in (0,1) of Q(v^(1/B)) dv."""
    _check_batch(batch_size)
    if median_tokens <= 0 or log_sigma < 0:
        raise TunecostError(f"need median > 0 and sigma >= 0, got {median_tokens}, {log_sigma}")
    q_max = _pad_up(lognormal_quantiles(median_tokens, log_sigma, cutoff_tokens, batch_size), PAD_TO_MULTIPLE_OF)
    q = lognormal_quantiles(median_tokens, log_sigma, cutoff_tokens)
    label = source or (
        f"log-normal, median {median_tokens:g} tokens, sigma {log_sigma:g}, cut at {cutoff_tokens}, "
        f"padded to the longest (multiple of {PAD_TO_MULTIPLE_OF})"
    )
    return SeqLengths(
        batch_size=batch_size,
        padded_len_tokens=float(q_max.mean()),
        mean_len_tokens=float(q.mean()),
        mean_sq_len_tokens2=float(np.mean(q**2)),
        source=label,
    )


def log_sigma_from_p95(median_tokens: float, p95_tokens: float) -> float:
    """The spread of the log-normal with this median and 95th percentile: ln(p95 / median) / z_0.95."""
    if median_tokens <= 0 or p95_tokens < median_tokens:
        raise TunecostError(f"need 0 < median <= p95, got {median_tokens:g}, {p95_tokens:g}")
    return math.log(p95_tokens / median_tokens) / Z_95


def median_from_mean_tokens(mean_tokens: float, log_sigma: float) -> float:
    """The median of the log-normal with this mean and spread: mean = median * exp(sigma^2 / 2)."""
    return mean_tokens * math.exp(-(log_sigma**2) / 2)


@dataclass(frozen=True)
class LogNormalShape:
    """A catalog dataset's lengths as a log-normal: its median, spread and cut, and how they were taken."""

    median_tokens: float
    log_sigma: float
    cutoff_tokens: int
    label: str


def catalog_shape(
    facts: DatasetFacts, *, log_sigma: float = DEFAULT_LOG_SIGMA, cutoff_tokens: int | None = None
) -> LogNormalShape:
    """The log-normal of a catalog dataset from its best statistic (source 3 in docs/throughput-model.md, section
    `tunecost.estimate.throughput.lengths`); `log_sigma` is the spread used where the data give none (the paper's
    rows, a median without a p95, a mean); `cutoff_tokens`: the job's maximum length (default the paper's)."""
    limit = PAPER_CUTOFF_TOKENS if cutoff_tokens is None else cutoff_tokens
    if facts.has_paper_median:  # unchanged: the throughput model was calibrated on exactly these lengths
        median = facts.median_tokens_paper
        label = f"{facts.name}: log-normal, paper median {median:g} tokens, sigma {log_sigma:g}, cut at {limit}"
        return LogNormalShape(median, log_sigma, limit, label)
    cutoff = limit if facts.max_tokens is None else min(limit, int(facts.max_tokens))
    cut = f"cut at {'max ' if cutoff < limit else ''}{cutoff}"
    counted = f"counted with the {facts.tokenizer} tokenizer"
    if facts.median_tokens is not None:
        median = facts.median_tokens
        if facts.p95_tokens is not None:
            sigma = log_sigma_from_p95(median, facts.p95_tokens)
            shape = f"median {median:g} and p95 {facts.p95_tokens:g} tokens (sigma {sigma:.3f})"
        else:
            sigma = log_sigma
            shape = f"median {median:g} tokens, sigma {sigma:g} assumed (no p95)"
        return LogNormalShape(median, sigma, cutoff, f"{facts.name}: log-normal through {shape}, {counted}, {cut}")
    if facts.mean_tokens is not None:
        median = median_from_mean_tokens(facts.mean_tokens, log_sigma)
        label = (
            f"{facts.name}: log-normal from a mean (no median published) of {facts.mean_tokens:g} tokens, {counted}: "
            f"median taken as mean x exp(-sigma^2/2) = {median:.1f}, sigma {log_sigma:g} assumed, {cut}"
        )
        return LogNormalShape(median, log_sigma, cutoff, label)
    raise TunecostError(
        f"dataset {facts.name} has no token-length statistic in the catalog (no median, p95, max or mean tokens "
        f"per query: no source we know publishes one); {facts.counting_hint}, or --seq-len N"
    )


def catalog_lengths(
    facts: DatasetFacts, batch_size: int, *, log_sigma: float = DEFAULT_LOG_SIGMA, cutoff_tokens: int | None = None
) -> SeqLengths:
    """Lengths of a catalog dataset from its best statistic (`catalog_shape`, cut at `cutoff_tokens`), each batch
    padded to its longest."""
    shape = catalog_shape(facts, log_sigma=log_sigma, cutoff_tokens=cutoff_tokens)
    return lognormal_lengths(
        shape.median_tokens,
        batch_size,
        log_sigma=shape.log_sigma,
        cutoff_tokens=shape.cutoff_tokens,
        source=f"{shape.label}, padded to the longest in the batch",
    )


@lru_cache(maxsize=512)
def dataset_lengths(
    dataset: str, batch_size: int, *, log_sigma: float = DEFAULT_LOG_SIGMA, cutoff_tokens: int | None = None
) -> SeqLengths:
    """Lengths of a catalog dataset (any spelling the catalog resolves) from its best statistic, cut at
    `cutoff_tokens` (default the paper's)."""
    return catalog_lengths(get_dataset_facts(dataset), batch_size, log_sigma=log_sigma, cutoff_tokens=cutoff_tokens)


def catalog_longest_tokens(dataset: str, cutoff_tokens: int) -> int:
    """The longest query of a catalog dataset, cut at `cutoff_tokens`: its published maximum, else the log-normal's
    longest of the dataset's queries (its 1 - 1/N quantile)."""
    facts = get_dataset_facts(dataset)
    shape = catalog_shape(facts, cutoff_tokens=cutoff_tokens)
    if facts.max_tokens is not None:
        return shape.cutoff_tokens
    z = NormalDist().inv_cdf(1.0 - 1.0 / max(2, facts.num_queries))
    return min(shape.cutoff_tokens, math.ceil(shape.median_tokens * math.exp(shape.log_sigma * z)))


def has_length_statistic(dataset: str | None) -> bool:
    """Whether `dataset` is a catalog dataset whose lengths the catalog describes (a median, mean or the paper's)."""
    facts = find_dataset_facts(dataset) if dataset is not None else None
    return facts is not None and bool(facts.length_statistic)
