"""Start-up times of the commands, side by side with `python -c pass`: one run, rounds interleaved, medians.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_startup.py [--repeats 5] [--cold-repeats 3] [--markdown]

Each round runs every case once in a fresh interpreter, so load on the machine weighs on all alike; CPU seconds
(user + system) vary less with that load than wall seconds. Commands use a cache folder of their own, never the
user's: warm cases after one untimed run, `estimate (cold)` an empty folder each time (`COST`, `ESTIMATE` below).
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tunecost

TUNECOST = ["-m", "tunecost.cli.main"]
ESTIMATE = [
    *(["estimate", "--model", "mistralai/Mixtral-8x7B-v0.1", "--method", "qlora"]),
    *(["--gpu", "A40,A100-80GB,H100", "--dataset", "math_14k", "--epochs", "10"]),
]
COST = ["cost", "--queries", "15000", "--epochs", "10", "--throughput", "1.01", "--usd-per-hour", "0.79"]
# (name, interpreter arguments, cold: an empty cache folder each run)
CASES = [
    ("python -c pass", ["-c", "pass"], False),
    ('python -c "import tunecost"', ["-c", "import tunecost"], False),
    ("tunecost --version", [*TUNECOST, "--version"], False),
    ("tunecost gpus", [*TUNECOST, "gpus"], False),
    ("tunecost models", [*TUNECOST, "models"], False),
    ("tunecost prices", [*TUNECOST, "prices"], False),
    ("tunecost cost", [*TUNECOST, *COST], False),
    ("tunecost estimate (warm)", [*TUNECOST, *ESTIMATE], False),
    ("tunecost estimate (cold)", [*TUNECOST, *ESTIMATE], True),
]


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_seconds(args: list[str], cache: Path) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of `python ARGS` with `cache` as its cache folder."""
    env = {**os.environ, "TUNECOST_CACHE_DIR": str(cache)}
    source = str(Path(tunecost.__file__).parents[1])  # the tunecost this script imported
    env["PYTHONPATH"] = os.pathsep.join([source, *filter(None, [os.environ.get("PYTHONPATH")])])
    cpu, start = _children_cpu_seconds(), time.perf_counter()
    subprocess.run([sys.executable, *args], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start, _children_cpu_seconds() - cpu


def measure(repeats: int, cold_repeats: int, work: Path) -> dict[str, list[tuple[float, float]]]:
    warm = work / "warm"
    for _, args, cold in CASES:  # fills the warm cache; excluded from the timings
        if not cold:
            run_seconds(args, warm)
    seconds: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in CASES}
    for round_ in range(repeats):
        for name, args, cold in CASES:
            if cold and round_ >= cold_repeats:
                continue
            cache = Path(tempfile.mkdtemp(dir=work)) if cold else warm
            seconds[name].append(run_seconds(args, cache))
    return seconds


def table(seconds: dict[str, list[tuple[float, float]]], markdown: bool) -> list[str]:
    """Per case: the median wall seconds, its ratio to `python -c pass`'s, the median CPU seconds and the runs."""
    rows = [
        (name, statistics.median(w for w, _ in s), statistics.median(c for _, c in s), len(s))
        for name, s in seconds.items()
        if s
    ]
    base = rows[0][1]
    if markdown:
        out = ["| command | wall s (median) | x python -c pass | CPU s |", "|---|---|---|---|"]
        return out + [f"| `{name}` | {wall:.2f} | {wall / base:.1f} | {cpu:.2f} |" for name, wall, cpu, _ in rows]
    width = max(len(name) for name, *_ in rows)
    out = [f"{'command':<{width}}  wall s  x python -c pass  CPU s  runs"]
    return out + [f"{n:<{width}}  {w:6.3f}  {w / base:16.1f}  {c:5.2f}  {k:4d}" for n, w, c, k in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each case")
    parser.add_argument("--cold-repeats", type=int, default=3, help="timed runs of `estimate` on an empty cache")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        load_before = os.getloadavg()[0]
        seconds = measure(options.repeats, options.cold_repeats, Path(work))
        load_after = os.getloadavg()[0]
    print(f"{datetime.date.today()}, {os.cpu_count()} CPUs, load average {load_before:.1f} -> {load_after:.1f}")
    print("\n".join(table(seconds, options.markdown)))


if __name__ == "__main__":
    main()
