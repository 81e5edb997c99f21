"""The safety margin on a predicted fit (`data/memory_margin.csv`): a batch fits when its predicted need times
(1 + fraction) is within the card. The fraction is measured, not chosen: a quantile of tunecost's under-prediction
on the published memory measurements, as `benchmarks/memory_margin.py` computes it (the file names the command)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tunecost.catalog._csv import parse_float, read_catalog_csv
from tunecost.errors import TunecostError

MEMORY_MARGIN_PATH = Path(__file__).parent / "data" / "memory_margin.csv"
_COLUMNS = ("name", "fraction", "quantile", "rows", "command", "as_of")


@dataclass(frozen=True, kw_only=True)
class MemoryMargin:
    fraction: float  # the margin on the need: 0.08 asks need x 1.08 <= the card's memory
    quantile: float  # the quantile of under-prediction (measured / predicted - 1) it is, e.g. 0.9
    rows: int  # published memory measurements (validate's modelled peak-memory rows) it was computed over
    command: str  # the command that computed it
    as_of: str  # the date it was computed


def load_memory_margins(path: Path = MEMORY_MARGIN_PATH) -> dict[str, MemoryMargin]:
    out: dict[str, MemoryMargin] = {}
    for i, row in read_catalog_csv(path, _COLUMNS):
        fraction = parse_float(path, i, "fraction", row["fraction"])
        quantile = parse_float(path, i, "quantile", row["quantile"])
        rows = parse_float(path, i, "rows", row["rows"])
        if not 0 <= fraction < 1:
            raise TunecostError(f"{path}: row {i}: fraction must be in [0, 1), got {row['fraction']!r}")
        if not 0 < quantile < 1:
            raise TunecostError(f"{path}: row {i}: quantile must be in (0, 1), got {row['quantile']!r}")
        if rows < 1 or rows != int(rows):
            raise TunecostError(f"{path}: row {i}: rows must be a whole number >= 1, got {row['rows']!r}")
        if row["name"] in out:
            raise TunecostError(f"{path}: row {i}: margin {row['name']!r} listed twice")
        out[row["name"]] = MemoryMargin(
            fraction=fraction, quantile=quantile, rows=int(rows), command=row["command"], as_of=row["as_of"]
        )
    return out


@lru_cache(maxsize=1)
def default_memory_margin() -> MemoryMargin:
    margins = load_memory_margins()
    if "default" not in margins:
        raise TunecostError(f"{MEMORY_MARGIN_PATH}: no row named 'default'")
    return margins["default"]


def _script(command: str) -> str:
    """The script a command runs (its first word ending in .py), else the whole command."""
    return next((word for word in command.split() if word.endswith(".py")), command)


def margin_note(m: MemoryMargin) -> str:
    """One line: the margin and the evidence it comes from."""
    return (
        f"safety margin {m.fraction * 100:.0f} %: the {m.quantile * 100:.0f}th percentile of under-prediction over "
        f"{m.rows} published memory measurements ({_script(m.command)}, {m.as_of})"
    )
