"""Loading a run directory's records for the report (docs/dev/records.md), tolerating old or partial runs."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tunecost.errors import TunecostError, TunecostWarning
from tunecost.io import read_jsonl
from tunecost.results.schema import RECORD_KINDS, SCHEMA_VERSION


@dataclass
class RunRecords:
    """All records of a run directory, one DataFrame per kind (file stem), plus metadata."""

    run_dir: Path
    meta: dict[str, Any]
    tables: dict[str, pd.DataFrame]
    skipped: list[str] = field(default_factory=list)  # files (or records) not read, with the reason
    incomplete_noted: set[str] = field(default_factory=set)  # kinds whose records lacking a column were reported

    def get(self, kind: str) -> pd.DataFrame | None:
        df = self.tables.get(kind)
        return df if df is not None and not df.empty else None


def _read_meta(run_dir: Path) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for name in ("meta.json", "demo.json"):
        path = run_dir / name
        if path.is_file():
            try:
                meta[name.removesuffix(".json")] = json.loads(path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, RecursionError, UnicodeDecodeError):
                meta[name.removesuffix(".json")] = {"error": f"{name} is not valid JSON"}
    # Sub-runs (e.g. runs/demo/profile-tiny-mixtral/meta.json) carry their own metadata.
    for sub in sorted(run_dir.glob("*/meta.json")):
        try:
            meta[f"{sub.parent.name}/meta"] = json.loads(sub.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, RecursionError, UnicodeDecodeError):
            continue
    return meta


def _skip(skipped: list[str], why: str) -> None:
    """Records of a readable file left out: listed in the report and said as one warning."""
    skipped.append(why)
    warnings.warn(why, TunecostWarning, stacklevel=3)


def _file_of(kind: Any) -> str | None:
    spec = RECORD_KINDS.get(kind) if isinstance(kind, str) else None
    return spec.file if spec is not None else None


def load_run(run_dir: str | Path) -> RunRecords:
    """Every `*.jsonl` in the run directory and its immediate sub-directories, by kind (file stem)."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise TunecostError(f"{run_dir}: a file; give the run directory that holds the records")
    if not run_dir.is_dir():
        raise TunecostError(f"run directory not found: {run_dir}")
    files = sorted(run_dir.glob("*.jsonl")) + sorted(run_dir.glob("*/*.jsonl"))
    if not files:
        raise TunecostError(
            f"{run_dir} holds no run records (*.jsonl); run `tunecost demo` or `tunecost profile --out {run_dir}` first"
        )
    rows_by_kind: dict[str, list[dict[str, Any]]] = {}
    skipped: list[str] = []
    any_records = False
    for path in files:
        rows = read_jsonl(path)  # only JSON objects; other lines are skipped with a warning naming them
        if not rows:
            text = path.read_text(encoding="utf-8", errors="replace").strip()
            skipped.append(
                f"{path.relative_to(run_dir)}: " + ("holds lines that are not JSON objects" if text else "empty")
            )
            continue
        any_records = True
        raw_versions = [r.get("schema_version") for r in rows]
        versions = {str(v) for v in raw_versions}  # str: a version may be any JSON value, even a list
        if any(type(v) is not int or v != SCHEMA_VERSION for v in raw_versions):
            _skip(
                skipped,
                f"{path.relative_to(run_dir)}: records in format version {sorted(versions)}, "
                f"this tunecost reads version {SCHEMA_VERSION}; rerun the command that wrote it",
            )
            continue
        held = [_file_of(r.get("kind")) == path.name for r in rows]
        kept = [r for r, ok in zip(rows, held, strict=True) if ok]
        strays = sorted({str(r.get("kind")) for r, ok in zip(rows, held, strict=True) if not ok})
        if strays:  # a row of an unknown kind, or of a kind another file holds
            _skip(
                skipped,
                f"{path.relative_to(run_dir)}: {len(rows) - len(kept)} record(s) of kind {', '.join(strays)}, "
                f"not a kind {path.name} holds (docs/dev/records.md); left out",
            )
        if not kept:
            continue
        rows = kept
        source = str(path.parent.relative_to(run_dir)) if path.parent != run_dir else "."
        rows_by_kind.setdefault(path.stem, []).extend({**r, "_source": source} for r in rows)
    if not rows_by_kind and not any_records:  # every file empty or garbage: a page would say nothing
        raise TunecostError(f"{run_dir}: no readable run records: " + "; ".join(skipped))
    tables = {kind: pd.DataFrame(rows) for kind, rows in rows_by_kind.items()}
    return RunRecords(run_dir=run_dir, meta=_read_meta(run_dir), tables=tables, skipped=skipped)
