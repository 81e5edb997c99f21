"""Throughput measurements (CSV): the input of eq. (2)'s fit and of the calibrated estimator.

Columns as the paper artifact's A40 measurements (`catalog/data/measurements/paper_a40_throughput.csv`): model,
dataset, gpu, experts_per_token, [sparsity], batch_size, queries_per_s [, seq_len]. Every error names the row
(1-based, header excluded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tunecost.csvfile import read_csv_rows
from tunecost.errors import TunecostError
from tunecost.limits import MAX_BATCH_SIZE, MAX_QUERIES_PER_S, MAX_SEQ_LEN, MIN_QUERIES_PER_S
from tunecost.models.catalog import model_catalog

MEASUREMENTS_DIR = Path(__file__).parents[1] / "catalog" / "data" / "measurements"
PAPER_A40_MEASUREMENTS = MEASUREMENTS_DIR / "paper_a40_throughput.csv"
PAPER_A100_40GB_MEASUREMENTS = MEASUREMENTS_DIR / "paper_a100_40gb_throughput.csv"
BUNDLED_MEASUREMENTS = (PAPER_A40_MEASUREMENTS, PAPER_A100_40GB_MEASUREMENTS)  # every public measurement shipped
PAPER_A40_SOURCE = "paper A40 measurements (bundled)"  # the `source` of fit records drawn from them
REQUIRED_COLUMNS = ("model", "dataset", "gpu", "experts_per_token", "batch_size", "queries_per_s")
DEFAULT_NUM_EXPERTS = 8  # both of the paper's models have 8 experts


@dataclass(frozen=True, kw_only=True)
class Measurement:
    model: str
    dataset: str
    gpu: str
    experts_per_token: int
    sparsity: float
    batch_size: int
    queries_per_s: float
    seq_len: int | None = None


def _num_experts_of(model: str) -> int:
    spec = model_catalog().get(model)
    return spec.num_experts if spec is not None and spec.is_moe else DEFAULT_NUM_EXPERTS


def _number(path: Path, row: int, column: str, text: str, *, integer: bool = False) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise TunecostError(f"{path}: row {row}: column {column!r} is not a number: {text!r}") from None
    if not math.isfinite(value):
        raise TunecostError(f"{path}: row {row}: column {column!r} must be a finite number, got {text!r}")
    if integer and value != int(value):
        raise TunecostError(f"{path}: row {row}: column {column!r} must be a whole number, got {text!r}")
    return value


def load_measurements(path: str | Path) -> list[Measurement]:
    path = Path(path)
    header, rows = read_csv_rows(path, "measurements file")
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise TunecostError(
            f"{path}: missing column(s) {', '.join(missing)}; found {', '.join(map(repr, header)) or 'none'}; "
            f"required: {', '.join(REQUIRED_COLUMNS)}"
        )
    if not rows:
        raise TunecostError(f"{path}: no measurements")
    out = []
    for i, row in enumerate(rows, start=1):
        for col in ("model", "dataset", "gpu"):
            if not (row.get(col) or "").strip():
                raise TunecostError(f"{path}: row {i}: empty {col!r}")
        k = int(_number(path, i, "experts_per_token", row["experts_per_token"], integer=True))
        batch = int(_number(path, i, "batch_size", row["batch_size"], integer=True))
        qps = _number(path, i, "queries_per_s", row["queries_per_s"])
        if k < 1 or batch < 1:
            raise TunecostError(f"{path}: row {i}: experts_per_token and batch_size must be >= 1")
        if not MIN_QUERIES_PER_S <= qps <= MAX_QUERIES_PER_S:
            raise TunecostError(
                f"{path}: row {i}: queries_per_s must be between {MIN_QUERIES_PER_S:g} and {MAX_QUERIES_PER_S:g}, "
                f"got {qps:g}"
            )
        if batch > MAX_BATCH_SIZE or k > MAX_BATCH_SIZE:
            raise TunecostError(f"{path}: row {i}: batch_size and experts_per_token must be at most {MAX_BATCH_SIZE}")
        model = row["model"].strip()
        if (row.get("sparsity") or "").strip():
            sparsity = _number(path, i, "sparsity", row["sparsity"])
        else:
            sparsity = k / _num_experts_of(model)
        if not 0 < sparsity <= 1:
            raise TunecostError(f"{path}: row {i}: sparsity must be in (0, 1], got {sparsity}")
        seq = (row.get("seq_len") or "").strip()
        seq_len = int(_number(path, i, "seq_len", seq, integer=True)) if seq else None
        if seq_len is not None and not 1 <= seq_len <= MAX_SEQ_LEN:
            raise TunecostError(f"{path}: row {i}: seq_len must be between 1 and {MAX_SEQ_LEN}, got {seq_len}")
        out.append(
            Measurement(
                model=model,
                dataset=row["dataset"].strip(),
                gpu=row["gpu"].strip(),
                experts_per_token=k,
                sparsity=sparsity,
                batch_size=batch,
                queries_per_s=qps,
                seq_len=seq_len,
            )
        )
    return out
