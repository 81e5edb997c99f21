"""Light commands start without the heavy libraries: each runs in a fresh interpreter that reports what it imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tunecost
from tunecost.models.catalog import model_catalog
from tunecost.models.params import count_parameters

# Runs `tunecost ARGS...` and prints, as its last stderr line, the top-level packages it imported.
RUNNER = """
import json, sys
from tunecost.cli.main import main
sys.argv[0] = "tunecost"
try:
    main()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "packages": sorted({m.split(".")[0] for m in sys.modules})}), file=sys.stderr)
"""

HEAVY = {
    "torch",
    "transformers",
    "peft",
    "bitsandbytes",
    "accelerate",
    "safetensors",
    "datasets",
    "scipy",
    "numpy",
    "pandas",
    "matplotlib",
    "yaml",
}
# Off a terminal, tables and plain lines are written without rich.
NO_RICH = HEAVY | {"rich"}
# typer builds a pydantic validator to read a value given to an option; a command given none needs none.
NO_VALUES = NO_RICH | {"pydantic"}

COST = ["cost", "--queries", "1000", "--epochs", "2", "--throughput", "1.5", "--usd-per-hour", "2"]


def _imported(args: list[str], cwd: Path) -> set[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    source = str(Path(tunecost.__file__).parents[1])  # the tunecost under test, wherever the runner's folder is
    env["PYTHONPATH"] = os.pathsep.join([source, *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    report = json.loads(done.stderr.splitlines()[-1])
    assert report["code"] == 0, done.stderr
    return set(report["packages"])


@pytest.mark.parametrize(
    ("args", "absent"),
    [
        (["--version"], NO_VALUES),
        (["gpus"], NO_VALUES),
        (["prices"], NO_VALUES),
        (["prices", "--gpu", "h100", "--provider", "lambda"], NO_RICH),
        (COST, NO_RICH),
        ([*COST[:-2], "--gpu", "a100"], NO_RICH),
    ],
    ids=["version", "gpus", "prices", "prices-filtered", "cost", "cost-priced"],
)
def test_light_commands_import_no_heavy_library(args: list[str], absent: set[str], tmp_path: Path) -> None:
    assert not _imported(args, tmp_path) & absent


@pytest.mark.long
def test_models_reads_its_counts_without_torch(tmp_path: Path) -> None:
    """Once counted (on the meta device, with torch), `tunecost models` reads every count from the cache."""
    for spec in model_catalog().values():
        count_parameters(spec)
    assert not _imported(["models"], tmp_path) & NO_VALUES
