"""Turn a point's measurements into the tidy rows of docs/dev/records.md and write them resumably.

Sources and derivations: docs/profiling.md, section `tunecost.profile.point_rows`.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tunecost.io import append_jsonl, atomic_write_text, read_jsonl
from tunecost.profile.point import PointMeasurement
from tunecost.profile.timers import median_step_index
from tunecost.results.records import record
from tunecost.results.schema import record_path

KINDS: tuple[str, ...] = ("throughput", "stages", "layers", "kernels", "expert_load", "memory", "overhead")


def point_rows(m: PointMeasurement, *, extra: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    """All rows of one measured point, by record kind. An "oom" point has only its `point` row. Every row
    carries `num_experts` when `extra` gives it (what "dense", top-k == num_experts, is read from)."""
    num_experts = (extra or {}).get("num_experts")

    base = {**m.workload.keys(), "point_id": m.workload.point_id}
    base = base if num_experts is None else {**base, "num_experts": num_experts}

    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in (*KINDS, "point")}
    done = {"status": m.status, "message": m.message, "elapsed_seconds": m.elapsed_seconds}
    point = record("point", **{**base, **done, **(extra or {})})
    rows["point"].append(point)
    if m.status == "done":
        _measured_rows(rows, m, base)
    point["row_counts"] = {kind: len(rows[kind]) for kind in KINDS}
    return rows


def _measured_rows(rows: dict[str, list[dict[str, Any]]], m: PointMeasurement, base: dict[str, Any]) -> None:
    _timing_rows(rows, m, base)
    _breakdown_rows(rows, m, base)
    _overhead_rows(rows, m, base)


def _timing_rows(rows: dict[str, list[dict[str, Any]]], m: PointMeasurement, base: dict[str, Any]) -> None:
    """Throughput of the plain steps, and the stages of the median step."""
    steps = len(m.plain)
    plain_seconds = sum(s.wall_seconds for s in m.plain)
    rows["throughput"].append(
        record(
            "throughput",
            **base,
            queries_per_s=m.num_queries / plain_seconds,
            tokens_per_s=m.num_tokens / plain_seconds,
            num_queries=m.num_queries,
            num_tokens=m.num_tokens,
            padded_tokens=m.padded_tokens,
            seconds=plain_seconds,
            steps=steps,
            wall_step_seconds=statistics.median(s.wall_seconds for s in m.plain),
            gpu_busy_step_seconds=None if m.gpu_busy is None else m.gpu_busy.busy_seconds,
            gpu_busy_method=None if m.gpu_busy is None else m.gpu_busy.method,
        )
    )
    times = [s.times for s in m.plain]
    mid = times[median_step_index(times)]
    for stage in ("forward", "backward", "optimizer", "step"):
        per_step = [t.stage_seconds(stage) for t in times]
        rows["stages"].append(
            record(
                "stages",
                **base,
                stage=stage,
                seconds=mid.stage_seconds(stage),
                median_seconds=statistics.median(per_step),
                mean_seconds=statistics.fmean(per_step),
                per_step_seconds=per_step,
                steps=steps,
                timer=m.timer,
                note="seconds: the median step (by step time), so stages add up to it",
            )
        )


def _breakdown_rows(rows: dict[str, list[dict[str, Any]]], m: PointMeasurement, base: dict[str, Any]) -> None:
    """Layers, kernel classes, expert load and peak memory, where the point measured them."""
    if m.layers is not None and m.layers_step is not None:
        pass_total = {
            "forward": m.layers_step.forward_seconds,
            "backward": m.layers_step.backward_seconds,
            "recompute": m.layers_step.backward_seconds,
        }
        for row in m.layers.rows():
            rows["layers"].append(
                record("layers", **{**base, **row, "step_pass_seconds": pass_total[row["pass"]], "timer": m.timer})
            )
    if m.kernels is not None:
        for c in m.kernels.classes:
            rows["kernels"].append(
                record(
                    "kernels",
                    **base,
                    kernel_class=c.kernel_class,
                    seconds=c.seconds,
                    count=c.count,
                    source=m.kernels.source,
                    timing=m.kernels.timing,
                    scope="moe_layer",
                    profiled_seconds=m.kernels.profiled_seconds,
                )
            )
    for phase, load in (("before", m.load_before), ("after", m.load_after)):
        if load is not None:
            for row in load.rows():
                rows["expert_load"].append(
                    record("expert_load", **{**base, "phase": phase, **row, "num_queries": m.num_queries})
                )
    if m.memory is not None and m.memory.peak_bytes is not None:
        rows["memory"].append(
            record(
                "memory", **{**base, "peak_bytes": m.memory.peak_bytes, "source": m.memory.source, **m.memory.detail}
            )
        )


def _overhead_rows(rows: dict[str, list[dict[str, Any]]], m: PointMeasurement, base: dict[str, Any]) -> None:
    """What the layer hooks and torch.profiler cost beside the plain steps."""
    steps = len(m.plain)
    plain_seconds = sum(s.wall_seconds for s in m.plain)
    if m.instrumented and len(m.instrumented) == len(m.plain):
        inst = sum(s.wall_seconds for s in m.instrumented)
        rows["overhead"].append(
            record(
                "overhead",
                **base,
                instrumentation="layer-hooks",
                instrumented_seconds=inst,
                plain_seconds=plain_seconds,
                ratio=inst / plain_seconds,
                steps=steps,
            )
        )
    if m.kernels is not None:
        plain_median = statistics.median(s.wall_seconds for s in m.plain)
        rows["overhead"].append(
            record(
                "overhead",
                **base,
                instrumentation="torch.profiler",
                instrumented_seconds=m.kernels.profiled_seconds,
                plain_seconds=plain_median,
                ratio=m.kernels.profiled_seconds / plain_median,
                steps=1,
            )
        )


def write_point(out_dir: str | Path, m: PointMeasurement, *, extra: dict[str, Any] | None = None) -> None:
    """Append every row of the point, then its completion row (last, so a kill leaves the point unfinished)."""
    out = Path(out_dir)
    rows = point_rows(m, extra=extra)
    for kind in KINDS:
        for row in rows[kind]:
            append_jsonl(record_path(out, kind), row)
    for row in rows["point"]:
        append_jsonl(record_path(out, "point"), row)


def _intact(
    completions: dict[str, dict[str, Any]], rows_by_kind: dict[str, list[dict[str, Any]]]
) -> dict[str, dict[str, Any]]:
    """The completion rows whose points have every row they count (a row without counts is trusted: older runs)."""
    counts: dict[tuple[str, Any], int] = {}
    for kind, rows in rows_by_kind.items():
        for r in rows:
            counts[(kind, r.get("point_id"))] = counts.get((kind, r.get("point_id")), 0) + 1
    intact = {}
    for pid, row in completions.items():
        expected = row.get("row_counts")
        if isinstance(expected, dict) and any(
            counts.get((kind, pid), 0) != n for kind, n in expected.items() if kind in rows_by_kind
        ):
            continue
        intact[pid] = row
    return intact


def finished_points(out_dir: str | Path) -> dict[str, dict[str, Any]]:
    """point_id -> its completion row, for points whose rows are all intact."""
    out = Path(out_dir)
    completions = {r["point_id"]: r for r in read_jsonl(record_path(out, "point")) if "point_id" in r}
    return _intact(completions, {kind: read_jsonl(record_path(out, kind)) for kind in KINDS})


def purge_unfinished(out_dir: str | Path, kinds: Iterable[str] = KINDS) -> int:
    """Drop the rows of points that are unfinished (no completion row: an interrupted point) or damaged (a row it
    counts is missing or cut), and their completion rows, so they run again; rewrite files with broken lines so
    each damage is reported once. Rows without a `point_id` are kept. Returns how many rows were dropped."""
    import json

    out = Path(out_dir)
    files = {kind: record_path(out, kind) for kind in kinds} | {"point": record_path(out, "point")}
    rows = {kind: read_jsonl(path) for kind, path in files.items()}
    completions = {r["point_id"]: r for r in rows["point"] if "point_id" in r}
    done = set(_intact(completions, {k: v for k, v in rows.items() if k != "point"}))
    dropped = 0
    for kind, path in files.items():
        if not path.exists():
            continue
        keep = [r for r in rows[kind] if "point_id" not in r or r.get("point_id") in done]
        lines = sum(1 for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip())
        broken = lines != len(rows[kind]) or not path.read_bytes().endswith(b"\n")
        if len(keep) != len(rows[kind]) or broken:
            dropped += len(rows[kind]) - len(keep)
            atomic_write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in keep))
    return dropped


def read_rows(out_dir: str | Path, kind: str) -> list[dict[str, Any]]:
    """The rows a run folder holds of one record kind (`schema.RECORD_KINDS`)."""
    return read_jsonl(record_path(out_dir, kind))


def summary(out_dir: str | Path, point_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """One row per point from the record files: throughput, stages, memory, MoE share, overhead, load variance."""
    out = Path(out_dir)
    wanted = None if point_ids is None else list(point_ids)
    points = finished_points(out)
    by_kind = {k: _index(read_rows(out, k)) for k in KINDS}
    table = []
    for pid in wanted if wanted is not None else list(points):
        p = points.get(pid)
        if p is None:
            continue
        row: dict[str, Any] = {
            k: p.get(k)
            for k in (
                "model",
                "method",
                "experts_impl",
                "experts_per_token",
                "num_experts",
                "batch_size",
                "seq_len",
                "dataset",
                "device",
                "status",
            )
        }
        row["point_id"] = pid
        thr = by_kind["throughput"].get(pid, [])
        if thr:
            row.update(queries_per_s=thr[0]["queries_per_s"], tokens_per_s=thr[0]["tokens_per_s"])
        for s in by_kind["stages"].get(pid, []):
            row[f"{s['stage']}_seconds"] = s["seconds"]
        layers = by_kind["layers"].get(pid, [])
        if layers:
            total = sum(r["seconds"] for r in layers)
            moe = sum(r["seconds"] for r in layers if r["component"] in ("moe_router", "moe_experts"))
            row["moe_share"] = moe / total if total > 0 else None
        mem = by_kind["memory"].get(pid, [])
        if mem:
            row["peak_bytes"] = mem[0]["peak_bytes"]
        for o in by_kind["overhead"].get(pid, []):
            if o.get("instrumentation") == "layer-hooks":
                row["overhead_ratio"] = o["ratio"]
        for phase in ("before", "after"):
            load = [r for r in by_kind["expert_load"].get(pid, []) if r["phase"] == phase]
            if load:
                row[f"load_variance_{phase}"] = _mean_layer_variance(load)
        kern = by_kind["kernels"].get(pid, [])
        if kern:
            row["kernel_classes"] = len(kern)
        table.append(row)
    return table


def _index(rows: list[dict[str, Any]]) -> dict[str | None, list[dict[str, Any]]]:
    out: dict[str | None, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r.get("point_id"), []).append(r)
    return out


def _mean_layer_variance(rows: list[dict[str, Any]]) -> float:
    by_layer: dict[int, list[int]] = {}
    for r in rows:
        by_layer.setdefault(r["layer_index"], []).append(r["tokens"])
    return statistics.fmean(statistics.pvariance(v) for v in by_layer.values())
