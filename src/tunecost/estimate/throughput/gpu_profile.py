"""The GPU profile file: what `tunecost calibrate-gpu` measured on one device, read back as `GpuTerms`.

Sources and derivations: docs/throughput-model.md, section `tunecost.estimate.throughput.gpu_profile`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from tunecost.catalog.gpu_terms import GpuTerms
from tunecost.errors import TunecostError
from tunecost.io import atomic_write_json
from tunecost.limits import MAX_PROFILE_BYTES

SCHEMA_VERSION = 1
KIND = "gpu_profile"
REQUIRED_VALUES: tuple[str, ...] = ("matmul_flops_per_s", "fp32_flops_per_s", "memory_bytes_per_s")
OPTIONAL_VALUES: tuple[str, ...] = ("matmul_half_rows", "dequant_bytes_per_s", "kernel_launch_s", "host_step_s")
VALUE_FIELDS: tuple[str, ...] = REQUIRED_VALUES + OPTIONAL_VALUES
UNITS = {
    "matmul_flops_per_s": "FLOP/s",
    "fp32_flops_per_s": "FLOP/s",
    "memory_bytes_per_s": "bytes/s",
    "matmul_half_rows": "rows",
    "dequant_bytes_per_s": "bytes/s",
    "kernel_launch_s": "s",
    "host_step_s": "s",
}
HOST_FIELDS = {"host_speed", "host_cpu", "host", "host_named"}  # the catalog's host; a profile measures its own
NOT_MEASURED = {"fp8_matmul_flops_per_s"}  # derived from the profile's bf16 rate (estimate.calibrated, docs/fp8.md)
assert set(VALUE_FIELDS) == {f.name for f in dataclasses.fields(GpuTerms)} - {"name", "source", *HOST_FIELDS} - (
    NOT_MEASURED
)


def _check_value(path: Path, field: str, value: Any, *, required: bool) -> float | None:
    if value is None:
        if required:
            raise TunecostError(f"{path}: values.{field}.value is null; a GPU profile needs it measured")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TunecostError(f"{path}: values.{field}.value must be a number, got {type(value).__name__}")
    if isinstance(value, int) and abs(value) > 2**1000:  # past float range: math.isfinite would overflow
        raise TunecostError(f"{path}: values.{field}.value is too large")
    if not math.isfinite(value) or value <= 0:
        raise TunecostError(f"{path}: values.{field}.value must be a positive finite number, got {value}")
    return float(value)


def profile_document(terms: GpuTerms, meta: dict[str, Any]) -> dict[str, Any]:
    """The JSON object of a profile. `meta`: created, device (dict), and optionally methods (field -> how it was
    measured), tool_version, command, gemms (list of dicts)."""
    methods = meta.get("methods", {})
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "name": terms.name,
        "created": meta.get("created"),
        "device": meta.get("device", {}),
        "tool_version": meta.get("tool_version"),
        "command": meta.get("command"),
        "values": {
            f: {"value": getattr(terms, f), "unit": UNITS[f], "method": str(methods.get(f, "not stated"))}
            for f in VALUE_FIELDS
        },
        "gemms": list(meta.get("gemms", [])),
        "quick": bool(meta.get("quick", False)),
    }
    return doc


def write_gpu_profile(path: str | Path, terms: GpuTerms, meta: dict[str, Any], *, overwrite: bool = False) -> Path:
    """Write a profile atomically; an existing file is kept unless `overwrite`. The document is checked with the
    reader's rules first, so a profile that could not be read back is never written."""
    target = Path(path)
    if target.exists() and not overwrite:
        raise TunecostError(f"{target} already exists; pass --force to replace it")
    doc = profile_document(terms, meta)
    terms_from_document(target, doc)  # same checks as on read
    return atomic_write_json(target, doc)


def load_gpu_profile(path: str | Path) -> GpuTerms:
    """Read a GPU profile written by `write_gpu_profile` (strictly; see docs/throughput-model.md)."""
    p = Path(path)
    if not p.is_file():
        raise TunecostError(f"GPU profile {p} not found (write one with `tunecost calibrate-gpu --out {p}`)")
    if p.stat().st_size > MAX_PROFILE_BYTES:
        raise TunecostError(f"{p}: {p.stat().st_size} bytes is too large for a GPU profile")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TunecostError(f"{p}: not a JSON GPU profile ({exc})") from None
    except RecursionError:
        raise TunecostError(f"{p}: not a GPU profile (JSON nested too deeply)") from None
    return terms_from_document(p, doc)


def terms_from_document(path: Path, doc: Any) -> GpuTerms:
    """`GpuTerms` of a parsed profile document; `path` names the file in errors."""
    if not isinstance(doc, dict):
        raise TunecostError(f"{path}: a GPU profile is a JSON object, got {type(doc).__name__}")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise TunecostError(f"{path}: schema_version {version!r} is not a known GPU profile schema (expected 1)")
    if doc.get("kind") != KIND:
        raise TunecostError(f"{path}: kind must be {KIND!r}, got {doc.get('kind')!r}")
    for key in ("name", "created"):
        if not isinstance(doc.get(key), str) or not doc[key].strip():
            raise TunecostError(f"{path}: field {key!r} must be a non-empty string")
    device = doc.get("device")
    if not isinstance(device, dict):
        raise TunecostError(f"{path}: field 'device' must be an object")
    values = doc.get("values")
    if not isinstance(values, dict):
        raise TunecostError(f"{path}: field 'values' must be an object")
    unknown = sorted(set(values) - set(VALUE_FIELDS))
    if unknown:
        raise TunecostError(f"{path}: unknown field values.{unknown[0]} (known: {', '.join(VALUE_FIELDS)})")
    parsed: dict[str, float | None] = {}
    for field in VALUE_FIELDS:
        if field not in values:
            raise TunecostError(f"{path}: missing field values.{field}")
        entry = values[field]
        if not isinstance(entry, dict) or "value" not in entry:
            raise TunecostError(f"{path}: values.{field} must be an object with a 'value'")
        if not isinstance(entry.get("method"), str):
            raise TunecostError(f"{path}: values.{field}.method must be a string saying how it was measured")
        parsed[field] = _check_value(path, field, entry["value"], required=field in REQUIRED_VALUES)
    where = device.get("name") or doc["name"]
    return GpuTerms(
        name=doc["name"],
        source=f"profile: {path.name} measured {doc['created']} on {where}",
        **parsed,  # type: ignore[arg-type]
    )
