"""Regenerate src/tunecost/catalog/data/torchtune_configs.json from a torchtune git repository: the configs torchtune
ships for its four fine-tuning recipes, so `--config llama3_1/8B_lora_single_device` reads as `tune run` runs it.

    .venv/bin/python benchmarks/torchtune_configs.py --repo PATH/TO/torchtune [--rev REV] [--check]

The recipe of each config is the one `torchtune/_recipe_registry.py` lists it under; each is kept as its YAML holds
it, less the sections that name local paths and logging (`DROPPED`). A config tunecost's torchtune reader refuses
(vision, Llama 4, DoRA) is left out and printed with the reader's reason.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tunecost.catalog.torchtune_configs import RECIPES, TORCHTUNE_CONFIGS_PATH
from tunecost.errors import TunecostError
from tunecost.io import atomic_write_text
from tunecost.workload.frameworks import ConfigFile
from tunecost.workload.frameworks.torchtune import FRAMEWORK

DROPPED = ("output_dir", "checkpointer", "metric_logger", "profiler", "log_every_n_steps", "log_peak_memory_stats")
DROPPED += ("log_level", "resume_from_checkpoint", "seed", "device", "lr_scheduler")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def recipe_configs(registry_source: str) -> list[tuple[str, str]]:
    """(recipe, config file path under recipes/configs) for the four fine-tuning recipes."""
    out: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(registry_source)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Recipe"):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        if ast.literal_eval(kw["name"]) not in RECIPES:
            continue
        for config in kw["configs"].elts:  # type: ignore[attr-defined]
            fields = {k.arg: ast.literal_eval(k.value) for k in config.keywords}
            out.append((ast.literal_eval(kw["name"]), fields["file_path"]))
    return out


def kept(data: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in data.items() if k not in DROPPED}
    if isinstance(out.get("tokenizer"), dict):
        out["tokenizer"] = {k: v for k, v in out["tokenizer"].items() if k not in ("path", "merges_file")}
    return out


def build(repo: Path, rev: str) -> tuple[dict[str, Any], list[str]]:
    """(the catalog, the configs left out with why)."""
    commit = git(repo, "rev-parse", rev).strip()
    date = git(repo, "show", "-s", "--format=%cs", commit).strip()
    configs, left_out = [], []
    for recipe, path in recipe_configs(git(repo, "show", f"{commit}:torchtune/_recipe_registry.py")):
        name = path.removesuffix(".yaml")
        try:
            data = kept(yaml.safe_load(git(repo, "show", f"{commit}:recipes/configs/{path}")))
        except subprocess.CalledProcessError:
            left_out.append(f"{recipe} {name}: listed, no such file")
            continue
        try:
            FRAMEWORK.read(ConfigFile(path=name, data=data))
        except TunecostError as exc:
            left_out.append(f"{recipe} {name}: {exc}")
            continue
        source = f"pytorch/torchtune@{commit[:8]} ({date}) recipes/configs/{path}"
        configs.append({"name": name, "recipe": recipe, "source": source, "config": data})
    catalog = {"as_of": datetime.date.today().isoformat(), "configs": sorted(configs, key=lambda c: c["name"])}
    return catalog, left_out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True, help="a torchtune git repository (bare or checked out)")
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file would change (its date aside)")
    args = parser.parse_args()
    catalog, left_out = build(args.repo, args.rev)
    print(f"{len(catalog['configs'])} configs; left out: {len(left_out)}")
    for line in left_out:
        print(f"  {line}")
    if args.check:
        old = json.loads(TORCHTUNE_CONFIGS_PATH.read_text()) if TORCHTUNE_CONFIGS_PATH.exists() else {}
        return 0 if old.get("configs") == catalog["configs"] else 1
    atomic_write_text(TORCHTUNE_CONFIGS_PATH, json.dumps(catalog, indent=1) + "\n")
    print(f"wrote {TORCHTUNE_CONFIGS_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
