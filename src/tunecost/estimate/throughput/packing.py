"""Packed rows: queries concatenated into rows of seq_len tokens (axolotl's sample_packing, TRL's packing,
torchtune's packed datasets, LLaMA-Factory's packing): how many queries a row holds and the attention work in it.

Derivation: docs/throughput-model.md, section `tunecost.estimate.throughput.packing`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from tunecost.catalog.datasets import get_dataset_facts
from tunecost.errors import TunecostError
from tunecost.estimate.throughput.lengths import SeqLengths, catalog_shape, lognormal_quantiles
from tunecost.workload.job import FineTuneJob


def packed_rows(lengths: Sequence[int], row_tokens: int) -> int:
    """Rows of `row_tokens` tokens that best-fit decreasing packs the queries into (each cut at `row_tokens`):
    every query, longest first, goes into the row it leaves least room in, or opens a row."""
    return _best_fit_decreasing(lengths, row_tokens)[0]


def _best_fit_decreasing(lengths: Sequence[int], row_tokens: int) -> tuple[int, int]:
    """(rows, room left in the emptiest row) of best-fit decreasing."""
    if row_tokens < 1:
        raise TunecostError(f"a packed row must hold >= 1 token, got {row_tokens}")
    free: list[int] = []  # room left in the rows not yet full, ascending
    rows = 0
    for n in sorted((min(int(x), row_tokens) for x in lengths), reverse=True):
        i = bisect.bisect_left(free, n)
        if i < len(free):
            left = free.pop(i) - n
        else:
            rows += 1
            left = row_tokens - n
        if left:
            bisect.insort(free, left)
    return rows, (free[-1] if free else 0)


@lru_cache(maxsize=64)
def _rows_of(lengths: tuple[int, ...], row_tokens: int) -> float:
    """Rows the queries fill, the emptiest counted by its share: a sample standing for a larger dataset, or a
    dataset under one row, is not priced as whole rows it does not fill."""
    rows, room = _best_fit_decreasing(lengths, row_tokens)
    return rows - room / row_tokens


def packed_lengths(
    lengths: Sequence[int], row_tokens: int, batch_size: int, *, per_document: bool, source: str
) -> SeqLengths:
    """A batch of `batch_size` packed rows: `row_tokens` tokens each, holding the queries `lengths` describes.
    `per_document`: attention stays within each query (its causal l^2 work); else one causal mask spans the row."""
    if batch_size < 1:
        raise TunecostError(f"batch size must be >= 1, got {batch_size}")
    xs = np.minimum(np.asarray(lengths, dtype=np.int64), row_tokens)
    if xs.size == 0 or np.any(xs < 1):
        raise TunecostError("lengths must be a non-empty list of positive token counts")
    rows = _rows_of(tuple(int(x) for x in xs), row_tokens)
    per_row = xs.size / rows
    fill = float(xs.sum()) / (rows * row_tokens)
    if per_document:
        mean, mean_sq, seqs, attention = float(xs.mean()), float(np.mean(xs.astype(float) ** 2)), per_row, "per query"
    else:
        mean, mean_sq, seqs, attention = float(row_tokens), float(row_tokens) ** 2, 1.0, "across the row"
    return SeqLengths(
        batch_size=batch_size,
        padded_len_tokens=float(row_tokens),
        mean_len_tokens=mean,
        mean_sq_len_tokens2=mean_sq,
        queries_per_row=per_row,
        attention_seqs_per_row=seqs,
        source=f"{source}, packed into rows of {row_tokens} tokens (best-fit decreasing): {per_row:.2f} queries per "
        f"row, {fill:.1%} full, attention {attention}",
    )


def job_packed_lengths(job: FineTuneJob) -> SeqLengths:
    """A packing job's batch of rows: its data's own lengths, else its catalog dataset's log-normal (as the
    quantiles `lognormal_quantiles` gives, cut at the row or the dataset's longest)."""
    row = job.seq_len
    if row is None or job.packing == "none":
        raise TunecostError("packed lengths need a packing job with a seq_len (the row's tokens)")
    per_document = job.packing == "per-document"
    if job.lengths:
        source = f"{job.dataset or 'dataset'}: {len(job.lengths)} measured lengths"
        if job.dataset is None and job.lengths == (row,):  # the CLI's rows of unknown data (`JobOptions._full_rows`)
            source = "the data's lengths unknown: full rows, one query each"
        return packed_lengths(job.lengths, row, job.batch_size, per_document=per_document, source=source)
    if job.dataset is None:
        raise TunecostError("packing: give the data (--dataset) whose queries fill the rows")
    facts = get_dataset_facts(job.dataset)
    try:
        shape = catalog_shape(facts, cutoff_tokens=row)
    except TunecostError:
        raise TunecostError(
            f"packing: dataset {facts.name} has no token-length statistic in the catalog, so the queries a packed row "
            f"holds are unknown; {facts.counting_hint}, or --packing none"
        ) from None
    cut = shape.cutoff_tokens
    quantiles = lognormal_quantiles(shape.median_tokens, shape.log_sigma, cut)
    sample = np.maximum(np.rint(quantiles), 1).astype(np.int64)  # whole tokens, at least one
    source = (
        f"{facts.name}: log-normal, median {shape.median_tokens:g} tokens, sigma {shape.log_sigma:.3f}, cut at {cut}"
    )
    return packed_lengths(tuple(sample.tolist()), row, job.batch_size, per_document=per_document, source=source)


def queries_per_row(job: FineTuneJob) -> float:
    """The queries a packed row of `job` holds (1: not packed): a step's batch counts rows."""
    return 1.0 if job.packing == "none" else job_packed_lengths(job.with_(batch_size=1)).queries_per_row
