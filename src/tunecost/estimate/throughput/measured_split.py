"""Host time vs GPU time of measured steps, read from a `tunecost profile` run directory.

Per finished point: the median wall time of a training step and, on CUDA, its GPU-busy time (union of device
activity intervals, tunecost.profile.gpu_busy). Their difference is time a faster GPU does not remove, which lets a
calibration separate GPU work from host work with one measured GPU. On CPU the GPU-busy time is None (null in the
records): there is no separate device.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunecost.errors import TunecostError
from tunecost.profile.point_rows import finished_points, read_rows
from tunecost.results.schema import record_path


@dataclass(frozen=True, kw_only=True)
class MeasuredSplit:
    model: str
    method: str
    experts_per_token: int | None
    batch_size: int
    seq_len: int | None
    dataset: str | None
    device: str  # "cpu" | "cuda"
    gpu: str | None  # the device's name from the run's meta.json (e.g. "NVIDIA H100 80GB HBM3")
    wall_step_seconds: float  # median wall time of a plain step, device synchronised at both edges
    gpu_busy_step_seconds: float | None  # device-busy time of a step; None where not measured (CPU)

    @property
    def key(self) -> tuple[str, str, int | None, int, str | None]:
        """(model, method, experts per token, batch size, GPU): what a calibration point is matched on."""
        return (self.model, self.method, self.experts_per_token, self.batch_size, self.gpu)

    @property
    def host_step_seconds(self) -> float | None:
        """Wall time the device was not busy: host work, launches, synchronisation (None without GPU-busy)."""
        if self.gpu_busy_step_seconds is None:
            return None
        return max(0.0, self.wall_step_seconds - self.gpu_busy_step_seconds)


def _device_name(run: Path) -> str | None:
    meta = run / "meta.json"
    if not meta.is_file():
        return None
    try:
        doc = json.loads(meta.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TunecostError(f"{meta}: not valid JSON ({exc})") from None
    device = doc.get("device") if isinstance(doc, dict) else None
    name = device.get("name") if isinstance(device, dict) else None
    return str(name) if name else None


def _seconds(path: Path, row: dict[str, Any], field: str, *, optional: bool) -> float | None:
    value = row.get(field)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise TunecostError(f"{path}: point {row.get('point_id')!r}: {field} must be a positive number, got {value!r}")
    return float(value)


def read_measured_split(run_dir: str | Path) -> list[MeasuredSplit]:
    """One `MeasuredSplit` per finished point of a profile run directory (in the order of throughput.jsonl)."""
    run = Path(run_dir)
    path = record_path(run, "throughput")
    if not run.is_dir():
        raise TunecostError(f"profile run directory {run} not found")
    if not path.is_file():
        raise TunecostError(f"{run} has no throughput.jsonl: not a `tunecost profile` run directory")
    done = {pid for pid, p in finished_points(run).items() if p.get("status") == "done"}
    gpu = _device_name(run)
    out = []
    for row in read_rows(run, "throughput"):
        if row.get("point_id") not in done:
            continue
        wall = _seconds(path, row, "wall_step_seconds", optional=True)
        if wall is None:  # records written before wall_step_seconds: the mean step instead
            total = _seconds(path, row, "seconds", optional=False)
            wall = float(total or 0.0) / max(1, int(row.get("steps") or 1))
        out.append(
            MeasuredSplit(
                model=str(row.get("model")),
                method=str(row.get("method")),
                experts_per_token=row.get("experts_per_token"),
                batch_size=int(row.get("batch_size") or 0),
                seq_len=row.get("seq_len"),
                dataset=row.get("dataset"),
                device=str(row.get("device")),
                gpu=gpu,
                wall_step_seconds=wall,
                gpu_busy_step_seconds=_seconds(path, row, "gpu_busy_step_seconds", optional=True),
            )
        )
    return out
