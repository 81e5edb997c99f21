"""Synthetic inputs are made batch by batch: a huge batch list costs nothing until a batch is asked for."""

from __future__ import annotations

import tracemalloc
import types

import numpy as np

from tunecost.limits import MAX_BATCH_SIZE, MAX_STEPS
from tunecost.profile.inputs import synthetic_source


def _reference_ids(vocab_size: int, seq_len: int, count: int, seed: int) -> list[list[int]]:
    """Query i: the i-th draw of `seq_len` ids in [3, vocab) from a generator seeded with `seed`."""
    rng = np.random.default_rng(seed)
    return [[int(v) for v in rng.integers(3, vocab_size, size=seq_len)] for _ in range(count)]


def test_building_a_huge_source_allocates_nothing_per_query() -> None:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        src = synthetic_source(vocab_size=32000, seq_len=128, num_queries=MAX_BATCH_SIZE * MAX_STEPS, seed=0)
        batches = src.iter_batches(MAX_BATCH_SIZE, MAX_STEPS)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert isinstance(batches, types.GeneratorType)
    assert len(src) == MAX_BATCH_SIZE * MAX_STEPS
    # 6.5e9 queries x 128 ids would be terabytes; the source and its generator hold a few objects.
    assert grown < 64 * 1024


def test_batches_keep_the_ids_of_a_seeded_generator() -> None:
    src = synthetic_source(vocab_size=500, seq_len=16, num_queries=2 * 3, seed=7)
    ref = _reference_ids(500, 16, 6, seed=7)
    batches = src.batches(2, 3)
    assert [row for b in batches for row in b.input_ids.tolist()] == ref
    assert [row for b in src.batches(2, 3) for row in b.input_ids.tolist()] == ref  # same ids on every call
    b = batches[0]
    assert b.labels.tolist() == b.input_ids.tolist() and int(b.attention_mask.sum()) == 2 * 16
    assert [q.ids for q in src.queries] == [tuple(r) for r in ref]
    assert src.longest_batch(2).input_ids.tolist() == ref[:2]


def test_a_small_source_cycles_its_queries() -> None:
    src = synthetic_source(vocab_size=50, seq_len=8, num_queries=2, seed=1)
    ref = _reference_ids(50, 8, 2, seed=1)
    rows = [row for b in src.batches(3, 2) for row in b.input_ids.tolist()]
    assert rows == [ref[i % 2] for i in range(6)]
