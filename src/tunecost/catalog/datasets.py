"""Dataset facts the cost model needs without the data: query counts and the paper's median lengths."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tunecost.catalog._csv import parse_float, read_catalog_csv
from tunecost.errors import unknown_name_error

DATASET_CATALOG_PATH = Path(__file__).parent / "data" / "datasets.csv"


@dataclass(frozen=True, kw_only=True)
class DatasetFacts:
    name: str
    num_queries: int
    median_tokens_paper: float
    kind: str
    hub_id: str
    source: str
    as_of: str


@lru_cache(maxsize=1)
def dataset_catalog() -> dict[str, DatasetFacts]:
    path = DATASET_CATALOG_PATH
    out = {}
    for i, row in read_catalog_csv(path, ("name", "num_queries", "median_tokens_paper", "source", "as_of")):
        out[row["name"]] = DatasetFacts(
            name=row["name"],
            num_queries=int(parse_float(path, i, "num_queries", row["num_queries"])),
            median_tokens_paper=parse_float(path, i, "median_tokens_paper", row["median_tokens_paper"]),
            kind=row.get("kind", ""),
            hub_id=row.get("hub_id", ""),
            source=row["source"],
            as_of=row["as_of"],
        )
    return out


def get_dataset_facts(name: str) -> DatasetFacts:
    catalog = dataset_catalog()
    for key, facts in catalog.items():
        if key.lower() == name.strip().lower():
            return facts
    raise unknown_name_error("dataset", name, catalog.keys())
