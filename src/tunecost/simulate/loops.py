"""Loops of like iterations in a recorded step (Liger's loss chunks and row blocks): on fake tensors the recorder
runs the first three and the last, and writes the ones between as copies of the second, each shifted by its length,
so the record is the one the whole loop leaves (design: docs/memory-model.md, `simulate.loops`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

MIN_COUNT = 5  # iterations 0-2 and the last run: a shorter loop runs whole


def recorded_loop(rec: Any, count: int) -> Iterator[int]:
    """Indices 0..count-1 of a loop under the recorder `rec` (a `StepRecorder`): 0-2 and the last run; the rest are
    the second repeated, where the second and third agree op for op and storage for storage, else all run."""
    if count < MIN_COUNT or rec.phase == "setup" or rec.counter.log is not None:  # nested: the outer one repeats
        yield from range(count)
        return
    rec.counter.log = []
    try:
        yield 0
        marks = [_mark(rec)]
        yield 1
        marks.append(_mark(rec))
        yield 2
        marks.append(_mark(rec))
        log = rec.counter.log
    finally:
        rec.counter.log = None
    if _repeat(rec, marks, log, count - 4):
        yield count - 1
    else:
        yield from range(3, count)


def _mark(rec: Any) -> tuple[int, int, int]:
    return rec.t, len(rec.records), len(rec.counter.log)


def _repeat(rec: Any, marks: list[tuple[int, int, int]], log: list, times: int) -> bool:
    """Write `times` copies of the second iteration after the third, or False (nothing written) where the second
    and third differ: other ops, other storages, or a storage that outlives the iteration after its own."""
    (t0, n0, w0), (t1, n1, w1), (t2, n2, w2) = marks
    span = t1 - t0
    first, second = rec.records[n0:n1], rec.records[n1:n2]
    ops, segs = rec.op_layers, rec.op_segments
    if rec.resized or t2 - t1 != span or len(first) != len(second) or log[w0:w1] != log[w1:w2]:
        return False
    if ops[t0:t1] != ops[t1:t2] or segs[t0:t1] != segs[t1:t2]:
        return False
    for a, b in zip(first, second):
        same = (a.nbytes, a.raw_nbytes, a.phase, a.group, a.static_category, a.t_alloc + span)
        if same != (b.nbytes, b.raw_nbytes, b.phase, b.group, b.static_category, b.t_alloc):
            return False
        if a.t_free is None or a.t_grad is not None or b.t_grad is not None:
            return False
        if b.t_free not in (None, a.t_free + span):
            return False
    for b, a in zip(second, first):  # the third's storages are freed by the last iteration, at the fourth's times
        b.t_free = a.t_free + span
    for k in range(2, times + 2):
        shift = k * span
        rec.records += [dataclasses.replace(a, t_alloc=a.t_alloc + shift, t_free=a.t_free + shift) for a in first]
        rec.op_segments += segs[t0:t1]
        rec.op_layers += ops[t0:t1]
        for entry in log[w0:w1]:
            rec.counter.add(*entry)
    rec.t += times * span
    return True
