"""What a calibration keeps on disk: its fitted parameters and its held-out errors, numbers only, per key.

A key missing from the user's cache is looked up in the copy shipped with tunecost (`SHIPPED_CACHE`: the bundled
calibration's files, written by `benchmarks/seed_calibration_cache.py --write`), so a first run does not refit it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from tunecost.estimate.throughput.intervals import HeldOut, IntervalEvidence
from tunecost.io import cache_root

SHIPPED_CACHE = Path(__file__).resolve().parent / "data"
FIT_VERSION = 1  # bump when the fit's model or priors change what the cached parameters mean
EVIDENCE_VERSION = 4  # bump when what the held-out checks compute changes


def _path(folder: str, points: Sequence[Any], *parts: Any) -> Path:
    """The file in the cache `folder` keyed by the points (targets, throughputs, run lengths) and `parts`."""
    points_key = [(p.target, p.queries_per_s, p.run_queries) for p in points]
    key = repr((points_key, *parts))
    return cache_root() / folder / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def fit_cache_path(points: Sequence[Any], options: Any, fingerprint: np.ndarray) -> Path:
    """Where the fitted parameters of these points under these options are kept (numbers only)."""
    return _path("calibration-fits", points, FIT_VERSION, options, [f"{v:.12g}" for v in fingerprint])


def evidence_cache_path(points: Sequence[Any], options: Any, params: Any) -> Path:
    """Where the held-out errors of the calibration of these points (fitted to `params`) are kept."""
    return _path("interval-evidence", points, EVIDENCE_VERSION, options, params)


def _read(path: Path) -> Any:
    """The JSON kept at `path` in the user's cache, else the shipped file of the same folder and name."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        text = (SHIPPED_CACHE / path.parent.name / path.name).read_text()
    return json.loads(text)


def cached_fit(path: Path, size: int) -> np.ndarray | None:
    try:
        x = np.array(_read(path)["x"], dtype=float)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return x if x.shape == (size,) and np.all(np.isfinite(x)) else None


def cached_evidence(path: Path) -> IntervalEvidence | None:
    """The held-out errors kept at `path`; None when there are none (or a torn or older file)."""

    def held(h: dict | None) -> HeldOut | None:
        if h is None:
            return None
        return HeldOut(
            kind=h["kind"],
            errors=tuple(float(x) for x in h["errors"]),
            source=h["source"],
            cross_architecture=tuple(bool(x) for x in h["cross_architecture"]),
            distances=tuple(float(x) for x in h["distances"]),
        )

    try:
        d = _read(path)
        return IntervalEvidence(
            transfer=held(d["transfer"]), workload=held(d["workload"]), batch=held(d["batch"]), note=str(d["note"])
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def evidence_json(e: IntervalEvidence) -> dict:
    return asdict(e)
