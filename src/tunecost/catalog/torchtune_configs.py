"""The configs torchtune ships for its fine-tuning recipes (`data/torchtune_configs.json`), by the name
`tune run RECIPE --config NAME` takes (`llama3_1/8B_lora_single_device`): a job named that way reads without the
file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from tunecost.errors import TunecostError

TORCHTUNE_CONFIGS_PATH = Path(__file__).parent / "data" / "torchtune_configs.json"
RECIPES = (
    "full_finetune_single_device",
    "full_finetune_distributed",
    "lora_finetune_single_device",
    "lora_finetune_distributed",
)


@dataclass(frozen=True, kw_only=True)
class ShippedConfig:
    name: str  # as `tune run` takes it: llama2/7B_lora
    recipe: str  # the recipe torchtune lists it under
    config: dict[str, Any]  # the YAML, less the sections naming local paths and logging
    source: str  # repository, commit, date and file


def load_torchtune_configs(path: Path = TORCHTUNE_CONFIGS_PATH) -> dict[str, ShippedConfig]:
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))["configs"]
        out = {r["name"]: ShippedConfig(name=r["name"], recipe=r["recipe"], config=r["config"], source=r["source"])
               for r in rows}  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TunecostError(f"{path}: not a torchtune config catalog ({exc.__class__.__name__}: {exc})") from None
    for c in out.values():
        if c.recipe not in RECIPES:
            raise TunecostError(f"{path}: config {c.name!r}: recipe {c.recipe!r} is not one of {', '.join(RECIPES)}")
        if not isinstance(c.config, dict):
            raise TunecostError(f"{path}: config {c.name!r}: its config is not a mapping")
    return out


@lru_cache(maxsize=1)
def torchtune_configs() -> dict[str, ShippedConfig]:
    return load_torchtune_configs()


def find_torchtune_config(name: str) -> ShippedConfig | None:
    """The shipped config of that name (`llama2/7B_lora`, a `.yaml` suffix allowed), or None."""
    return torchtune_configs().get(name.removesuffix(".yaml"))
