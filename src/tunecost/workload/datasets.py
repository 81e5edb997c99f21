"""Fine-tuning and evaluation datasets: local files, known names, the Hugging Face hub, the embedded task.

Sources and derivations: docs/datasets.md, section `tunecost.workload.datasets`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tunecost.catalog.datasets import find_dataset_facts
from tunecost.errors import TunecostError, unknown_name_error
from tunecost.workload.formats import FORMAT_ALIASES, FORMATS, DatasetFormat, Example, columns_format, detect_format
from tunecost.workload.known_datasets import (
    DATA_DIR_ENV,
    KNOWN_DATASETS,
    canonical_name,
    data_dirs,
    is_hub_id,
    load_hub_rows,
    resolve_known,
)
from tunecost.workload.synthetic import (
    DEFAULT_NUM_TEST,
    DEFAULT_NUM_TRAIN,
    SYNTHETIC_SEED,
    SyntheticArithConfig,
    synthetic_arith_rows,
)


@dataclass(frozen=True, kw_only=True)
class Dataset:
    """Loaded examples with where they came from."""

    name: str
    source: str  # file path, hub id or "embedded"
    format: str
    examples: tuple[Example, ...]
    skipped_rows: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.examples:
            raise TunecostError(f"dataset {self.name!r} ({self.source}) is empty: no usable rows")

    def __len__(self) -> int:
        return len(self.examples)

    def head(self, limit: int | None) -> Dataset:
        """The first `limit` examples (all when None)."""
        if limit is None or limit >= len(self.examples):
            return self
        if limit <= 0:
            raise TunecostError(f"limit must be positive, got {limit}")
        return replace(self, examples=self.examples[:limit])


# ----------------------------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class BadLine:
    """A JSONL line that is not JSON: kept in place so `rows_to_dataset` reports it with its row index."""

    error: str


def rows_to_dataset(
    rows: list[Any],
    *,
    name: str,
    source: str,
    fmt: DatasetFormat | str | None = None,
    columns: Mapping[str, str] | None = None,
    skip_bad_rows: bool = False,
) -> Dataset:
    """Turn raw rows (dicts) into a `Dataset`, validating every row."""
    if not rows:
        raise TunecostError(f"dataset {name!r} ({source}) is empty: no rows")
    if columns:
        fmt = columns_format(columns)
    elif isinstance(fmt, str):
        key = FORMAT_ALIASES.get(fmt, fmt)
        if key not in FORMATS:
            raise unknown_name_error("dataset format", fmt, [*FORMATS, *FORMAT_ALIASES])
        fmt = FORMATS[key]
    elif fmt is None:
        seen: set[str] = set()
        for row in rows[:50]:
            if isinstance(row, Mapping):
                seen.update(str(k) for k in row)
        fmt = detect_format(seen, source)
    examples: list[Example] = []
    skipped: list[int] = []
    for index, row in enumerate(rows):
        try:
            if isinstance(row, BadLine):
                raise ValueError(row.error)
            if not isinstance(row, Mapping):
                raise ValueError(f"expected an object, got {type(row).__name__}")
            examples.append(fmt.to_example(row))
        except ValueError as exc:
            if not skip_bad_rows:
                raise TunecostError(
                    f"{source}: row {index + 1} is malformed ({exc}) for format {fmt.name}; fix it (`tunecost data "
                    "stats FILE --skip-bad-rows` lists every malformed row)"
                ) from None
            skipped.append(index)
    if not examples:
        raise TunecostError(f"dataset {name!r} ({source}) is empty: all {len(rows)} rows are malformed")
    return Dataset(name=name, source=source, format=fmt.name, examples=tuple(examples), skipped_rows=tuple(skipped))


# ----------------------------------------------------------------------------------------------- files


def read_rows(path: str | os.PathLike[str]) -> list[Any]:
    """Raw rows of a .json (a list, or an object holding one list), .jsonl, .parquet or .csv file."""
    target = Path(path)
    if not target.is_file():
        raise TunecostError(f"dataset file not found: {target}")
    suffix = target.suffix.lower()
    if suffix in (".parquet", ".csv"):
        import pandas as pd

        try:
            frame = pd.read_parquet(target) if suffix == ".parquet" else pd.read_csv(target)
        except (ValueError, OSError) as exc:  # pyarrow's and pandas' parse errors are ValueErrors
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise TunecostError(f"{target}: cannot read it as {suffix[1:]} ({reason})") from None
        return frame.to_dict(orient="records")
    try:
        text = target.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TunecostError(f"{target} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if suffix == ".jsonl" or (suffix != ".json" and not text.lstrip().startswith("[")):
        rows: list[Any] = []
        for line_no, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                rows.append(BadLine(f"line {line_no + 1} is not JSON: {exc.msg}"))
            except RecursionError:
                rows.append(BadLine(f"line {line_no + 1} is nested too deeply"))
        return rows
    try:
        data = json.loads(text)
    except RecursionError:
        raise TunecostError(f"{target}: nested too deeply to read") from None
    except json.JSONDecodeError as exc:
        raise TunecostError(f"{target}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) == 1:
            return lists[0]
        raise TunecostError(f"{target}: expected a JSON list of rows; found an object with keys {sorted(data)[:10]}")
    if not isinstance(data, list):
        raise TunecostError(f"{target}: expected a JSON list of rows, got {type(data).__name__}")
    return data


def load_file(
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    fmt: str | None = None,
    columns: Mapping[str, str] | None = None,
    skip_bad_rows: bool = False,
) -> Dataset:
    target = Path(path)
    rows = read_rows(target)
    return rows_to_dataset(
        rows, name=name or target.stem, source=str(target), fmt=fmt, columns=columns, skip_bad_rows=skip_bad_rows
    )


def load_dataset(
    spec: str,
    *,
    fmt: str | None = None,
    columns: Mapping[str, str] | None = None,
    skip_bad_rows: bool = False,
    allow_download: bool = False,
    split: str = "train",
    limit: int | None = None,
) -> Dataset:
    """Load a dataset from a file path, a known name, ``synthetic-arith`` or a hub id ``org/name``."""
    path = Path(os.path.expanduser(spec))
    if path.is_file():
        return load_file(path, fmt=fmt, columns=columns, skip_bad_rows=skip_bad_rows).head(limit)
    if path.is_dir():
        raise TunecostError(f"{spec} is a folder; pass a .json/.jsonl/.parquet/.csv file")
    known = canonical_name(spec)
    if known in ("synthetic-arith", "synthetic-arith-test"):
        return synthetic_arith_dataset(split="test" if known.endswith("-test") else "train").head(limit)
    if known is not None:
        local = resolve_known(known)
        if local is not None:
            return load_file(local, name=known, fmt=fmt, columns=columns, skip_bad_rows=skip_bad_rows).head(limit)
        entry = KNOWN_DATASETS[known]
        looked = ", ".join(str(d) for d in data_dirs()) or f"(${DATA_DIR_ENV} is not set)"
        if entry.hub is None:
            raise TunecostError(
                f"dataset {known!r} not found: looked for {', '.join(entry.files)} under {looked}; "
                f"set ${DATA_DIR_ENV} to the folder holding it or pass the file path"
            )
        repo_id, config, hub_split = entry.hub
        try:
            rows = load_hub_rows(repo_id, config, hub_split, allow_download=allow_download)
        except TunecostError as exc:
            raise TunecostError(f"dataset {known!r} not found under {looked}; {exc}") from None
        return rows_to_dataset(
            rows, name=known, source=f"hub:{repo_id}:{hub_split}", fmt=fmt, columns=columns, skip_bad_rows=skip_bad_rows
        ).head(limit)
    if is_hub_id(spec):
        rows = load_hub_rows(spec, None, split, allow_download=allow_download)
        return rows_to_dataset(
            rows, name=spec, source=f"hub:{spec}:{split}", fmt=fmt, columns=columns, skip_bad_rows=skip_bad_rows
        ).head(limit)
    if path.suffix or os.sep in spec:
        raise TunecostError(f"dataset file not found: {spec}")
    facts = find_dataset_facts(spec)
    if facts is not None and facts.hub_id:  # a catalog dataset: its hub copy (the local cache, else a download)
        return load_dataset(
            facts.hub_id, fmt=fmt, columns=columns, skip_bad_rows=skip_bad_rows, allow_download=allow_download,
            split=facts.split or "train", limit=limit,
        )  # fmt: skip
    raise unknown_name_error("dataset", spec, KNOWN_DATASETS)


def parse_columns(text: str | None) -> dict[str, str] | None:
    """Parse a CLI column mapping ``prompt=question,response=solution[,answer=final]``."""
    if not text:
        return None
    mapping: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise TunecostError(f"bad column mapping item {item!r}; expected KEY=COLUMN, e.g. prompt=question")
        mapping[key.strip()] = value.strip()
    return mapping


def synthetic_arith_dataset(
    split: str = "train",
    num_train: int = DEFAULT_NUM_TRAIN,
    num_test: int = DEFAULT_NUM_TEST,
    *,
    seed: int = SYNTHETIC_SEED,
    config: SyntheticArithConfig = SyntheticArithConfig(),
):
    """The embedded task as a `tunecost.workload.datasets.Dataset` (format llm-adapters)."""
    if split not in ("train", "test"):
        raise TunecostError(f"synthetic-arith split must be 'train' or 'test', got {split!r}")
    train, test = synthetic_arith_rows(num_train, num_test, seed=seed, config=config)
    name = "synthetic-arith" if split == "train" else "synthetic-arith-test"
    return rows_to_dataset(
        train if split == "train" else test, name=name, source=f"embedded:seed={seed}", fmt="llm-adapters"
    )
