"""The record kinds tunecost writes: each kind's file and the fields every row of it carries, and the point id of
a profiled point. docs/dev/records.md describes them; `results.records.record` checks a row against its kind.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
# what a profiled point is measured under; a row of a point carries them and its `point_id`
POINT_KEYS = ("model", "method", "experts_per_token", "batch_size", "seq_len", "dataset", "device")
_POINT_ID_ORDER = ("model", "method", "experts_impl", "experts_per_token", "batch_size", "seq_len", "dataset", "device")


@dataclass(frozen=True)
class RecordKind:
    file: str  # the run directory's file its rows go to
    fields: tuple[str, ...]  # what every row carries besides `schema_version` and `kind`


def _point(*fields: str) -> tuple[str, ...]:
    return (*POINT_KEYS, "point_id", *fields)


RECORD_KINDS: dict[str, RecordKind] = {
    # a profiled point: its completion row, then one file per measurement
    "point": RecordKind("points.jsonl", _point("status")),
    "throughput": RecordKind("throughput.jsonl", _point("queries_per_s", "num_queries", "seconds", "steps")),
    "stages": RecordKind("stages.jsonl", _point("stage", "seconds", "steps")),
    "layers": RecordKind("layers.jsonl", _point("pass", "layer_index", "component", "seconds")),
    "kernels": RecordKind("kernels.jsonl", _point("kernel_class", "seconds", "count", "source")),
    "expert_load": RecordKind("expert_load.jsonl", _point("phase", "layer_index", "expert", "tokens")),
    "memory": RecordKind("memory.jsonl", _point("peak_bytes", "source")),
    "overhead": RecordKind(
        "overhead.jsonl", _point("instrumentation", "instrumented_seconds", "plain_seconds", "ratio")
    ),
    "trainer_step": RecordKind(
        "trainer_steps.jsonl",
        _point("step", "forward_seconds", "backward_seconds", "optimizer_seconds", "step_seconds"),
    ),
    "max_batch": RecordKind(
        "max_batch.jsonl",
        ("model", "method", "experts_per_token", "seq_len", "device", "max_batch_size", "source", "estimator"),
    ),
    "counters": RecordKind(
        "counters.jsonl", ("point_id", "model", "method", "device", "kernel_class", "duration_s", "sm_pct", "dram_pct")
    ),
    "utilization": RecordKind("utilization.json", ("model", "method", "device", "source", "classes")),
    "rank": RecordKind("ranks.jsonl", ("point_id", "rank", "world_size", "strategy", "median_step_seconds")),
    "trainability": RecordKind(
        "trainability.jsonl", ("model", "experts_per_token", "routing", "dataset", "device", "epoch", "accuracy")
    ),
    "lengths": RecordKind("lengths.jsonl", ("dataset", "tokenizer", "template")),
    "fit_point": RecordKind(
        "fit.jsonl", ("model", "dataset", "gpu", "experts_per_token", "batch_size", "queries_per_s")
    ),
    "fit": RecordKind("fit.jsonl", ("model", "dataset", "gpu", "form", "coefficients", "rmse", "mape", "num_points")),
    "estimate": RecordKind(
        "estimate.jsonl", ("model", "method", "experts_per_token", "dataset", "gpu", "provider", "estimator")
    ),
    "validation": RecordKind("validation.jsonl", ("id", "quantity", "measured", "predicted", "unit", "status")),
    "multi_gpu": RecordKind(
        "multi_gpu.jsonl", ("model", "method", "gpu", "strategy", "num_gpus", "fits", "need_bytes", "gpu_memory_bytes")
    ),
    "plan_option": RecordKind(
        "plan.jsonl", ("model", "goal", "method", "gpu", "num_gpus", "strategy", "offload", "why_not", "on_front")
    ),
}


def record_path(run_dir: str | os.PathLike[str], kind: str) -> Path:
    """The file of `run_dir` that rows of `kind` go to."""
    return Path(run_dir) / RECORD_KINDS[kind].file


def point_id(keys: Mapping[str, Any]) -> str:
    """A stable string of a point's keys (same keys -> same id, whatever the order)."""
    parts = [f"{k}={'-' if keys.get(k) is None else keys.get(k)}" for k in _POINT_ID_ORDER if k in keys]
    parts += [f"{k}={keys[k]}" for k in sorted(k for k in keys if k not in _POINT_ID_ORDER)]
    return "|".join(parts)
