"""What a calibration keeps on disk: its fitted parameters and its held-out errors, numbers only, per key."""

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

FIT_VERSION = 1  # bump when the fit's model or priors change what the cached parameters mean


def fit_cache_path(points: Sequence[Any], options: Any, fingerprint: np.ndarray) -> Path:
    """Where the fitted parameters of these points under these options are kept (numbers only)."""
    points_key = [(p.target, p.queries_per_s, p.run_queries) for p in points]
    key = repr((FIT_VERSION, points_key, options, [f"{v:.12g}" for v in fingerprint]))
    return cache_root() / "calibration-fits" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def cached_fit(path: Path, size: int) -> np.ndarray | None:
    try:
        x = np.array(json.loads(path.read_text())["x"], dtype=float)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return x if x.shape == (size,) and np.all(np.isfinite(x)) else None


def evidence_to_json(e: IntervalEvidence) -> dict:
    def held(h: HeldOut | None) -> dict | None:
        return None if h is None else {**asdict(h), "errors": list(h.errors), "cross": list(h.cross_architecture)}

    return {"transfer": held(e.transfer), "workload": held(e.workload), "batch": held(e.batch), "note": e.note}


def evidence_from_json(d: dict) -> IntervalEvidence:
    def held(h: dict | None) -> HeldOut | None:
        if h is None:
            return None
        return HeldOut(
            kind=h["kind"],
            errors=tuple(float(x) for x in h["errors"]),
            source=h["source"],
            cross_architecture=tuple(bool(x) for x in h["cross"]),
        )

    return IntervalEvidence(
        transfer=held(d["transfer"]), workload=held(d["workload"]), batch=held(d["batch"]), note=str(d["note"])
    )
