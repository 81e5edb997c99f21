"""Loops of like iterations in a recorded step (Liger's loss chunks and row blocks, TRL's checkpointed loss chunks
and their backward): on fake tensors the recorder runs the first three and the last, and writes the ones between as
copies of the second, each shifted by its length, so the record is the one the whole loop leaves (design:
docs/memory-model.md, `simulate.loops`)."""

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


class LoopMismatch(RuntimeError):
    """The backward of a sampled loop's iterations differ: the step is traced again with every loop whole."""


class SampledBackward:
    """The backward of one loop `recorded_loop` may sample, whose iterations autograd walks back one by one (the
    last, then 2, 1 and 0 where iterations 0-2 and the last ran): when it reaches iteration 0, the backward of the
    iterations that did not run is written as copies of iteration 2's (`LoopMismatch` where 2 and 1 differ)."""

    def __init__(self, rec: Any, count: int) -> None:
        self.rec, self.count = rec, count
        self.ran: list[int] = []
        self.marks: list[tuple[int, int, int]] = []

    def iteration(self, i: int, output: Any) -> None:
        """Iteration `i` ran and left `output`, whose gradient starts its backward."""
        self.ran.append(i)
        if i <= 2 and self.count >= MIN_COUNT:
            output.register_hook(self._hook(i))

    def _hook(self, i: int) -> Any:
        def hook(_grad: Any) -> None:
            rec = self.rec
            if self.ran != [0, 1, 2, self.count - 1]:
                return  # the whole loop ran
            if i == 2:
                rec.counter.log = []
            self.marks.append(_mark(rec))
            if i == 0:
                log, rec.counter.log = rec.counter.log, None
                if not _insert(rec, self.marks, log, self.count - 4):
                    raise LoopMismatch(f"the backward of a sampled loop of {self.count} iterations differs")

        return hook


def _mark(rec: Any) -> tuple[int, int, int]:
    return rec.t, len(rec.records), len(rec.counter.log)


def _alike(rec: Any, marks: list[tuple[int, int, int]], log: list) -> bool:
    """Whether the iteration between the first two marks and the one between the last two agree: the same ops,
    storages of the same bytes, each freed by the iteration after its own at the same offset (or still alive)."""
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
    return True


def _copies(rec: Any, marks: list[tuple[int, int, int]], log: list, ks: range) -> tuple[list, list, list]:
    """The records, op segments and op layers of the first iteration shifted by k iterations for each k in `ks`, its
    counter adds added once per k."""
    (t0, n0, w0), (t1, n1, w1) = marks[:2]
    span, first = t1 - t0, rec.records[n0:n1]
    records, segs, layers = [], [], []
    for k in ks:
        shift = k * span
        records += [dataclasses.replace(a, t_alloc=a.t_alloc + shift, t_free=a.t_free + shift) for a in first]
        segs += rec.op_segments[t0:t1]
        layers += rec.op_layers[t0:t1]
        for entry in log[w0:w1]:
            rec.counter.add(*entry)
    return records, segs, layers


def _repeat(rec: Any, marks: list[tuple[int, int, int]], log: list, times: int) -> bool:
    """Write `times` copies of the second iteration after the third, or False (nothing written) where the second
    and third differ (`_alike`)."""
    if not _alike(rec, marks, log):
        return False
    (t0, n0, _w0), (t1, n1, _w1), (_t2, n2, _w2) = marks
    span = t1 - t0
    for b, a in zip(rec.records[n1:n2], rec.records[n0:n1]):  # the third's are freed by the last, at the fourth's times
        b.t_free = a.t_free + span
    records, segs, layers = _copies(rec, marks, log, range(2, times + 2))
    rec.records += records
    rec.op_segments += segs
    rec.op_layers += layers
    rec.t += times * span
    return True


def _insert(rec: Any, marks: list[tuple[int, int, int]], log: list, times: int) -> bool:
    """Write `times` copies of the second iteration between it and the third (whose records, and frees inside it,
    move past them), or False where the two differ (`_alike`): the third's storages keep the free times the next
    iteration gave them, so a next one unlike the others (iteration 0's backward: its running sum starts at a
    constant) is recorded as it ran."""
    if not _alike(rec, marks, log):
        return False
    (t0, _n0, _w0), (t1, n1, _w1), (_t2, _n2, _w2) = marks
    moved = times * (t1 - t0)
    for r in rec.records:
        if r.t_alloc > t1:  # the third's own: allocated and (maybe) freed after the copies
            r.t_alloc += moved
            r.t_free = None if r.t_free is None else r.t_free + moved
    records, segs, layers = _copies(rec, marks, log, range(1, times + 1))
    rec.records[n1:n1] = records
    rec.op_segments[t1:t1] = segs
    rec.op_layers[t1:t1] = layers
    rec.t += moved
    return True
