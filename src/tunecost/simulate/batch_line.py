"""Steps of one prepared model at more batch sizes than were traced: at a fixed length, every storage's bytes
and every op's work are affine in the batch size, so where traces at three or more batch sizes share one structure
and lie on one line, a step between them is that line (design: docs/memory-model.md, `simulate.batch_line`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from tunecost.simulate.recorder import LayerPlan, StorageRecord, _OpCounter

MIN_BATCH = 2  # batch size 1 takes other paths (broadcasts, squeezes): always traced
MIN_POINTS = 3  # traced batch sizes (of both parities, coprime) before a step is read off the line


@dataclass
class LineStep:
    """What `trace.analyze` reads of a recorder, for a step read off the line."""

    records: list[StorageRecord]
    t_end: int | None
    t_forward_end: int | None
    op_segments: list[tuple[str, ...]]
    op_layers: list[int]
    counter: _OpCounter
    plan: LayerPlan


@dataclass
class BatchLine:
    """The traced steps of one prepared model at one length and granule, by batch size; `broken` once two of them
    differ in structure or a third leaves the line of the first two."""

    round_bytes: int
    broken: bool = False
    template: LineStep | None = None  # the first traced step: the structure every other must share
    structure: tuple = ()
    raw: dict[int, np.ndarray] = field(default_factory=dict)  # batch -> each record's unrounded bytes
    counts: dict[int, list[int]] = field(default_factory=dict)  # batch -> the counters' values, in key order

    def observe(self, batch: int, rec) -> None:
        """Add a traced step (a finished `StepRecorder`) at `batch`."""
        if self.broken or batch < MIN_BATCH or batch in self.raw:
            return
        if rec.resized or rec.not_affine or not all(_is_whole(v) for v in _values(rec.counter)):
            self.broken = True
            return
        structure = _structure(rec)
        if self.template is None:
            self.template = LineStep(
                [dataclasses.replace(r) for r in rec.records],
                rec.t_end,
                rec.t_forward_end,
                rec.op_segments,
                rec.op_layers,
                rec.counter,
                rec.plan,
            )
            self.structure = structure
        elif structure != self.structure:
            self.broken = True
            return
        raw = np.fromiter((r.raw_nbytes for r in rec.records), np.int64, len(rec.records))
        counts = [int(v) for v in _values(rec.counter)]
        if len(self.raw) >= 2 and not (np.array_equal(self._raw_at(batch), raw) and self._counts_at(batch) == counts):
            self.broken = True
            return
        self.raw[batch], self.counts[batch] = raw, counts

    def step_at(self, batch: int) -> LineStep | None:
        """The step at `batch` read off the line, or None where it must be traced: off the traced range, too few
        points, a line that broke."""
        seen = sorted(self.raw)
        if self.broken or len(seen) < MIN_POINTS or not seen[0] <= batch <= seen[-1]:
            return None
        if len({b % 2 for b in seen}) < 2 or math.gcd(*seen) != 1:  # an even split at these sizes is one at all
            return None
        if batch in self.raw:
            raw, counts = self.raw[batch], self.counts[batch]
        else:
            raw, counts = self._raw_at(batch), self._counts_at(batch)
            if (raw < 0).any() or min(counts, default=0) < 0:  # not whole bytes or work there: trace it
                return None
        t = self.template
        assert t is not None
        r = self.round_bytes
        nbytes = raw if r <= 1 else -(-raw // r) * r
        records = [
            dataclasses.replace(rec, nbytes=int(n), raw_nbytes=int(w))
            for rec, n, w in zip(t.records, nbytes, raw, strict=True)
        ]
        counter = _OpCounter()
        values = iter(counts)
        for name in ("flops", "bytes", "flops_by_group"):
            template = getattr(t.counter, name)
            setattr(counter, name, {k: type(v)(next(values)) for k, v in template.items()})
        return LineStep(records, t.t_end, t.t_forward_end, t.op_segments, t.op_layers, counter, t.plan)

    def _anchors(self) -> tuple[int, int]:
        b0, b1 = sorted(self.raw)[:2]
        return b0, b1

    def _raw_at(self, batch: int) -> np.ndarray:
        b0, b1 = self._anchors()
        v0, v1 = self.raw[b0], self.raw[b1]
        step, rest = np.divmod((v1 - v0) * (batch - b0), b1 - b0)
        return np.where(rest == 0, v0 + step, -1)  # -1: not a whole byte, off any traced step

    def _counts_at(self, batch: int) -> list[int]:
        b0, b1 = self._anchors()
        out = []
        for v0, v1 in zip(self.counts[b0], self.counts[b1], strict=True):
            step, rest = divmod((v1 - v0) * (batch - b0), b1 - b0)
            out.append(v0 + step if rest == 0 else -1)
        return out


def _values(counter: _OpCounter) -> list:
    return [*counter.flops.values(), *counter.bytes.values(), *counter.flops_by_group.values()]


def _is_whole(value) -> bool:
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 2**53)


def _structure(rec) -> tuple:
    """Everything of a traced step but its sizes: each storage's lifetime, phase, group and category, each op's
    segment and layer, and the counters' keys."""
    records = tuple((r.t_alloc, r.t_free, r.t_grad, r.phase, r.group, r.static_category) for r in rec.records)
    c = rec.counter
    keys = (tuple(c.flops), tuple(c.bytes), tuple(c.flops_by_group))
    return records, tuple(rec.op_segments), tuple(rec.op_layers), rec.t_end, rec.t_forward_end, keys
