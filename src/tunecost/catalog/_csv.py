"""Reading catalog CSV files: '#' comment lines, then a header; every error names the file and row."""

from __future__ import annotations

import math
from pathlib import Path

from tunecost.csvfile import read_csv_rows
from tunecost.errors import TunecostError


def read_catalog_csv(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """Rows of a catalog CSV as (1-based data-row number, dict). Missing columns are an error naming them."""
    header, rows = read_csv_rows(path, "catalog file")
    missing = [c for c in required if c not in header]
    if missing:
        raise TunecostError(
            f"{path}: missing column(s) {', '.join(missing)}; found {', '.join(map(repr, header)) or 'none'}"
        )
    kept = [row for row in rows if any(v.strip() for v in row.values())]  # blank lines are no rows
    return [(i, {k: v.strip() for k, v in row.items()}) for i, row in enumerate(kept, start=1)]


def parse_float(path: Path, row_number: int, column: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise TunecostError(f"{path}: row {row_number}: column {column!r} is not a number: {value!r}") from None
    if not math.isfinite(number):
        raise TunecostError(f"{path}: row {row_number}: column {column!r} must be a finite number, got {value!r}")
    return number
