"""Reading catalog CSV files: '#' comment lines, then a header; every error names the file and row."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from tunecost.errors import TunecostError


def read_catalog_csv(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """Rows of a catalog CSV as (1-based data-row number, dict). Missing columns are an error naming them."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise TunecostError(f"catalog file not found: {path}") from None
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    header = reader.fieldnames or []
    missing = [c for c in required if c not in header]
    if missing:
        raise TunecostError(f"{path}: missing column(s) {', '.join(missing)}; found {', '.join(header) or 'none'}")
    return [
        (i, {k: (v or "").strip() for k, v in row.items() if k is not None}) for i, row in enumerate(reader, start=1)
    ]


def parse_float(path: Path, row_number: int, column: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise TunecostError(f"{path}: row {row_number}: column {column!r} is not a number: {value!r}") from None
    if not math.isfinite(number):
        raise TunecostError(f"{path}: row {row_number}: column {column!r} must be a finite number, got {value!r}")
    return number
