"""The safety margin on a predicted fit, from `tunecost validate`'s own memory residuals on the shipped corpus.

A batch fits when its predicted need (the caching allocator's reserve plus the memory outside it: the
nvidia-smi figure) times (1 + margin) is at most the memory CUDA reports for the card. The margin is the 90th
percentile of under-prediction, r = measured / predicted - 1 (positive: tunecost predicted too little), over
every modelled peak-memory row (allocated, reserved and nvidia-smi), rounded up to a whole percent.

    PYTHONPATH=src .venv/bin/python benchmarks/memory_margin.py [--write]

Prints the residual percentiles per measured quantity, the largest under-predictions, and what the margin does
to the corpus's fits/out-of-memory verdicts: the out-of-memory rows still predicted to fit with it, and the rows
that ran but would no longer be called a fit. --write stores the margin in src/tunecost/catalog/data/
memory_margin.csv. Simulations are cached (tunecost's simulate cache), so a second run takes seconds.
"""

from __future__ import annotations

import argparse
import datetime
import math
from dataclasses import dataclass
from pathlib import Path

from tunecost.io import atomic_write_text
from tunecost.units import BYTES_PER_GIB
from tunecost.validate import read_corpus, validate_rows
from tunecost.validate.mapping import MEMORY_QUANTITIES, PEAK_MEMORY_QUANTITIES, MappedRow
from tunecost.validate.run import _simulate as simulate_mapped  # validate's own simulation of a mapped row
from tunecost.validate.run import outside_allocator_bytes, unit_bytes

COMMAND = "PYTHONPATH=src .venv/bin/python benchmarks/memory_margin.py --write"
MARGIN_PATH = Path(__file__).resolve().parent.parent / "src" / "tunecost" / "catalog" / "data" / "memory_margin.csv"
MARGIN_QUANTILE = 0.9
QUANTILES = (0.5, 0.8, 0.9, 0.95)
QUANTITY_LABELS = {"peak_allocated_gib": "allocated", "peak_reserved_gib": "reserved", "nvidia_smi_gib": "nvidia-smi"}
DEVICE_QUANTITIES = ("peak_reserved_gib", "nvidia_smi_gib")  # what the device gives, as a fit is now judged
NUM_LARGEST = 15


@dataclass(frozen=True, kw_only=True)
class MemoryCase:
    """One modelled memory row of the corpus: validate's prediction beside the measurement, and the need the fit
    is judged on."""

    id: str
    model: str
    gpu: str
    num_gpus: int
    quantity: str  # peak_allocated_gib | peak_reserved_gib | nvidia_smi_gib | oom
    measured: float  # in the row's unit; for oom 1 = ran out of memory
    predicted: float  # validate's prediction in the row's unit (oom: 1 = does not fit)
    measured_gib: float | None  # the measurement in GiB (None for oom)
    validate_fits: bool | None  # validate's verdict: allocated peak + outside the allocator <= card
    need_bytes: int  # the allocator's reserve (not capped by the card) + outside the allocator (CUDA context, NCCL)
    card_bytes: int | None  # what CUDA reports for the card (None: GPU not in the catalog)

    @property
    def residual(self) -> float:
        """measured / predicted - 1: positive where tunecost predicted too little."""
        return self.measured / self.predicted - 1.0


class _Recorder:
    """Validate's simulation of each row, kept by the row's position (validate_rows reports it before the row)."""

    def __init__(self) -> None:
        self.index = -1
        self.simulated: dict[int, tuple[MappedRow, object]] = {}

    def progress(self, index: int, total: int, row_id: str) -> None:
        self.index = index

    def simulate(self, mapped: MappedRow) -> object:
        sim = simulate_mapped(mapped)
        self.simulated[self.index] = (mapped, sim)
        return sim


def need_bytes(sim) -> int:
    """Device memory the step needs as nvidia-smi shows it: the allocator's peak reserve (at least the allocated
    peak) plus what the allocator does not manage."""
    reserved = max(int(sim.peak_bytes), int(sim.peak_reserved_bytes))
    return reserved + outside_allocator_bytes(sim)


def memory_cases() -> list[MemoryCase]:
    """Every memory row of the shipped corpus that validate modelled, run in-process as `tunecost validate` does."""
    rows = [r for r in read_corpus() if r.get("quantity") in MEMORY_QUANTITIES]
    recorder = _Recorder()
    results = validate_rows(rows, simulate=recorder.simulate, on_progress=recorder.progress)
    cases = []
    for i, (row, result) in enumerate(zip(rows, results, strict=True)):
        if result.status != "ok" or result.measured is None or result.predicted is None or i not in recorder.simulated:
            continue
        mapped, sim = recorder.simulated[i]
        unit = unit_bytes(result.unit) if result.quantity in PEAK_MEMORY_QUANTITIES else None
        cases.append(
            MemoryCase(
                id=row.id,
                model=row.get("model"),
                gpu=mapped.gpu_name or row.get("gpu"),
                num_gpus=mapped.num_gpus,
                quantity=result.quantity,
                measured=result.measured,
                predicted=result.predicted,
                measured_gib=None if unit is None else result.measured * unit / BYTES_PER_GIB,
                validate_fits=result.fits,
                need_bytes=need_bytes(sim),
                card_bytes=mapped.gpu_memory_bytes,
            )
        )
    return cases


def percentile(values: list[float], q: float) -> float:
    """The q-quantile by linear interpolation between order statistics (numpy's default, Hyndman-Fan type 7)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    lo = math.floor(position)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (position - lo)


def margin_fraction(residuals: list[float]) -> float:
    """The MARGIN_QUANTILE of the residuals rounded up to a whole percent (no margin where it is not positive)."""
    pct = percentile(residuals, MARGIN_QUANTILE) * 100.0
    return max(0, math.ceil(round(pct, 9))) / 100.0


def verdict(need: int, card: int, margin: float) -> str:
    if need * (1.0 + margin) <= card:
        return "fits"
    return "borderline" if need <= card else "does not fit"


def _residual_lines(groups: dict[str, list[MemoryCase]]) -> list[str]:
    head = f"{'quantity':<24} {'rows':>5} " + " ".join(f"{f'p{round(q * 100)}':>7}" for q in QUANTILES)
    lines = [head + f" {'r > 0':>7} {'margin':>7}"]
    for name, cases in groups.items():
        r = [c.residual for c in cases]
        cells = " ".join(f"{percentile(r, q) * 100:+6.1f}%" for q in QUANTILES)
        share = sum(1 for x in r if x > 0) / len(r) * 100
        lines.append(f"{name:<24} {len(r):5d} {cells} {share:6.0f}% {margin_fraction(r) * 100:6.0f}%")
    return lines


def _need_line(c: MemoryCase, margin: float) -> str:
    assert c.card_bytes is not None
    need = c.need_bytes / BYTES_PER_GIB
    with_margin = verdict(c.need_bytes, c.card_bytes, margin)
    measured = "OOM" if c.measured_gib is None else f"{c.measured_gib:.2f} {QUANTITY_LABELS[c.quantity]}"
    return (
        f"{c.id:<10} {c.model[:34]:<34} {c.gpu[:16]:<16} {c.num_gpus:>4d} {need:8.2f} {need * (1 + margin):8.2f} "
        f"{c.card_bytes / BYTES_PER_GIB:7.2f} {'fits' if c.validate_fits else 'no':>8} {with_margin:>12}  {measured}"
    )


def report(cases: list[MemoryCase]) -> tuple[float, int, list[str]]:
    """(margin, residual rows, the printed lines)."""
    peak = [c for c in cases if c.quantity in PEAK_MEMORY_QUANTITIES]
    margin = margin_fraction([c.residual for c in peak])
    groups = {QUANTITY_LABELS[q]: [c for c in peak if c.quantity == q] for q in PEAK_MEMORY_QUANTITIES}
    groups = {k: v for k, v in groups.items() if v}
    groups["all"] = peak
    device = {"reserved + nvidia-smi": [c for c in peak if c.quantity in DEVICE_QUANTITIES]}
    lines = [
        "Residuals r = measured / predicted - 1 of validate's modelled peak-memory rows (positive: under-predicted)",
        *_residual_lines(groups),
        "",
        "Rows measuring what the device gives (the allocator's reserve or nvidia-smi)",
        *_residual_lines(device),
        "",
        f"margin (p{round(MARGIN_QUANTILE * 100)} over all {len(peak)} rows, rounded up to a whole percent): "
        f"{margin:.2f}",
        "",
        f"Largest under-predictions ({NUM_LARGEST})",
        f"{'id':<10} {'model':<34} {'quantity':<10} {'predicted':>9} {'measured':>9} {'r':>7}",
    ]
    for c in sorted(peak, key=lambda c: c.residual, reverse=True)[:NUM_LARGEST]:
        lines.append(
            f"{c.id:<10} {c.model[:34]:<34} {QUANTITY_LABELS[c.quantity]:<10} {c.predicted:9.3f} {c.measured:9.3f} "
            f"{c.residual * 100:+6.1f}%"
        )
    head = (
        f"{'id':<10} {'model':<34} {'gpu':<16} {'gpus':>4} {'need GiB':>8} {'x(1+m)':>8} {'card':>7} "
        f"{'validate':>8} {'with margin':>12}  measured GiB"
    )
    oom = [c for c in cases if c.quantity == "oom" and c.measured == 1.0 and c.card_bytes is not None]
    lines += [
        "",
        "Rows measured out of memory: need = predicted reserve + outside the allocator (GiB); card = what CUDA "
        "reports; validate = its verdict (allocated peak + outside <= card)",
        head,
        *(_need_line(c, margin) for c in oom),
        f"out-of-memory rows still predicted to fit with the margin: "
        f"{sum(1 for c in oom if verdict(c.need_bytes, c.card_bytes or 0, margin) == 'fits')} of {len(oom)}",
    ]
    ran = [c for c in peak if c.card_bytes is not None]
    flagged = [c for c in ran if verdict(c.need_bytes, c.card_bytes or 0, margin) != "fits"]
    lines += [
        "",
        f"Rows that ran (peak-memory rows) whose need x (1 + margin) exceeds the card: {len(flagged)} of {len(ran)}",
        head,
        *(_need_line(c, margin) for c in sorted(flagged, key=lambda c: c.id)),
    ]
    return margin, len(peak), lines


def margin_csv(margin: float, rows: int, as_of: str) -> str:
    return (
        "# The safety margin on a predicted fit (need x (1 + fraction) <= the card's memory): the quantile of "
        "under-prediction (measured / predicted - 1) over tunecost validate's modelled peak-memory rows of the "
        "shipped corpus, rounded up to a whole percent.\n"
        "name,fraction,quantile,rows,command,as_of\n"
        f"default,{margin:.2f},{MARGIN_QUANTILE},{rows},{COMMAND},{as_of}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"store the margin in {MARGIN_PATH.name}")
    args = parser.parse_args()
    margin, rows, lines = report(memory_cases())
    print("\n".join(lines))
    if args.write:
        atomic_write_text(MARGIN_PATH, margin_csv(margin, rows, datetime.date.today().isoformat()))
        print(f"\nwrote {MARGIN_PATH}")


if __name__ == "__main__":
    main()
