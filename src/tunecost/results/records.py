"""Run records (docs/dev/records.md): the one format version, row builders, the writer and the reader.

A run directory holds one JSON-lines file per kind of record (`fit.jsonl`, `estimate.jsonl`, `throughput.jsonl`,
...) and a `meta.json`. Every row carries `schema_version` and `kind`; `tunecost report RUN_DIR` draws whatever
records a directory holds, whichever command wrote them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tunecost.errors import TunecostError
from tunecost.io import atomic_write_text, read_jsonl
from tunecost.outputs import check_output_folder
from tunecost.results.schema import RECORD_KINDS, SCHEMA_VERSION, record_path

# Fields that name what a row is about: a new row with the same values replaces an old one only with `force`.
FIT_KEY = ("kind", "model", "dataset", "gpu", "form", "experts_per_token", "batch_size")
ESTIMATE_KEY = ("kind", "model", "dataset", "method", "experts_per_token", "estimator", "gpu", "provider")
VALIDATION_KEY = ("kind", "id", "quantity")
MULTI_GPU_KEY = ("kind", "model", "method", "batch_size", "seq_len", "gpu", "strategy", "num_gpus")


def record(kind: str, **fields: Any) -> dict[str, Any]:
    """One record row of `kind` (`schema.RECORD_KINDS`): the format version and kind first, then `fields`. A row
    without one of its kind's fields is its writer's bug (ValueError)."""
    spec = RECORD_KINDS.get(kind)
    if spec is None:
        raise ValueError(f"unknown record kind {kind!r}; the kinds are {', '.join(RECORD_KINDS)}")
    missing = [name for name in spec.fields if name not in fields]
    if missing:
        raise ValueError(f"a {kind!r} record lacks {', '.join(missing)}")
    return {"schema_version": SCHEMA_VERSION, "kind": kind, **fields}


def _as_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) and not isinstance(obj, type) else dict(obj)


def fit_rows(points: Iterable[Any], fits: Iterable[Any], *, source: str) -> list[dict[str, Any]]:
    """The `fit.jsonl` rows of eq. (2)'s fit (Fig. 14): one `fit_point` per measurement (`Measurement`), then one
    `fit` per fitted group (`ThroughputFit`). `source` says where the measurements came from."""
    rows = [record("fit_point", **_as_dict(p), source=source) for p in points]
    rows += [record("fit", **_as_dict(f)) for f in fits]
    return rows


def estimate_rows(cost_rows: Iterable[Any], *, method: str, experts_per_token: int) -> list[dict[str, Any]]:
    """The `estimate.jsonl` rows of a cost table (Table IV): each `CostRow` with the job's method and top-k."""
    return [record("estimate", experts_per_token=experts_per_token, method=method, **_as_dict(r)) for r in cost_rows]


def validation_rows(rows: Iterable[Any]) -> list[dict[str, Any]]:
    """The `validation.jsonl` rows of `tunecost validate`: each `ValidationRow` (prediction beside measurement)."""
    return [record("validation", **_as_dict(r)) for r in rows]


def multi_gpu_rows(answer: Any) -> list[dict[str, Any]]:
    """The `multi_gpu.jsonl` rows of a multi-GPU estimate (`MultiGpuEstimate`): one per (GPU, strategy, number of
    GPUs) evaluated, with the memory each rank needs, whether it fits, the step and the cost."""
    rows = []
    for s in answer.setups:
        rows.append(
            record(
                "multi_gpu",
                model=answer.model,
                method=answer.method,
                batch_size=answer.batch_size,
                seq_len=answer.seq_len,
                gpu=s.gpu.name,
                strategy=s.plan.strategy,
                num_gpus=s.plan.num_gpus,
                gpus_per_node=s.plan.gpus_per_node,
                expert_parallel=s.plan.expert_parallel,
                offload=s.plan.offload,
                fits=s.fits,
                fit=s.fit,
                micro_batch=s.micro_batch,
                need_bytes=s.memory.need_bytes,
                nvidia_smi_bytes=s.memory.nvidia_smi_bytes,
                gpu_memory_bytes=s.gpu.memory_bytes,
                step_seconds=s.timing.step_seconds if s.timing is not None else None,
                exposed_comm_share=s.exposed_comm_share,
                queries_per_s=s.queries_per_s,
                hours=s.cost.hours if s.cost is not None else None,
                usd=s.usd,
                provider=s.cost.price.provider if s.cost is not None and s.cost.price is not None else None,
                billed_gpus=s.cost.billed_gpus if s.cost is not None else None,
            )
        )
    return rows


def write_records(path: str | os.PathLike[str], rows: Sequence[dict[str, Any]]) -> Path:
    """Write `rows` as the whole of `path`, atomically (a run stage that is redone from scratch)."""
    return atomic_write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of one records file; rows of another format version raise `TunecostError` naming the file."""
    rows = read_jsonl(path)
    versions = {r.get("schema_version") for r in rows}
    if versions - {SCHEMA_VERSION}:
        raise TunecostError(
            f"{path}: records in format version {sorted(map(str, versions))}, this tunecost reads version "
            f"{SCHEMA_VERSION}; write to a new run directory or rerun the command that wrote it"
        )
    return rows


def add_records(
    path: str | os.PathLike[str], rows: Sequence[dict[str, Any]], *, key: Sequence[str], force: bool = False
) -> Path:
    """Add `rows` to the records file `path`, keeping every row it already holds about something else.

    Rows are the same record when they agree on every field of `key`. Without `force`, a new row that repeats
    an existing one raises `TunecostError` (nothing is written); with `force` the old rows are replaced. The file
    is rewritten atomically, so an interruption leaves the old file or the new one.
    """
    target = Path(path)
    check_output_folder(target.parent)  # a file, or a folder that is not a tunecost run's: nothing is written
    old = read_records(target) if target.exists() else []

    def ident(row: dict[str, Any]) -> str:
        return json.dumps([row.get(k) for k in key], default=str)

    new_ids = {ident(r) for r in rows}
    clashes = [r for r in old if ident(r) in new_ids]
    if clashes and not force:
        first = ", ".join(f"{k}={clashes[0].get(k)}" for k in key if clashes[0].get(k) is not None)
        raise TunecostError(
            f"{target} already holds {len(clashes)} of these records ({first}, ...); "
            "pass --force to replace them, or write to another run directory"
        )
    kept = [r for r in old if ident(r) not in new_ids]
    return write_records(target, [*kept, *rows])


def save_fit_records(
    run_dir: str | os.PathLike[str],
    points: Sequence[Any],
    fits: Sequence[Any],
    *,
    source: str,
    command: str | Sequence[str] | None = None,
    force: bool = False,
) -> Path:
    """Add an eq. (2) fit and its measurements to `run_dir/fit.jsonl` (and `meta.json`): what `tunecost fit
    --out RUN_DIR` writes and `tunecost report RUN_DIR` draws as Fig. 14."""
    path = add_records(record_path(run_dir, "fit"), fit_rows(points, fits, source=source), key=FIT_KEY, force=force)
    _note_run(run_dir, command)
    return path


def save_estimate_records(
    run_dir: str | os.PathLike[str],
    cost_rows: Sequence[Any],
    *,
    method: str,
    experts_per_token: int,
    command: str | Sequence[str] | None = None,
    force: bool = False,
) -> Path:
    """Add a cost table to `run_dir/estimate.jsonl` (and `meta.json`): what `tunecost estimate --out RUN_DIR`
    writes and `tunecost report RUN_DIR` shows as the cost table (Table IV)."""
    rows = estimate_rows(cost_rows, method=method, experts_per_token=experts_per_token)
    path = add_records(record_path(run_dir, "estimate"), rows, key=ESTIMATE_KEY, force=force)
    _note_run(run_dir, command)
    return path


def save_validation_records(
    run_dir: str | os.PathLike[str],
    rows: Sequence[Any],
    *,
    command: str | Sequence[str] | None = None,
    force: bool = False,
) -> Path:
    """Add validated rows to `run_dir/validation.jsonl` (and `meta.json`): what `tunecost validate --out RUN_DIR`
    writes and `tunecost report RUN_DIR` shows as the accuracy table and the predicted-vs-measured plot."""
    path = add_records(record_path(run_dir, "validation"), validation_rows(rows), key=VALIDATION_KEY, force=force)
    _note_run(run_dir, command)
    return path


def save_multi_gpu_records(
    run_dir: str | os.PathLike[str],
    answer: Any,
    *,
    command: str | Sequence[str] | None = None,
    force: bool = False,
) -> Path:
    """Add a multi-GPU estimate to `run_dir/multi_gpu.jsonl` (and `meta.json`): what `tunecost estimate --gpus ...
    --out RUN_DIR` writes and `tunecost report RUN_DIR` draws as memory per rank and cost vs number of GPUs."""
    path = add_records(record_path(run_dir, "multi_gpu"), multi_gpu_rows(answer), key=MULTI_GPU_KEY, force=force)
    _note_run(run_dir, command)
    return path


def _note_run(run_dir: str | os.PathLike[str], command: str | Sequence[str] | None) -> None:
    from tunecost.results.meta import run_metadata, update_run_metadata

    update_run_metadata(run_dir, run_metadata(command=command, measured_on_device=False))
