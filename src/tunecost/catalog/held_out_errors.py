"""Held-out errors of `tunecost validate` on the shipped corpus: the evidence behind its per-row intervals.

One row per predicted corpus row: ln(predicted / measured), with the row's source, quantity and stack, written by
`benchmarks/held_out_errors.py --write` (its command and date on each row).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tunecost.csvfile import read_csv_rows
from tunecost.errors import TunecostError

HELD_OUT_ERRORS_PATH = Path(__file__).resolve().parent / "data" / "held_out_errors.csv"
COLUMNS = ("source", "id", "quantity", "stack", "log_error", "command", "as_of")


@dataclass(frozen=True, kw_only=True)
class HeldOutError:
    source: str  # the publication or repository the measurement came from
    id: str
    quantity: str
    stack: str
    log_error: float  # ln(predicted / measured)


@lru_cache(maxsize=2)
def held_out_errors(path: Path = HELD_OUT_ERRORS_PATH) -> tuple[HeldOutError, ...]:
    _, rows = read_csv_rows(path, "held-out errors file", required=COLUMNS)
    out = []
    for i, row in enumerate(rows, start=2):
        try:
            value = float(row["log_error"])
        except ValueError:
            raise TunecostError(f"{path}: row {i}: log_error {row['log_error']!r} is not a number") from None
        if not math.isfinite(value):
            raise TunecostError(f"{path}: row {i}: log_error must be finite")
        out.append(
            HeldOutError(
                source=row["source"], id=row["id"], quantity=row["quantity"], stack=row["stack"], log_error=value
            )
        )
    return tuple(out)
