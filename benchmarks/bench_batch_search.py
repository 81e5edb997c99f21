"""Needs asked by the largest-batch search (`tunecost.simulate.batch.search_boundary`), this tree against another
revision's, side by side, on random stepped-affine need curves (an affine need rounded up to the allocator's
blocks, as simulated peaks are near a boundary). Each need stands for one step simulation (~1 s on fake tensors).

    PYTHONPATH=src python benchmarks/bench_batch_search.py --base HEAD~1 [--cases 3000] [--seed 1]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path

from tunecost.simulate.batch import search_boundary

ROOT = Path(__file__).resolve().parents[1]


def _base_search(rev: str) -> Callable:
    source = subprocess.run(
        ["git", "show", f"{rev}:src/tunecost/simulate/batch.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    namespace: dict = {}
    exec(compile(source, f"{rev}:batch.py", "exec"), namespace)
    return namespace["search_boundary"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="git revision whose search to compare with")
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    searches = {args.base: _base_search(args.base), "this tree": search_boundary}
    asked: dict[str, list[int]] = {name: [] for name in searches}
    rng = random.Random(args.seed)
    for _ in range(args.cases):
        fixed, per_query = rng.randint(10**8, 10**11), int(10 ** rng.uniform(4, 9))  # bytes; bytes per query
        step = rng.choice([1, 2**21, 20 * 2**20])  # no rounding, 2 MiB, 20 MiB blocks
        budget, first = rng.randint(1, 10**11), rng.choice([1, 1, 2, 4, 8, 16])

        def need(b: int, fixed: int = fixed, per_query: int = per_query, step: int = step) -> int:
            return -(-(fixed + per_query * b) // step) * step

        found = {name: search(need, budget, first=first, max_batch=10**6) for name, search in searches.items()}
        if len({answer for answer, _ in found.values()}) != 1:
            raise SystemExit(f"the searches disagree: {found} (fixed {fixed}, per query {per_query}, step {step})")
        for name, (_, needs) in found.items():
            asked[name].append(len(needs))
    print(f"{args.cases} stepped-affine need curves (seed {args.seed}), the same answer from both; needs asked:")
    for name, counts in asked.items():
        print(
            f"  {name:>12}: total {sum(counts):6d}  mean {statistics.fmean(counts):5.2f}  "
            f"95th pct {sorted(counts)[int(0.95 * len(counts))]:3d}  max {max(counts):3d}"
        )


if __name__ == "__main__":
    main()
