"""The interconnect catalog: achieved NCCL bus bandwidth per link, each row dated and sourced.

`data/interconnects.csv` ships with tunecost. Bandwidths are nccl-tests' bus bandwidth ("busbw"), the figure
that is independent of the number of ranks, so `distributed.comm` turns it into a time for any collective.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tunecost.catalog._csv import parse_float, read_catalog_csv
from tunecost.errors import TunecostError, unknown_name_error

INTERCONNECT_CATALOG_PATH = Path(__file__).parent / "data" / "interconnects.csv"
_DATE = re.compile(r"^\d{4}-\d{2}(-\d{2})?$")
SCOPES = ("node", "nic")


@dataclass(frozen=True, kw_only=True)
class Interconnect:
    name: str
    aliases: tuple[str, ...]
    scope: str  # node: all GPUs of a node on this link; nic: one NIC between nodes
    bus_bandwidth_bytes_per_s: float
    latency_seconds: float
    setup: str
    as_of: str
    source: str
    uncertain: bool
    notes: str = ""


def load_interconnects(path: Path = INTERCONNECT_CATALOG_PATH) -> list[Interconnect]:
    required = ("name", "aliases", "scope", "bus_bandwidth_gb_s", "latency_us", "as_of", "source", "uncertain")
    out = []
    for i, row in read_catalog_csv(path, required):
        busbw_gb_s = parse_float(path, i, "bus_bandwidth_gb_s", row["bus_bandwidth_gb_s"])
        latency_us = parse_float(path, i, "latency_us", row["latency_us"])
        if busbw_gb_s <= 0 or latency_us < 0:
            raise TunecostError(f"{path}: row {i}: bus bandwidth must be > 0 and latency >= 0")
        if row["scope"] not in SCOPES:
            raise TunecostError(f"{path}: row {i}: scope must be one of {', '.join(SCOPES)}, got {row['scope']!r}")
        if not _DATE.match(row["as_of"]):
            raise TunecostError(f"{path}: row {i}: as_of must be YYYY-MM-DD (or YYYY-MM), got {row['as_of']!r}")
        if not row["source"]:
            raise TunecostError(f"{path}: row {i}: every interconnect needs a source")
        if row["uncertain"] not in ("yes", "no"):
            raise TunecostError(f"{path}: row {i}: uncertain must be yes or no, got {row['uncertain']!r}")
        out.append(
            Interconnect(
                name=row["name"],
                aliases=tuple(a.strip() for a in row["aliases"].split(";") if a.strip()),
                scope=row["scope"],
                bus_bandwidth_bytes_per_s=busbw_gb_s * 1e9,
                latency_seconds=latency_us * 1e-6,
                setup=row.get("setup", ""),
                as_of=row["as_of"],
                source=row["source"],
                uncertain=row["uncertain"] == "yes",
                notes=row.get("notes", ""),
            )
        )
    return out


@lru_cache(maxsize=1)
def interconnect_catalog() -> tuple[Interconnect, ...]:
    return tuple(load_interconnects())


def resolve_interconnect(name: str) -> Interconnect:
    """An interconnect by name or alias (case-insensitive); an unknown name is a one-line error."""
    key = name.strip().lower()
    for link in interconnect_catalog():
        if key == link.name.lower() or key in (a.lower() for a in link.aliases):
            return link
    raise unknown_name_error("interconnect", name, [link.name for link in interconnect_catalog()])
