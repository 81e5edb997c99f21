"""A traced step's allocations at the model's full depth, built from a trace of fewer repeating units: the last
traced unit but one repeated, with its links to the units beside it, until the model is whole. The caching
allocator's reserve is replayed over it (its fragmentation does not scale with depth the way the allocated peak
does); docs/memory-model.md, "Reserved memory".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tunecost.simulate.allocator import KIND_STEP, NEVER_FREED, steady_state_replay
from tunecost.simulate.step_types import AllocationTrace

if TYPE_CHECKING:
    from tunecost.simulate.trace import TraceResult

_COLUMNS = ("nbytes", "t_alloc", "t_free", "kind")
TOLERANCE_BYTES = 2**20  # the full-depth replay's peak requests against the depth-scaled peak (and 0.1 %)

Position = tuple[int, str, int]  # (0: the lower traced unit, 1: the upper; pass "f" or "b"; offset in its ops)


@dataclass(frozen=True)
class _Timeline:
    """Where the lower (lo) and upper (hi) traced unit's forward and backward ops lie, and the op indices once
    `copies` units are inserted between them."""

    f_lo: int  # first op of lo's forward (its leading ops without events left out)
    f_hi: int
    b_lo: int
    b_hi: int
    f_end: int  # last op of lo's forward: the copies' forward follows it
    b_end: int  # last op of hi's backward: the copies' backward follows it
    f_len: int
    b_len: int
    copies: int

    def shifted(self, op: int) -> int:
        """An op of the traced step on the full-depth timeline."""
        if op == NEVER_FREED or op <= self.f_end:
            return op
        return op + self.copies * (self.f_len if op <= self.b_end else self.f_len + self.b_len)

    def position(self, op: int) -> Position | None:
        for unit, pass_, first, length in (
            (0, "f", self.f_lo, self.f_len),
            (1, "f", self.f_hi, self.f_len),
            (0, "b", self.b_lo, self.b_len),
            (1, "b", self.b_hi, self.b_len),
        ):
            if first <= op < first + length:
                return unit, pass_, op - first
        return None

    def op_at(self, copy: int, pass_: str, offset: int) -> int:
        """The op at `offset` of inserted unit `copy` (1..copies; 0 is lo, copies + 1 is hi)."""
        if copy == 0:
            return self.shifted((self.f_lo if pass_ == "f" else self.b_lo) + offset)
        if copy == self.copies + 1:
            return self.shifted((self.f_hi if pass_ == "f" else self.b_hi) + offset)
        if pass_ == "f":
            return self.f_end + 1 + (copy - 1) * self.f_len + offset
        return self.b_end + self.copies * self.f_len + 1 + (self.copies - copy) * self.b_len + offset


def _unit_window(windows: list[list[int]], layers: range) -> tuple[int, int] | None:
    spans = [windows[i] for i in layers]
    if not spans or any(first < 0 for first, _last in spans):
        return None
    return min(first for first, _ in spans), max(last for _, last in spans)


def _trim(lo: tuple[int, int], hi: tuple[int, int], busy: np.ndarray) -> tuple[int, int, int] | None:
    """The two units' first ops and common length once the longer one's leading ops without events are left out
    (the first unit's forward can start with a device check of its input); None where that does not even them."""
    (a_lo, z_lo), (a_hi, z_hi) = lo, hi
    extra = (z_lo - a_lo) - (z_hi - a_hi)
    if extra > 0 and not busy[a_lo : a_lo + extra].any():
        a_lo += extra
    elif extra < 0 and not busy[a_hi : a_hi - extra].any():
        a_hi -= extra
    elif extra:
        return None
    return a_lo, a_hi, z_lo - a_lo + 1


def _timeline(trace: AllocationTrace, prefix: int, period: int, units: int, copies: int) -> _Timeline | None:
    lo_layers = range(prefix + (units - 2) * period, prefix + (units - 1) * period)
    hi_layers = range(prefix + (units - 1) * period, prefix + units * period)
    windows = [_unit_window(w, r) for w in (trace.forward_ops, trace.backward_ops) for r in (lo_layers, hi_layers)]
    f_lo, f_hi, b_lo, b_hi = windows
    if None in windows or f_lo[1] + 1 != f_hi[0] or b_hi[1] + 1 != b_lo[0]:  # type: ignore[index]
        return None
    busy = np.zeros(trace.num_ops + 2, dtype=bool)
    step = np.asarray(trace.kind) == KIND_STEP
    busy[np.asarray(trace.t_alloc)[step]] = True
    t_free = np.asarray(trace.t_free)[step]
    busy[t_free[t_free != NEVER_FREED]] = True
    forward = _trim(f_lo, f_hi, busy)  # type: ignore[arg-type]
    backward = _trim(b_lo, b_hi, busy)  # type: ignore[arg-type]
    if forward is None or backward is None:
        return None
    return _Timeline(*forward[:2], *backward[:2], f_lo[1], b_hi[1], forward[2], backward[2], copies)  # type: ignore[index]


def _link(t: _Timeline, free_lo: Position | None, free_hi: Position | None, t_free: tuple[int, int]):
    """How an inserted unit's record (lo's and hi's records at the same place) ends: in the unit below (-1), in
    itself (0), in the unit above (+1), at an op outside the units ('op'); None where lo and hi disagree."""
    if free_hi is not None and free_hi[0] == 0 and free_lo is None:
        return -1, free_hi[1], free_hi[2]
    if free_lo is not None and free_lo[0] == 0:
        return (0, free_lo[1], free_lo[2]) if free_hi == (1, free_lo[1], free_lo[2]) else None
    if free_lo is not None and free_lo[0] == 1:
        return 1, free_lo[1], free_lo[2]
    if free_lo is None and free_hi is None and t_free[0] == t_free[1]:
        return "op", "", t.shifted(t_free[0])
    return None


def full_depth_allocations(
    trace: AllocationTrace, prefix: int, period: int, units: int, full_units: int
) -> AllocationTrace | None:
    """`trace` (a step of `units` >= 2 repeating units of `period` layers after `prefix` layers) at `full_units`:
    units traced last but one inserted until the depth is whole, each allocating what that unit allocates and
    freeing it where that unit and the last one show a unit frees it; the weights, optimizer states and the
    records an op outside the units allocates for a unit's layers (foreach optimizer steps) once more per inserted
    unit. None where the two traced units do not match op for op and record for record (the caller keeps its
    depth-scaled figure)."""
    copies = full_units - units
    if units < 2 or copies < 0:
        return None
    t = _timeline(trace, prefix, period, units, copies)
    if t is None:
        return None
    lo_first = prefix + (units - 2) * period
    template = _unit_template(trace, t)
    grouped = _grouped_copies(trace, t, lo_first, period)
    if template is None or grouped is None:
        return None
    return _assemble(trace, t, lo_first, period, template, grouped)


def _unit_template(trace: AllocationTrace, t: _Timeline):
    """Per record an inserted unit allocates: lo's record and where its copy is allocated and freed; and the
    traced records whose free moves to an inserted unit (lo's that ended in hi, hi's that ended in lo)."""
    n = len(trace.nbytes)
    alloc_at = [t.position(trace.t_alloc[i]) if trace.kind[i] == KIND_STEP else None for i in range(n)]
    free_at = [t.position(trace.t_free[i]) if trace.kind[i] == KIND_STEP else None for i in range(n)]
    by_place: dict[tuple, list[list[int]]] = {}
    for i, where in enumerate(alloc_at):
        if where is not None:
            by_place.setdefault(where[1:], [[], []])[where[0]].append(i)
    template: list[tuple[int, tuple]] = []
    relinked: dict[int, int] = {}  # record -> its new free op
    for (pass_, offset), (los, his) in by_place.items():
        if len(los) != len(his):
            return None
        for i, j in zip(los, his, strict=True):
            if trace.nbytes[i] != trace.nbytes[j]:
                return None
            link = _link(t, free_at[i], free_at[j], (trace.t_free[i], trace.t_free[j]))
            if link is None:
                return None
            template.append((i, (pass_, offset, *link)))
            if link[0] == 1:  # lo's record now ends in the first inserted unit
                relinked[i] = t.op_at(1, link[1], link[2])
            elif link[0] == -1:  # hi's record now ends in the last inserted unit
                relinked[j] = t.op_at(t.copies, link[1], link[2])
    return sorted(template), relinked


def _grouped_copies(trace: AllocationTrace, t: _Timeline, lo_first: int, period: int) -> dict[int, list[int]] | None:
    """lo's records allocated outside the units' ops (weights, optimizer states, a foreach op's outputs), by the
    last of each group (a kind of static, or an op): the group's records an inserted unit repeats after it. None
    where hi's group differs from lo's."""
    groups: dict[tuple, list[list[int]]] = {}
    for i in range(len(trace.nbytes)):
        unit = (trace.layer[i] - lo_first) // period
        step = trace.kind[i] == KIND_STEP
        if unit not in (0, 1) or trace.layer[i] < lo_first or (step and t.position(trace.t_alloc[i]) is not None):
            continue
        if step and t.position(trace.t_free[i]) is not None:
            return None
        groups.setdefault(("op", trace.t_alloc[i]) if step else ("static", trace.kind[i]), [[], []])[unit].append(i)
    out = {}
    for los, his in groups.values():
        if [trace.nbytes[i] for i in los] != [trace.nbytes[j] for j in his]:
            return None
        if los:
            out[los[-1]] = los
    return out


def _assemble(trace, t: _Timeline, lo_first: int, period: int, unit_template, grouped) -> AllocationTrace:
    template, relinked = unit_template
    columns: dict[str, list[int]] = {k: [] for k in ("nbytes", "t_alloc", "t_free", "kind", "category", "layer")}
    shift = t.copies * period

    def add(i: int, t_alloc: int, t_free: int, layer: int) -> None:
        for key, value in (
            ("nbytes", trace.nbytes[i]),
            ("t_alloc", t_alloc),
            ("t_free", t_free),
            ("kind", trace.kind[i]),
            ("category", trace.category[i]),
            ("layer", layer),
        ):
            columns[key].append(value)

    for i in range(len(trace.nbytes)):
        layer = trace.layer[i]
        add(
            i,
            t.shifted(trace.t_alloc[i]),
            relinked.get(i, t.shifted(trace.t_free[i])),
            layer + shift * (layer >= lo_first + period),
        )
        for copy in range(1, t.copies + 1) if i in grouped else ():
            for j in grouped[i]:
                add(j, t.shifted(trace.t_alloc[j]), t.shifted(trace.t_free[j]), trace.layer[j] + copy * period)
    for copy in range(1, t.copies + 1):
        for i, (pass_, offset, direction, free_pass, free_offset) in template:
            free = free_offset if direction == "op" else t.op_at(copy + direction, free_pass, free_offset)
            add(i, t.op_at(copy, pass_, offset), free, trace.layer[i] + copy * period)
    return AllocationTrace(
        **columns,
        forward_ops=_windows(trace.forward_ops, t, t.f_lo, "f", lo_first, period),
        backward_ops=_windows(trace.backward_ops, t, t.b_lo, "b", lo_first, period),
        t_optimizer=t.shifted(trace.t_optimizer),
        num_ops=trace.num_ops + t.copies * (t.f_len + t.b_len),
    )


def _windows(windows: list[list[int]], t: _Timeline, first: int, pass_: str, lo_first: int, period: int):
    """Per layer of the full depth, the first and last op of its pass."""
    out = [[t.shifted(a), t.shifted(b)] if a >= 0 else [a, b] for a, b in windows[: lo_first + period]]
    for copy in range(1, t.copies + 1):
        for a, b in windows[lo_first : lo_first + period]:
            out.append([t.op_at(copy, pass_, max(a, first) - first), t.op_at(copy, pass_, b - first)])
    out += [[t.shifted(a), t.shifted(b)] if a >= 0 else [a, b] for a, b in windows[lo_first + period :]]
    return out


@dataclass(frozen=True)
class WholeStep:
    """The step's allocations at full depth and the caching allocator's peak reserve replayed over them."""

    allocations: AllocationTrace
    peak_reserved_bytes: int


def whole_step(
    ta: TraceResult,
    tb: TraceResult | None,
    full_units: int,
    peak_bytes: float,
    deeper: Callable[[], TraceResult | None] | None = None,
) -> WholeStep | None:
    """The deeper of two traces (units a < b) made whole, where the replay's peak requests equal the depth-scaled
    allocated peak `peak_bytes` (else some allocation was not repeated), else a trace one unit deeper (`deeper()`:
    where the first traced unit differs from the others) made whole with `tb` as the shallower; None where
    neither is (one trace: it is already at full depth)."""
    made = _made_whole(ta, tb, full_units, peak_bytes)
    if made is None and tb is not None and tb is not ta and deeper is not None and not _optimizer_ops_per_unit(ta, tb):
        made = _made_whole(tb, deeper(), full_units, peak_bytes)
    return made


def _period(ta: TraceResult, tb: TraceResult) -> int:
    """Layers per repeating unit: what the deeper trace `tb` adds per unit over `ta`."""
    return (tb.num_layers - ta.num_layers) // max(1, tb.num_units - ta.num_units)


def _optimizer_ops_per_unit(ta: TraceResult, tb: TraceResult) -> bool:
    """True where some op of `tb`'s optimizer step allocates for one traced unit's tensors alone (a multi-tensor
    step run tensor by tensor, as over DTensors): no deeper trace makes such a step whole, whatever its depth."""
    trace = tb.allocations
    if trace is None or tb.num_units < 2:
        return False
    period = _period(ta, tb)
    lo_first = tb.num_layers - 2 * period
    units_by_op: dict[int, set[int]] = {}
    for i in range(len(trace.nbytes)):
        if trace.kind[i] == KIND_STEP and trace.t_alloc[i] > trace.t_optimizer and trace.layer[i] >= lo_first:
            units_by_op.setdefault(trace.t_alloc[i], set()).add((trace.layer[i] - lo_first) // period)
    return any(len(units) == 1 for units in units_by_op.values())


def _made_whole(ta: TraceResult, tb: TraceResult | None, full_units: int, peak_bytes: float) -> WholeStep | None:
    if tb is None or tb is ta or tb.allocations is None or tb.num_units < 2:
        return None
    period = _period(ta, tb)
    prefix = tb.num_layers - tb.num_units * period
    full = full_depth_allocations(tb.allocations, prefix, period, tb.num_units, full_units)
    if full is None:
        return None
    nbytes, t_alloc, t_free, kind = (np.asarray(getattr(full, k), dtype=np.int64) for k in _COLUMNS)
    replay = steady_state_replay(nbytes, t_alloc, t_free, kind, full.t_optimizer)
    if abs(replay.peak_requested_bytes - peak_bytes) > max(TOLERANCE_BYTES, 1e-3 * peak_bytes):
        return None
    return WholeStep(full, replay.peak_reserved_bytes)
