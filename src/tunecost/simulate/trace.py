"""Trace one step of a prepared model and reduce the recorder's log to peaks per segment and counts.

Segments are (phase, region) pairs: forward/backward/optimizer x {pre, prefix, unit_first, unit_last,
unit_mid, post, opt}. For a stack of identical units, every segment's peak is an affine function of the number
of units (activations saved per unit, gradients accumulated per unit, ...), which is what lets the simulator trace
two small depths and extrapolate (`depth.depth_scaled`); the middle units never peak above both ends (affine in the unit
index).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

import numpy as np

from tunecost.simulate.allocator import (
    KIND_INPUT,
    KIND_OPTIMIZER_STATE,
    KIND_STEP,
    KIND_WEIGHT,
    steady_state_reserved_bytes,
)
from tunecost.simulate.batch_line import BatchLine, LineStep
from tunecost.simulate.loops import LoopMismatch
from tunecost.simulate.recorder import StepRecorder
from tunecost.simulate.step import make_batch, run_step
from tunecost.simulate.step_types import CATEGORIES, WEIGHT_CATEGORIES, AllocationTrace
from tunecost.simulate.tensor_groups import static_layers


@dataclass
class SegmentPeak:
    total: int
    by_category: dict[str, int]
    by_group: dict[str, int]
    temporaries_by_group: dict[str, int] = field(default_factory=dict)


@dataclass
class TraceResult:
    num_layers: int
    num_units: int
    segments: dict[str, SegmentPeak]
    flops: dict[tuple[str, str], float]  # (phase, op class)
    bytes: dict[tuple[str, str], float]
    flops_by_group: dict[tuple[str, str], float]  # (module group, phase)
    weight_bytes: dict[str, int]  # "group/category" -> bytes of static weights
    seconds: float
    num_ops: int = 0
    peak_reserved_bytes: int = 0  # the caching allocator's reserve over a run of such steps (see `allocator`)
    allocations: AllocationTrace | None = None  # the step's allocations, for replays of other layouts
    extra: dict = field(default_factory=dict)


def _classify(rec_list, t_forward_end: int) -> tuple[np.ndarray, ...]:
    n = len(rec_list)
    t_alloc = np.empty(n, dtype=np.int64)
    t_free = np.empty(n, dtype=np.int64)
    t_grad = np.empty(n, dtype=np.int64)
    nbytes = np.empty(n, dtype=np.int64)
    big = np.iinfo(np.int64).max
    for i, r in enumerate(rec_list):
        t_alloc[i] = r.t_alloc
        t_free[i] = big if r.t_free is None else r.t_free
        t_grad[i] = big if r.t_grad is None else r.t_grad
        nbytes[i] = r.nbytes
    return t_alloc, t_free, t_grad, nbytes


def _codes(records, t_free: np.ndarray, t_fwd_end: int):
    """Category (before the gradient override) and module-group codes per storage record."""
    cat_names = list(CATEGORIES)
    group_names: list[str] = []
    group_index: dict[str, int] = {}
    cat_codes = np.empty(len(records), dtype=np.int64)
    group_codes = np.empty(len(records), dtype=np.int64)
    for i, r in enumerate(records):
        cat = r.static_category
        if cat is None:
            if r.phase == "forward":
                cat = "activations" if t_free[i] > t_fwd_end else "temporaries"
            elif r.phase == "recompute":
                cat = "activations"
            else:
                cat = "temporaries"
        cat_codes[i] = cat_names.index(cat)
        g = group_index.get(r.group)
        if g is None:
            g = group_index[r.group] = len(group_names)
            group_names.append(r.group)
        group_codes[i] = g
    group_names.append("gradients")
    return cat_codes, group_codes, cat_names, group_names


def analyze(rec: StepRecorder | LineStep, num_layers: int, seconds: float) -> TraceResult:
    records = rec.records
    num_ops = rec.t_end or 0
    t_alloc, t_free, t_grad, nbytes = _classify(records, rec.t_forward_end or num_ops)
    alloc_at = np.bincount(t_alloc, weights=nbytes, minlength=num_ops + 2)
    freed = t_free < np.iinfo(np.int64).max
    free_at = np.bincount(t_free[freed], weights=nbytes[freed], minlength=num_ops + 2)
    # live after op k = allocations up to k minus frees before k
    live = np.cumsum(alloc_at)[: num_ops + 1] - np.concatenate(([0.0], np.cumsum(free_at)[:num_ops]))

    t_fwd_end = rec.t_forward_end if rec.t_forward_end is not None else num_ops
    cat_codes, group_codes, cat_names, group_names = _codes(records, t_free, t_fwd_end)
    grad_code, temp_code = cat_names.index("gradients"), cat_names.index("temporaries")
    keys: dict[str, list[int]] = {}
    for k, segs in enumerate(rec.op_segments, start=1):
        for key in segs:
            keys.setdefault(key, []).append(k)
    segments: dict[str, SegmentPeak] = {}
    for key, ops in keys.items():
        ops_arr = np.asarray(ops)
        k_star = int(ops_arr[np.argmax(live[ops_arr])])
        alive = (t_alloc <= k_star) & (t_free >= k_star)
        cats = np.where(t_grad <= k_star, grad_code, cat_codes)
        by_cat_arr = np.bincount(cats[alive], weights=nbytes[alive], minlength=len(cat_names))
        groups = np.where(cats == grad_code, len(group_names) - 1, group_codes)
        by_group_arr = np.bincount(groups[alive], weights=nbytes[alive], minlength=len(group_names))
        transient = alive & (cats == temp_code)
        by_temp_arr = np.bincount(groups[transient], weights=nbytes[transient], minlength=len(group_names))
        segments[key] = SegmentPeak(
            total=int(live[k_star]),
            by_category={cat_names[i]: int(v) for i, v in enumerate(by_cat_arr) if v},
            by_group={group_names[i]: int(v) for i, v in enumerate(by_group_arr) if v},
            temporaries_by_group={group_names[i]: int(v) for i, v in enumerate(by_temp_arr) if v},
        )

    weight_bytes: dict[str, int] = {}
    for r in records:
        if r.static_category in WEIGHT_CATEGORIES:
            key = f"{r.group}/{r.static_category}"
            weight_bytes[key] = weight_bytes.get(key, 0) + r.nbytes
    c = rec.counter
    kind, t_optimizer = _replay_kinds(rec)
    return TraceResult(
        peak_reserved_bytes=steady_state_reserved_bytes(nbytes, t_alloc, t_free, kind, t_optimizer),
        allocations=_allocation_trace(rec, (t_alloc, t_free, t_grad, nbytes), kind, t_optimizer, cat_codes),
        num_layers=num_layers,
        num_units=rec.plan.num_units,
        segments=segments,
        flops=dict(c.flops),
        bytes=dict(c.bytes),
        flops_by_group=dict(c.flops_by_group),
        weight_bytes=weight_bytes,
        seconds=seconds,
        num_ops=num_ops,
    )


def _replay_kinds(rec: StepRecorder | LineStep) -> tuple[np.ndarray, int]:
    """The allocator replay's kind per record (weights loaded once, optimizer states placed by the first step,
    the batch, the step's own tensors) and the index of the first optimizer op."""
    kinds = {c: KIND_WEIGHT for c in WEIGHT_CATEGORIES} | {"optimizer_states": KIND_OPTIMIZER_STATE}
    kinds["inputs"] = KIND_INPUT
    kind = np.fromiter((kinds.get(r.static_category or "", KIND_STEP) for r in rec.records), np.int64, len(rec.records))
    opt_ops = [k for k, segs in enumerate(rec.op_segments, start=1) if segs == ("optimizer:opt",)]
    t_optimizer = opt_ops[0] if opt_ops else len(rec.op_segments) + 1
    return kind, t_optimizer


def _allocation_trace(
    rec: StepRecorder | LineStep, arrays, kind: np.ndarray, t_optimizer: int, cat_codes
) -> AllocationTrace:
    t_alloc, t_free, t_grad, nbytes = arrays
    category = np.where(t_grad < np.iinfo(np.int64).max, CATEGORIES.index("gradients"), cat_codes)
    op_layer = np.asarray([-1, *rec.op_layers], dtype=np.int64)  # op indices start at 1
    own_layer = np.fromiter((r.layer for r in rec.records), np.int64, len(rec.records))
    is_forward = np.asarray([False, *(bool(s) and s[0].startswith("forward:") for s in rec.op_segments)])
    is_backward = np.asarray([False, *(bool(s) and s[0].startswith("backward:") for s in rec.op_segments)])
    num_layers = rec.plan.num_layers

    def window(mask: np.ndarray, layer: int) -> list[int]:
        ops = np.flatnonzero(mask & (op_layer == layer))
        return [int(ops[0]), int(ops[-1])] if len(ops) else [-1, -1]

    return AllocationTrace(
        nbytes=nbytes.tolist(),
        t_alloc=t_alloc.tolist(),
        t_free=t_free.tolist(),
        kind=kind.tolist(),
        category=category.tolist(),
        layer=np.where(own_layer >= 0, own_layer, op_layer[np.minimum(t_alloc, len(op_layer) - 1)]).tolist(),
        forward_ops=[window(is_forward, i) for i in range(num_layers)],
        backward_ops=[window(is_backward, i) for i in range(num_layers)],
        t_optimizer=t_optimizer,
        num_ops=len(rec.op_segments),
    )


def trace_step(prepared, batch_size: int, seq_len: int, *, round_bytes: int = 512) -> TraceResult:
    """Run one recorded step of `prepared` at (batch_size, seq_len), or read it off the line of the steps traced at
    other batch sizes (`batch_line`; fake tensors only)."""
    line = None
    if prepared.fake_mode is not None:
        line = prepared.batch_lines.setdefault((seq_len, round_bytes), BatchLine(round_bytes))
        read = read_off_line(line, batch_size)
        if read is not None:
            return read
    start = time.perf_counter()
    try:
        rec = _record(prepared, batch_size, seq_len, round_bytes, sample_loops=True)
    except LoopMismatch:  # a sampled loop's backward iterations differed: every loop whole
        rec = None
    if rec is None:
        gc.collect()  # the aborted step's graph (a cycle through its hooks) must not outlive it
        rec = _record(prepared, batch_size, seq_len, round_bytes, sample_loops=False)
    if line is not None:
        line.observe(batch_size, rec)
    return analyze(rec, prepared.plan.num_layers, time.perf_counter() - start)


def _record(prepared, batch_size: int, seq_len: int, round_bytes: int, *, sample_loops: bool) -> StepRecorder:
    vocab = int(getattr(prepared.model.config, "vocab_size", 0) or prepared.spec.vocab_size)
    batch = make_batch(vocab, batch_size, seq_len, prepared.fake_mode)
    rec = StepRecorder(
        plan=prepared.plan, module_info=prepared.module_info, round_bytes=round_bytes, sample_loops=sample_loops
    )
    layers = static_layers(prepared.model, prepared.module_info, prepared.optimizer)
    for tensor, category, group in prepared.static:
        rec.register_static(tensor, category, group, layers.get(id(tensor), -1))
    for tensor in batch.values():
        rec.register_static(tensor, "inputs", "other")
    rec.install_hooks(prepared.model, prepared.trainable)
    try:
        run_step(prepared, batch, rec)
    finally:
        rec.finish()
    return rec


def read_off_line(line: BatchLine, batch_size: int) -> TraceResult | None:
    """The step at `batch_size` read off `line` (`simulate.batch_line`); None where it must be traced."""
    start = time.perf_counter()
    step = line.step_at(batch_size)
    return None if step is None else analyze(step, step.plan.num_layers, time.perf_counter() - start)
