"""Dataset facts the cost model needs without the data: rows per epoch and token-length statistics, each with its
source (data/datasets.csv).

Sources and derivations: docs/datasets.md, section `tunecost.catalog.datasets`.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tunecost.catalog._csv import parse_float, read_catalog_csv
from tunecost.errors import TunecostError, unknown_name_error

DATASET_CATALOG_PATH = Path(__file__).parent / "data" / "datasets.csv"
REQUIRED_COLUMNS = ("name", "num_queries", "median_tokens_paper", "source", "as_of")
TRAIN_SPLIT = "train"


@dataclass(frozen=True, kw_only=True)
class DatasetFacts:
    """One catalog row. Token counts are per query (prompt + response, as `length_source` counted them)."""

    name: str
    num_queries: int  # rows of `split` (one epoch)
    median_tokens_paper: float  # the paper's median (Table II / Fig. 2); NaN for rows the paper does not report
    kind: str
    hub_id: str
    source: str  # where num_queries (and the paper's median) come from
    as_of: str
    split: str = ""  # the split num_queries counts ("" where the source does not say)
    aliases: tuple[str, ...] = ()  # other spellings a user may type
    median_tokens: float | None = None
    p95_tokens: float | None = None
    max_tokens: float | None = None
    mean_tokens: float | None = None
    tokenizer: str = ""  # the tokenizer that counted median/p95/max/mean_tokens
    length_source: str = ""  # where median/p95/max/mean_tokens come from

    def __post_init__(self) -> None:
        if self.num_queries < 1:
            raise TunecostError(f"dataset {self.name}: num_queries must be >= 1, got {self.num_queries}")
        stats = {"median": self.median_tokens, "p95": self.p95_tokens, "max": self.max_tokens}
        given = [(k, v) for k, v in stats.items() if v is not None]
        for label, value in [*given, ("mean", self.mean_tokens)]:
            if value is not None and value <= 0:
                raise TunecostError(f"dataset {self.name}: {label} tokens must be > 0, got {value:g}")
        for (lo_name, lo), (hi_name, hi) in itertools.pairwise(given):
            if lo > hi:
                raise TunecostError(f"dataset {self.name}: {lo_name} {lo:g} tokens above {hi_name} {hi:g}")
        if self.mean_tokens is not None and self.max_tokens is not None and self.mean_tokens > self.max_tokens:
            raise TunecostError(f"dataset {self.name}: mean {self.mean_tokens:g} tokens above max {self.max_tokens:g}")
        if (given or self.mean_tokens is not None) and not (self.tokenizer and self.length_source):
            raise TunecostError(f"dataset {self.name}: length statistics need a tokenizer and a length_source")

    @property
    def has_paper_median(self) -> bool:
        return math.isfinite(self.median_tokens_paper) and self.median_tokens_paper > 0

    @property
    def length_statistic(self) -> str:
        """The statistic the length model uses: "paper median", "median", "mean", or "" when there is none."""
        if self.has_paper_median:
            return "paper median"
        if self.median_tokens is not None:
            return "median"
        if self.mean_tokens is not None:
            return "mean"
        return ""

    @property
    def length_summary(self) -> str:
        """One phrase for notes: the statistic the length model uses and where it comes from."""
        if self.has_paper_median:
            return f"a log-normal around the paper's median of {self.median_tokens_paper:g} tokens"
        counted = f"{self.tokenizer} tokenizer; {self.length_source}"
        if self.median_tokens is not None:
            known = [("p95", self.p95_tokens), ("max", self.max_tokens)]
            more = "".join(f", {label} {value:g}" for label, value in known if value is not None)
            return f"a log-normal through median {self.median_tokens:g}{more} tokens ({counted})"
        if self.mean_tokens is not None:
            return f"a log-normal from a mean of {self.mean_tokens:g} tokens, no median published ({counted})"
        return f"no token-length statistic in the catalog ({self.counting_hint}, or --seq-len N)"

    @property
    def spellings(self) -> tuple[str, ...]:
        """Name and aliases: what resolves to this row alone."""
        return (self.name, *self.aliases)

    @property
    def counting_hint(self) -> str:
        """How a user gets this dataset's real lengths counted: a file, or its copy in the local Hugging Face cache."""
        hub = f", or `hf download {self.hub_id} --repo-type dataset` (its local copy is counted)" if self.hub_id else ""
        return f"give --dataset FILE (a local copy, measured with the model's tokenizer){hub}"

    @property
    def hub_spellings(self) -> tuple[str, ...]:
        """The hub id and its last part (a row may share them with another split of the same dataset)."""
        if not self.hub_id:
            return ()
        return (self.hub_id, self.hub_id.rsplit("/", 1)[-1])


def lookup_key(text: str) -> str:
    """How names compare: case-insensitive, surrounding space dropped, '_' and inner spaces read as '-'."""
    return re.sub(r"[\s_]+", "-", text.strip().lower())


def _optional_float(path: Path, row_number: int, row: dict[str, str], column: str) -> float | None:
    value = row.get(column, "")
    return parse_float(path, row_number, column, value) if value else None


def _facts(path: Path, i: int, row: dict[str, str]) -> DatasetFacts:
    paper = row["median_tokens_paper"]
    try:
        return DatasetFacts(
            name=row["name"],
            num_queries=int(parse_float(path, i, "num_queries", row["num_queries"])),
            median_tokens_paper=parse_float(path, i, "median_tokens_paper", paper) if paper else math.nan,
            kind=row.get("kind", ""),
            hub_id=row.get("hub_id", ""),
            source=row["source"],
            as_of=row["as_of"],
            split=row.get("split", ""),
            aliases=tuple(a.strip() for a in row.get("aliases", "").split(";") if a.strip()),
            median_tokens=_optional_float(path, i, row, "median_tokens"),
            p95_tokens=_optional_float(path, i, row, "p95_tokens"),
            max_tokens=_optional_float(path, i, row, "max_tokens"),
            mean_tokens=_optional_float(path, i, row, "mean_tokens"),
            tokenizer=row.get("tokenizer", ""),
            length_source=row.get("length_source", ""),
        )
    except TunecostError as exc:
        raise TunecostError(f"{path}: row {i}: {exc}") from None


@lru_cache(maxsize=1)
def dataset_catalog() -> dict[str, DatasetFacts]:
    path = DATASET_CATALOG_PATH
    out: dict[str, DatasetFacts] = {}
    owner: dict[str, str] = {}  # lookup key of every name and alias -> its row
    for i, row in read_catalog_csv(path, REQUIRED_COLUMNS):
        facts = _facts(path, i, row)
        for spelling in facts.spellings:
            key = lookup_key(spelling)
            if owner.get(key, facts.name) != facts.name:
                raise TunecostError(f"{path}: row {i}: {spelling!r} already names dataset {owner[key]}")
            owner[key] = facts.name
        if not facts.source or not facts.as_of:
            raise TunecostError(f"{path}: row {i}: dataset {facts.name} needs a source and an as_of date")
        out[facts.name] = facts
    return out


def get_dataset_facts(name: str) -> DatasetFacts:
    """The catalog row `name` names: by name or alias, else by hub id (its train split where rows share one)."""
    catalog = dataset_catalog()
    key = lookup_key(name)
    for facts in catalog.values():
        if key in {lookup_key(s) for s in facts.spellings}:
            return facts
    by_hub = [f for f in catalog.values() if key in {lookup_key(s) for s in f.hub_spellings}]
    if len(by_hub) > 1:  # "train", else a split named after it ("train_sft")
        by_hub = (
            [f for f in by_hub if f.split == TRAIN_SPLIT]
            or [f for f in by_hub if f.split.startswith("train")]
            or by_hub
        )
    if len(by_hub) == 1:
        return by_hub[0]
    if by_hub:
        raise TunecostError(f"dataset {name!r} is the hub id of {', '.join(f.name for f in by_hub)}; name one")
    raise unknown_name_error("dataset", name, catalog.keys())


def find_dataset_facts(name: str) -> DatasetFacts | None:
    """The catalog row `name` names (`get_dataset_facts`), or None where it names none (or several)."""
    try:
        return get_dataset_facts(name)
    except TunecostError:
        return None
