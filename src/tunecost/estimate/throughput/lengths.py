"""Sequence lengths as the throughput model sees them: tokens per padded batch and the attention work.

The paper's trainer pads every batch to its longest query, rounded up to a multiple of 8 (LLaMA-Factory's
`DataCollatorForSeq2Seq(pad_to_multiple_of=8)`; no packing, no length grouping, shuffled sampling). So a batch of
B queries costs B x E[ceil8(max of B lengths)] tokens in every matmul, while FlashAttention-2 (varlen, unpadded)
costs sum of l^2 over the real lengths.

Where the lengths come from, best first:
1. a fixed `seq_len` (every query padded or cut to it: the paper's latency runs);
2. real per-query lengths (`tunecost.workload.lengths.LengthDistribution.lengths`, or `FineTuneJob.lengths`):
   exact order statistics, E[max of B draws with replacement];
3. a log-normal with the paper's median (Fig. 2: 79 tokens commonsense_15k, 174 math_14k; the dataset catalog)
   and a spread `DEFAULT_LOG_SIGMA`, cut at the paper's cutoff_len 1024.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tunecost.errors import TunecostError

PAPER_CUTOFF_TOKENS = 1024  # LLaMA-Factory --cutoff_len in the artifact's scripts
PAD_TO_MULTIPLE_OF = 8  # LLaMA-Factory's collator
# Std. dev. of log(tokens per query). The paper gives medians only. Measured here: 0.32 on LLM-Adapters'
# math_data.json (3000 queries, Mixtral tokenizer, prompt + response); the commonsense mix of eight tasks with
# different medians is wider. 0.35 for both; docs/throughput-model.md shows the sensitivity.
DEFAULT_LOG_SIGMA = 0.35
_GRID_POINTS = 4000


@dataclass(frozen=True, kw_only=True)
class SeqLengths:
    """What one batch of `batch_size` queries costs in tokens."""

    batch_size: int
    padded_len_tokens: float  # E[longest query in the batch]: every query of the batch is padded to it
    mean_len_tokens: float  # E[real length]: tokens that carry loss
    mean_sq_len_tokens2: float  # E[l^2]: FlashAttention-2 varlen work per query (l^2 / 2 causal)
    source: str

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
    from scipy.special import ndtri

    v = (np.arange(_GRID_POINTS) + 0.5) / _GRID_POINTS  # midpoint rule, smooth in B
    z_max = ndtri(v ** (1.0 / batch_size))
    z = ndtri(v)
    q_max = _pad_up(np.minimum(median_tokens * np.exp(log_sigma * z_max), cutoff_tokens), PAD_TO_MULTIPLE_OF)
    q = np.minimum(median_tokens * np.exp(log_sigma * z), cutoff_tokens)
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


@lru_cache(maxsize=512)
def dataset_lengths(dataset: str, batch_size: int, *, log_sigma: float = DEFAULT_LOG_SIGMA) -> SeqLengths:
    """Lengths of a catalog dataset from the paper's median (Fig. 2 / Table II) and a log-normal spread."""
    from tunecost.catalog.datasets import get_dataset_facts

    facts = get_dataset_facts(dataset)
    median = facts.median_tokens_paper
    if not math.isfinite(median) or median <= 0:
        raise TunecostError(f"dataset {facts.name} has no median length in the catalog; give seq_len")
    return lognormal_lengths(
        median,
        batch_size,
        log_sigma=log_sigma,
        source=f"{facts.name}: log-normal, paper median {median:g} tokens, sigma {log_sigma:g}, "
        f"cut at {PAPER_CUTOFF_TOKENS}, padded to the longest in the batch",
    )
