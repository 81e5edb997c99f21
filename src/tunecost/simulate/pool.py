"""Prepared (fake) models kept per workload shape within a process: a batch-size search re-steps the same model
instead of rebuilding it. The key leaves out batch size and lengths, which only change the inputs, and the FP8
recipe, which the simulator adds after the trace (`simulate.fp8`)."""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import asdict

from tunecost.simulate.behaviour import DEFAULT_BEHAVIOUR, StackBehaviour
from tunecost.workload.job import FineTuneJob

_POOL: OrderedDict[str, object] = OrderedDict()
_POOL_SIZE = 6
_LINES: dict[str, dict] = {}  # shape key -> its steps' `batch_line.BatchLine`s: kept when the model is evicted


def _shape_key(job: FineTuneJob, num_units: int, behaviour: StackBehaviour) -> str:
    fields = asdict(job)
    for k in ("batch_size", "grad_accum", "seq_len", "lengths", "dataset", "fp8"):
        fields.pop(k, None)
    return json.dumps([fields, num_units, asdict(behaviour)], sort_keys=True, default=str)


def prepared_model(job: FineTuneJob, num_units: int, behaviour: StackBehaviour = DEFAULT_BEHAVIOUR):
    from tunecost.simulate.prepare import build_prepared

    key = _shape_key(job, num_units, behaviour)
    hit = _POOL.get(key)
    if hit is not None:
        _POOL.move_to_end(key)
        return hit
    prepared = build_prepared(job, num_units=num_units, behaviour=behaviour)
    prepared.batch_lines = _LINES.setdefault(key, {})
    _POOL[key] = prepared
    while len(_POOL) > _POOL_SIZE:
        _POOL.popitem(last=False)
    return prepared


def clear() -> None:
    _POOL.clear()
    _LINES.clear()
