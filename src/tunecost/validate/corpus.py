"""Measurement files in the corpus columns (see data/validation/README.md): read, check columns, keep row order.

A file that lacks a column is an error naming every missing column; values are kept as text here and interpreted
per row in `mapping` (a bad value skips that row with its reason, it never stops the run).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from tunecost.errors import TunecostError
from tunecost.limits import MAX_CORPUS_FILE_BYTES

DEFAULT_CORPUS_PATH = (
    Path(__file__).resolve().parent.parent / "catalog" / "data" / "validation" / ("published_measurements.csv")
)
REQUIRED_COLUMNS: tuple[str, ...] = (
    "id",
    "source",
    "model",
    "method",
    "lora_rank",
    "lora_alpha",
    "lora_targets",
    "quantization",
    "compute_dtype",
    "batch_size_per_gpu",
    "seq_len",
    "seq_len_kind",
    "grad_ckpt",
    "attention",
    "optimizer",
    "stack",
    "gpu",
    "num_gpus",
    "quantity",
    "value",
    "unit",
)


@dataclass(frozen=True)
class CorpusRow:
    """One measurement: its file, its line, and its cells by column name."""

    path: str
    line: int
    cells: dict[str, str]

    def get(self, column: str) -> str:
        return (self.cells.get(column) or "").strip()

    @property
    def id(self) -> str:
        return self.get("id") or f"{Path(self.path).name}:{self.line}"


def read_corpus_file(path: Path) -> list[CorpusRow]:
    if not path.is_file():
        raise TunecostError(f"no measurement file at {path}")
    if path.stat().st_size > MAX_CORPUS_FILE_BYTES:
        raise TunecostError(f"{path}: larger than {MAX_CORPUS_FILE_BYTES // 2**20} MiB; not a measurement table")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise TunecostError(f"{path}: not a UTF-8 text file (measurements are CSV)") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))  # quoted cells may hold line breaks (and U+2028)
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise TunecostError(f"{path}: missing column(s): {', '.join(missing)}")
    rows = []
    for i, raw in enumerate(reader, start=2):
        cells = {(k or "").strip(): (v if isinstance(v, str) else "") for k, v in raw.items()}
        rows.append(CorpusRow(path=str(path), line=i, cells=cells))
    return rows


def read_corpus(paths: list[Path] | None = None) -> list[CorpusRow]:
    """Rows of every file in order (the shipped corpus when no path is given)."""
    out: list[CorpusRow] = []
    for path in paths or [DEFAULT_CORPUS_PATH]:
        out.extend(read_corpus_file(Path(path)))
    first: dict[tuple[str, str], CorpusRow] = {}
    for row in out:
        key = (row.get("id"), row.get("quantity"))
        if key[0] and first.setdefault(key, row) is not row:
            seen = first[key]
            raise TunecostError(
                f"{row.path}: row {row.line}: id {key[0]!r} with quantity {key[1]!r} repeats {seen.path} row "
                f"{seen.line} (a row's id and quantity name its result)"
            )
    return out
