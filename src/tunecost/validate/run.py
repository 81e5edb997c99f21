"""Predictions per corpus row and the accuracy summary.

Memory quantities from one simulated step (`tunecost.simulate`) plus the device overhead it states:
- peak_allocated_gib: the simulated peak (torch.cuda.max_memory_allocated semantics);
- peak_reserved_gib: that peak plus the caching allocator's reserve (the overhead without the CUDA context);
- nvidia_smi_gib: that peak plus the whole device overhead (CUDA context and allocator reserve);
- oom: 1 when the peak plus the device overhead exceeds the GPU's memory, else 0.
A value in "GB" is read as GiB (2^30 bytes): the sources print GiB-based figures (nvidia-smi's MiB / 1024,
torch bytes / 2^30) with a "G"/"GB" label. `error` is the signed percentage error (predicted - measured) /
measured x 100 for memory, and predicted - measured (0 = right) for oom.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from tunecost.validate.corpus import CorpusRow
from tunecost.validate.mapping import MappedRow, Skip, map_row

GIB = 2**30
OUTPUT_COLUMNS = ("id", "quantity", "measured", "predicted", "unit", "error", "status", "reason")
_UNIT_BYTES = {"GiB": GIB, "GB": GIB, "MiB": 2**20}


@dataclass(frozen=True, kw_only=True)
class ValidationRow:
    id: str
    quantity: str
    measured: float | None
    predicted: float | None
    unit: str
    error: float | None
    status: str  # ok | skipped
    reason: str
    stack: str = ""  # the named stack (summary key; not an output column)

    def as_output(self) -> dict[str, object]:
        d = asdict(self)
        return {k: d[k] for k in OUTPUT_COLUMNS}


def _skipped(row: CorpusRow, reason: str, stack: str = "") -> ValidationRow:
    measured: float | None
    try:
        measured = float(row.get("value"))
    except ValueError:
        measured = None
    return ValidationRow(
        id=row.id,
        quantity=row.get("quantity"),
        measured=measured,
        predicted=None,
        unit=row.get("unit"),
        error=None,
        status="skipped",
        reason=reason,
        stack=stack,
    )


def predicted_bytes(quantity: str, sim) -> int:
    """The simulated figure a memory quantity measures, in bytes."""
    from tunecost.simulate.overhead import DEFAULT_OVERHEAD

    if quantity == "peak_allocated_gib":
        return int(sim.peak_bytes)
    if quantity == "peak_reserved_gib":
        return int(sim.peak_bytes + sim.device_overhead_bytes - DEFAULT_OVERHEAD.cuda_context_bytes)
    return int(sim.peak_bytes + sim.device_overhead_bytes)


def _simulate(mapped: MappedRow):
    from tunecost.simulate import simulate_step

    return simulate_step(mapped.job, stack=mapped.stack.simulator_stack or "tunecost")


def validate_row(row: CorpusRow, simulate: Callable[[MappedRow], object] = _simulate) -> ValidationRow:
    """One row's prediction beside its measurement, or the reason it is skipped (never raises)."""
    try:
        mapped = map_row(row)
    except Skip as exc:
        return _skipped(row, str(exc))
    quantity, unit = row.get("quantity"), row.get("unit")
    try:
        measured = float(row.get("value"))
    except ValueError:
        return _skipped(row, f"value {row.get('value')!r} is not a number", mapped.stack.name)
    if quantity != "oom" and unit not in _UNIT_BYTES:
        return _skipped(row, f"unit {unit!r} not known for {quantity}", mapped.stack.name)
    try:
        sim = simulate(mapped)
    except Exception as exc:  # a row the simulator cannot run is reported, never a crash
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return _skipped(row, f"simulation failed: {reason}", mapped.stack.name)
    error: float | None
    if quantity == "oom":
        assert mapped.gpu_memory_bytes is not None
        predicted = 1.0 if predicted_bytes("nvidia_smi_gib", sim) > mapped.gpu_memory_bytes else 0.0
        error = predicted - measured
    else:
        predicted = round(predicted_bytes(quantity, sim) / _UNIT_BYTES[unit], 3)
        error = round((predicted - measured) / measured * 100.0, 2) if measured else None
    return ValidationRow(
        id=row.id,
        quantity=quantity,
        measured=measured,
        predicted=predicted,
        unit=unit,
        error=error,
        status="ok",
        reason="",
        stack=mapped.stack.name,
    )


def validate_rows(
    rows: Iterable[CorpusRow],
    *,
    simulate: Callable[[MappedRow], object] = _simulate,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> list[ValidationRow]:
    rows = list(rows)
    out = []
    for i, row in enumerate(rows):
        if on_progress:
            on_progress(i, len(rows), row.id)
        out.append(validate_row(row, simulate))
    return out


@dataclass(frozen=True, kw_only=True)
class Summary:
    quantity: str
    stack: str  # "all" for the quantity over every stack
    rows: int
    modelled: int
    median_abs_pct_error: float | None  # memory quantities
    within_10pct: int | None
    right: int | None  # oom: predictions that agree with the measurement


def _summary(quantity: str, stack: str, rows: list[ValidationRow]) -> Summary:
    ok = [r for r in rows if r.status == "ok" and r.error is not None]
    if quantity == "oom":
        return Summary(
            quantity=quantity,
            stack=stack,
            rows=len(rows),
            modelled=len(ok),
            median_abs_pct_error=None,
            within_10pct=None,
            right=sum(1 for r in ok if r.error == 0),
        )
    ape = [abs(r.error) for r in ok if r.error is not None]
    return Summary(
        quantity=quantity,
        stack=stack,
        rows=len(rows),
        modelled=len(ok),
        median_abs_pct_error=round(statistics.median(ape), 2) if ape else None,
        within_10pct=sum(1 for e in ape if e <= 10.0) if ape else None,
        right=None,
    )


def summarize(rows: list[ValidationRow]) -> list[Summary]:
    """Per quantity over all stacks, then per (quantity, stack) where a stack was modelled."""
    out = []
    for quantity in sorted({r.quantity for r in rows}):
        of_q = [r for r in rows if r.quantity == quantity]
        out.append(_summary(quantity, "all", of_q))
        for stack in sorted({r.stack for r in of_q if r.stack}):
            out.append(_summary(quantity, stack, [r for r in of_q if r.stack == stack]))
    return out


def memory_totals(rows: list[ValidationRow]) -> dict[str, float | int | None]:
    """Headline figures over every peak-memory row (allocated, reserved, nvidia-smi) and every oom row."""
    mem = [r for r in rows if r.quantity in ("peak_allocated_gib", "peak_reserved_gib", "nvidia_smi_gib")]
    ape = [abs(r.error) for r in mem if r.status == "ok" and r.error is not None]
    oom = [r for r in rows if r.quantity == "oom"]
    oom_ok = [r for r in oom if r.status == "ok"]
    return {
        "memory_rows": len(mem) + len(oom),
        "memory_rows_modelled": len(ape) + len(oom_ok),
        "peak_rows_modelled": len(ape),
        "peak_median_abs_pct_error": round(statistics.median(ape), 2) if ape else None,
        "oom_rows_modelled": len(oom_ok),
        "oom_right": sum(1 for r in oom_ok if r.error == 0),
    }
