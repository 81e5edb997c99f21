"""Read every config file under a folder (a framework's examples) as `--config` would: how many each reader takes,
why the others are refused, which name a catalog dataset, and which models the catalog lacks.

    .venv/bin/python benchmarks/config_sweep.py FOLDER [FOLDER ...] [--errors N]

For example, LLaMA-Factory's examples at a commit: `git -C LLaMA-Factory archive ff6d4d12 examples | tar -x -C /tmp/lf`,
then `config_sweep.py /tmp/lf/examples`. Reading needs no model weights and no network.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tunecost.errors import TunecostError  # noqa: E402
from tunecost.models.catalog import resolve_model  # noqa: E402
from tunecost.workload.frameworks.registry import read_config  # noqa: E402

SUFFIXES = (".yaml", ".yml", ".toml", ".json")


def sweep(folder: Path) -> dict[str, collections.Counter]:
    """Counters of one folder: read (by framework), refused (by reason), dataset, missing model."""
    out = {k: collections.Counter() for k in ("read", "refused", "dataset", "missing model")}
    for path in sorted(p for p in folder.rglob("*") if p.suffix in SUFFIXES and p.is_file()):
        try:
            job = read_config(path)
        except TunecostError as exc:
            reason = str(exc).removeprefix(f"{path}: ").removeprefix(f"{path}")
            out["refused"][reason.split(" (see ")[0][:100]] += 1
            continue
        out["read"][job.framework] += 1
        out["dataset"][str(job.options.get("dataset"))] += 1
        model = job.options.get("model")
        if isinstance(model, str):
            try:
                resolve_model(model)
            except TunecostError:
                out["missing model"][model] += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--errors", type=int, default=12, help="refusal reasons shown per folder")
    args = parser.parse_args()
    for folder in args.folders:
        counts = sweep(folder)
        read, refused = sum(counts["read"].values()), sum(counts["refused"].values())
        print(f"{folder}: {read + refused} files, {read} read ({dict(counts['read'])}), {refused} refused")
        for reason, n in counts["refused"].most_common(args.errors):
            print(f"  refused {n:4d}  {reason}")
        named = {k: v for k, v in counts["dataset"].items() if k != "None"}
        print(f"  catalog or file dataset named: {sum(named.values())} {named}")
        missing = counts["missing model"]
        print(f"  read, model not in the catalog: {sum(missing.values())} ({len(missing)} models)")


if __name__ == "__main__":
    main()
