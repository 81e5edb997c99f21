"""The LoRA targets PEFT takes for a model type when a LoraConfig leaves target_modules unset
(`data/peft_targets.csv`, generated from PEFT by `benchmarks/peft_targets.py`)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from tunecost.catalog._csv import read_catalog_csv

PEFT_TARGETS_PATH = Path(__file__).parent / "data" / "peft_targets.csv"


@lru_cache(maxsize=1)
def _targets() -> dict[str, tuple[str, ...]]:
    rows = read_catalog_csv(PEFT_TARGETS_PATH, ("model_type", "target_modules", "source", "as_of"))
    return {row["model_type"]: tuple(row["target_modules"].split(";")) for _, row in rows}


def peft_default_targets(model_type: str) -> tuple[str, ...] | None:
    """PEFT's module names for `model_type` (e.g. llama: q_proj, v_proj), or None where PEFT has none and asks for
    target_modules."""
    return _targets().get(model_type)
