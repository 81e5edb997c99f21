"""Held-out errors of `tunecost validate` on the shipped corpus, the evidence behind its intervals, and the GEMM
efficiency each (stack, GPU) group of it calibrated (the family priors of stacks nobody calibrated).

Both files are written by `benchmarks/held_out_errors.py --write` (its command and date on each row).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tunecost.csvfile import read_csv_rows
from tunecost.errors import TunecostError

HELD_OUT_ERRORS_PATH = Path(__file__).resolve().parent / "data" / "held_out_errors.csv"
COLUMNS = (
    "source",
    "id",
    "quantity",
    "stack",
    "simulator_stack",
    "model_kind",
    "kind",
    "log_error",
    "command",
    "as_of",
)
STACK_EFFICIENCIES_PATH = Path(__file__).resolve().parent / "data" / "stack_efficiencies.csv"
EFFICIENCY_COLUMNS = ("stack", "stack_cell", "gpu", "family", "gemm_efficiency", "corpus", "command", "as_of")
PRIOR_KIND = "stack prior"  # predicted from its stack family's prior (no row of its own stack calibrated it)
KINDS = ("calibrated", PRIOR_KIND)
# the row's model: dense, or MoE (routed experts, whose dispatch a stack may run as an eager loop: its own errors)
MODEL_KINDS = ("dense", "moe")
# the measured quantities that are one step time each (their errors share one class)
THROUGHPUT_QUANTITIES = ("tokens_per_s_per_gpu", "tokens_per_s", "samples_per_s", "s_per_step", "time_to_train_s")


def quantity_class(quantity: str) -> str:
    """Throughput quantities share their errors (each is one step time); each memory quantity has its own."""
    return "throughput" if quantity in THROUGHPUT_QUANTITIES else quantity


@dataclass(frozen=True, kw_only=True)
class HeldOutError:
    source: str  # the publication or repository the measurement came from
    id: str
    quantity: str
    stack: str
    log_error: float  # ln(predicted / measured)
    kind: str = "calibrated"  # calibrated on a row of its (stack, GPU), or its family's prior (KINDS)
    simulator_stack: str = ""  # the step simulator's stack that reproduces the row's stack
    model_kind: str = "dense"  # MODEL_KINDS


@dataclass(frozen=True, kw_only=True)
class StackEfficiency:
    stack: str
    stack_cell: str
    gpu: str
    family: str
    gemm_efficiency: float


def _numbered_rows(path: Path, what: str, required: tuple[str, ...], column: str) -> list[tuple[int, dict, float]]:
    """(line, row, the row's finite number in `column`) of a data file; a bad value is an error naming the file,
    line and column."""
    _, rows = read_csv_rows(path, what, required=required)
    out = []
    for line, row in enumerate(rows, start=2):
        try:
            value = float(row[column])
        except ValueError:
            raise TunecostError(f"{path}: row {line}: {column} {row[column]!r} is not a number") from None
        if not math.isfinite(value):
            raise TunecostError(f"{path}: row {line}: {column} must be finite")
        out.append((line, row, value))
    return out


@lru_cache(maxsize=2)
def held_out_errors(path: Path = HELD_OUT_ERRORS_PATH) -> tuple[HeldOutError, ...]:
    out = []
    for line, row, value in _numbered_rows(path, "held-out errors file", COLUMNS, "log_error"):
        if row["kind"] not in KINDS:
            raise TunecostError(f"{path}: row {line}: kind {row['kind']!r} is not one of {', '.join(KINDS)}")
        if row["model_kind"] not in MODEL_KINDS:
            raise TunecostError(f"{path}: row {line}: model_kind {row['model_kind']!r}: dense or moe")
        fields = {k: row[k] for k in ("source", "id", "quantity", "stack", "kind", "simulator_stack", "model_kind")}
        out.append(HeldOutError(log_error=value, **fields))
    return tuple(out)


@lru_cache(maxsize=2)
def stack_efficiencies(path: Path = STACK_EFFICIENCIES_PATH) -> tuple[StackEfficiency, ...]:
    out = []
    for line, row, eff in _numbered_rows(path, "stack efficiencies file", EFFICIENCY_COLUMNS, "gemm_efficiency"):
        if not 0 < eff <= 1:
            raise TunecostError(f"{path}: row {line}: gemm_efficiency must be in (0, 1]")
        out.append(
            StackEfficiency(gemm_efficiency=eff, **{k: row[k] for k in ("stack", "stack_cell", "gpu", "family")})
        )
    return tuple(out)
