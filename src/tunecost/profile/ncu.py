"""Read Nsight Compute's CSV export into tidy per-kernel rows, and average them per class (Figs. 9, 10).

Sources and derivations: docs/profiling.md, section `tunecost.profile.ncu`.
"""

from __future__ import annotations

import csv
import dataclasses
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunecost.errors import TunecostError
from tunecost.profile.kernels import classify_kernel

DURATION = "gpu__time_duration.sum"
SM_THROUGHPUT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_THROUGHPUT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
MEMORY_THROUGHPUT = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
DEFAULT_METRICS: tuple[str, ...] = (DURATION, SM_THROUGHPUT, DRAM_THROUGHPUT, MEMORY_THROUGHPUT)

# Column / metric names that carry each quantity, raw metric names first, then the details-page display names.
_ALIASES: dict[str, tuple[str, ...]] = {
    "duration": (DURATION, "Duration"),
    "sm": (SM_THROUGHPUT, "Compute (SM) Throughput", "SM Throughput"),
    "dram": (DRAM_THROUGHPUT, "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "DRAM Throughput"),
    "mem": (MEMORY_THROUGHPUT, "Memory Throughput"),
}
_SECONDS_PER_UNIT = {
    "nsecond": 1e-9,
    "ns": 1e-9,
    "usecond": 1e-6,
    "us": 1e-6,
    "\u00b5s": 1e-6,
    "msecond": 1e-3,
    "ms": 1e-3,
    "second": 1.0,
    "s": 1.0,
}
_PERCENT_UNITS = {"%", "pct", "percent", ""}
_QUOTED = re.compile(r'"([^"]*)"')
ALL_CLASSES = "all"


@dataclass(frozen=True, kw_only=True)
class KernelCounterRow:
    """One kernel launch: what it was, how long it ran, how busy it kept the SMs and DRAM."""

    kernel_name: str
    kernel_class: str  # one of tunecost.profile.kernels.KERNEL_CLASSES
    nvtx_ranges: tuple[str, ...]  # push/pop ranges around the launch, outer to inner
    duration_s: float
    sm_pct: float | None  # SM throughput, % of peak sustained (None: not measured)
    dram_pct: float | None  # DRAM throughput, % of peak sustained
    mem_pct: float | None = None  # "Memory Throughput": max over the memory units, % of peak
    batch_size: int | None = None
    launch_id: int | None = None  # ncu's "ID" of the launch
    source: str = "ncu"  # "ncu" or "torch.profiler"

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["nvtx_ranges"] = list(self.nvtx_ranges)
        return out


@dataclass(frozen=True, kw_only=True)
class NcuParseResult:
    rows: tuple[KernelCounterRow, ...]
    warnings: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ClassUtilization:
    """Time-weighted SM / DRAM utilization of one kernel class at one batch size (one bar of Figs. 9, 10)."""

    batch_size: int | None
    kernel_class: str  # a kernel class, or "all" for every kernel of the batch size
    num_kernels: int
    duration_s: float
    time_share: float  # duration_s / total duration at this batch size
    sm_pct: float | None  # sum(d_i * sm_i) / sum(d_i) over kernels with a value
    dram_pct: float | None
    mem_pct: float | None


def parse_number(text: str) -> float | None:
    """A number as ncu prints it ("1,234.5", " 12 ", "n/a" -> None)."""
    cleaned = text.strip().replace(",", "")
    if not cleaned:
        return None
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def duration_seconds(text: str, unit: str) -> float | None:
    """A duration cell in seconds, or None when the value or unit is unusable."""
    value = parse_number(text)
    scale = _SECONDS_PER_UNIT.get(unit.strip().lower() if unit.strip() else "nsecond")  # base unit: ns
    if value is None or scale is None or value < 0:
        return None
    return value * scale


def percent(text: str, unit: str) -> float | None:
    value = parse_number(text)
    if value is None or unit.strip().lower() not in _PERCENT_UNITS:
        return None
    return value


def parse_nvtx_cell(cell: str) -> tuple[str, ...]:
    """Range names of an ncu push/pop NVTX cell, outer to inner (domain and attribute fields dropped)."""
    entries = _QUOTED.findall(cell)
    if not entries:
        entries = [part for part in re.split(r"\s{2,}", cell.strip()) if part and not part.isdigit()]
    names = []
    for entry in entries:
        parts = entry.strip().split(":")
        if len(parts) >= 8:  # domain : name (may hold ':') : PL_Type : PL_Value : CLR_Type : Color : Msg_Type : Msg
            name = ":".join(parts[1:-6])
        elif len(parts) >= 2:
            name = ":".join(parts[1:])
        else:
            name = parts[0]
        if name and name.lower() != "none":
            names.append(name)
    return tuple(names)


def _csv_lines(text: str) -> list[tuple[int, list[str]]]:
    """(1-based line number, fields) of every CSV line, skipping blank lines and ncu's '==...' log lines."""
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("=="):
            continue
        out.append((number, next(csv.reader([line]))))
    return out


def _find_column(header: Sequence[str], aliases: Iterable[str]) -> int | None:
    for alias in aliases:
        if alias in header:
            return header.index(alias)
    return None


def _nvtx_columns(header: Sequence[str]) -> list[int]:
    return [i for i, name in enumerate(header) if "Push/Pop_Range" in name or name.strip().upper().startswith("NVTX")]


@dataclass(frozen=True)
class _LaunchColumns:
    """Where a launch's kernel name, launch ID and NVTX range cells stand in a CSV row."""

    name: int
    launch_id: int
    nvtx: list[int]

    @classmethod
    def of(cls, header: Sequence[str]) -> _LaunchColumns:
        return cls(header.index("Kernel Name"), header.index("ID"), _nvtx_columns(header))


def _make_row(
    fields: list[str],
    columns: _LaunchColumns,
    *,
    duration_s: float,
    percents: tuple[float | None, float | None, float | None],  # SM, DRAM, memory throughput
    batch_size: int | None,
) -> KernelCounterRow:
    kernel_name = fields[columns.name]
    nvtx_ranges = tuple(r for col in columns.nvtx for r in parse_nvtx_cell(fields[col]))
    launch = parse_number(fields[columns.launch_id])
    sm, dram, mem = percents
    return KernelCounterRow(
        kernel_name=kernel_name,
        kernel_class=classify_kernel(kernel_name, nvtx_ranges),
        nvtx_ranges=nvtx_ranges,
        duration_s=duration_s,
        sm_pct=sm,
        dram_pct=dram,
        mem_pct=mem,
        batch_size=batch_size,
        launch_id=int(launch) if launch is not None else None,
        source="ncu",
    )


def _parse_raw(lines: list[tuple[int, list[str]]], batch_size: int | None) -> tuple[list, list[str], list[str]]:
    (_, header), body = lines[0], lines[1:]
    columns = _LaunchColumns.of(header)
    units = [""] * len(header)
    first = body[0][1] if body else []
    if len(first) == len(header) and not first[columns.launch_id].strip() and not first[columns.name].strip():
        units = body[0][1]
        body = body[1:]
    cols = {key: _find_column(header, aliases) for key, aliases in _ALIASES.items()}
    if cols["duration"] is None:
        raise TunecostError(f"ncu CSV has no {DURATION} column: rerun ncu with --metrics {','.join(DEFAULT_METRICS)}")
    rows, warnings, errors = [], [], []
    for number, fields in body:
        if len(fields) != len(header):
            errors.append(f"line {number}: expected {len(header)} fields, got {len(fields)}")
            continue

        def value(key: str, convert, fields: list[str] = fields) -> float | None:
            col = cols[key]
            return None if col is None else convert(fields[col], units[col])

        duration = value("duration", duration_seconds)
        if duration is None:
            errors.append(f"line {number}: unusable duration {fields[cols['duration']]!r} {units[cols['duration']]!r}")
            continue
        sm, dram, mem = value("sm", percent), value("dram", percent), value("mem", percent)
        for key, got in (("sm", sm), ("dram", dram)):
            col = cols[key]
            if col is not None and got is None:
                warnings.append(f"line {number}: no usable {_ALIASES[key][0]} ({fields[col]!r}); kept as None")
        rows.append(_make_row(fields, columns, duration_s=duration, percents=(sm, dram, mem), batch_size=batch_size))
    return rows, warnings, errors


def _parse_details(lines: list[tuple[int, list[str]]], batch_size: int | None) -> tuple[list, list[str], list[str]]:
    (_, header), body = lines[0], lines[1:]
    col = {name: header.index(name) for name in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")}
    columns = _LaunchColumns.of(header)
    launches: dict[tuple[str, ...], dict[str, Any]] = {}
    errors: list[str] = []
    for number, fields in body:
        if len(fields) != len(header):
            errors.append(f"line {number}: expected {len(header)} fields, got {len(fields)}")
            continue
        key = (fields[col["ID"]], *(fields[i] for i in columns.nvtx), fields[col["Kernel Name"]])
        launch = launches.setdefault(key, {"line": number, "fields": fields, "metrics": {}})
        metric = (fields[col["Metric Value"]], fields[col["Metric Unit"]], number)
        launch["metrics"].setdefault(fields[col["Metric Name"]], metric)
    rows, warnings = [], []
    for launch in launches.values():
        metrics, fields = launch["metrics"], launch["fields"]

        def value(key: str, convert, metrics: dict = metrics) -> tuple[float | None, str | None]:
            for alias in _ALIASES[key]:
                if alias in metrics:
                    text, unit, _ = metrics[alias]
                    return convert(text, unit), f"{text!r} {unit!r}"
            return None, None

        duration, shown = value("duration", duration_seconds)
        if duration is None:
            errors.append(
                f"line {launch['line']}: kernel {fields[col['Kernel Name']]!r} has "
                + (f"unusable duration {shown}" if shown else "no duration metric")
            )
            continue
        (sm, sm_shown), (dram, dram_shown) = value("sm", percent), value("dram", percent)
        mem, _ = value("mem", percent)
        for name, got, got_shown in (("SM throughput", sm, sm_shown), ("DRAM throughput", dram, dram_shown)):
            if got is None and got_shown is not None:
                warnings.append(f"line {launch['line']}: no usable {name} ({got_shown}); kept as None")
        rows.append(_make_row(fields, columns, duration_s=duration, percents=(sm, dram, mem), batch_size=batch_size))
    return rows, warnings, errors


def parse_ncu_csv(text: str, *, batch_size: int | None = None) -> NcuParseResult:
    """Parse an `ncu --csv --page raw` or `--page details` export (layout detected from the header)."""
    lines = _csv_lines(text)
    start = next((i for i, (_, fields) in enumerate(lines) if "ID" in fields and "Kernel Name" in fields), None)
    if start is None:
        raise TunecostError("not an ncu CSV export: no header line with 'ID' and 'Kernel Name' columns")
    lines = lines[start:]
    header = lines[0][1]
    is_details = "Metric Name" in header and "Metric Value" in header
    rows, warnings, errors = (_parse_details if is_details else _parse_raw)(lines, batch_size)
    if errors and not rows:
        more = f" (and {len(errors) - 1} more bad rows)" if len(errors) > 1 else ""
        raise TunecostError(f"no usable kernel rows in the ncu CSV: {errors[0]}{more}")
    if not rows:
        warnings.append("the ncu CSV has no kernel rows (did the NVTX filter match no kernel?)")
    return NcuParseResult(rows=tuple(rows), warnings=tuple(errors + warnings))


def parse_ncu_csv_file(path: str | Path, *, batch_size: int | None = None) -> NcuParseResult:
    return parse_ncu_csv(Path(path).read_text(encoding="utf-8-sig", errors="replace"), batch_size=batch_size)


def _weighted_pct(rows: Sequence[KernelCounterRow], attr: str) -> float | None:
    pairs = [(r.duration_s, getattr(r, attr)) for r in rows if getattr(r, attr) is not None]
    total = sum(d for d, _ in pairs)
    if not pairs or total <= 0:
        return None
    return sum(d * v for d, v in pairs) / total


def time_weighted_utilization(rows: Iterable[KernelCounterRow]) -> dict[tuple[int | None, str], ClassUtilization]:
    """Per (batch size, kernel class), and per batch size over all classes (class "all"): the duration-weighted
    mean SM, DRAM and memory throughput (paper §IV-B4: "utilization ... weighted by the amount of time each kernel
    takes"). Kernels without a value for a metric are left out of that metric's mean, not counted as zero."""
    groups: dict[tuple[int | None, str], list[KernelCounterRow]] = defaultdict(list)
    for row in rows:
        groups[(row.batch_size, row.kernel_class)].append(row)
        groups[(row.batch_size, ALL_CLASSES)].append(row)
    totals = {
        batch: sum(r.duration_s for r in members) for (batch, cls), members in groups.items() if cls == ALL_CLASSES
    }
    out = {}
    for (batch, cls), members in sorted(groups.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1])):
        duration = sum(r.duration_s for r in members)
        out[(batch, cls)] = ClassUtilization(
            batch_size=batch,
            kernel_class=cls,
            num_kernels=len(members),
            duration_s=duration,
            time_share=duration / totals[batch] if totals[batch] > 0 else 0.0,
            sm_pct=_weighted_pct(members, "sm_pct"),
            dram_pct=_weighted_pct(members, "dram_pct"),
            mem_pct=_weighted_pct(members, "mem_pct"),
        )
    return out
