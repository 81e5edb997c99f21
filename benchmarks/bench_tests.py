"""Time the test suite per folder: one pytest run per test folder (or per path given), one after another, on one
process each; prints wall and CPU seconds (the CPU time of pytest and the ranks it launches, steadier than wall time
on a shared machine) and the test count, so the split between `make test` and CI's long tests can be rechecked.

    PYTHONPATH=src python benchmarks/bench_tests.py [PATH ...] [-m "not gpu and not long"] [--durations 5]
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
SKIP = {"fixtures", "helpers", "__pycache__"}


def default_paths() -> list[str]:
    """Each folder under tests/ that holds tests, then the test files at its top."""
    folders = sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name not in SKIP)
    files = sorted(TESTS.glob("test_*.py"))
    return [str(p.relative_to(REPO)) for p in (*folders, *files)]


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_path(path: str, markers: str, durations: int) -> tuple[float, float, str, str]:
    """Wall and CPU seconds of one pytest run over `path`, its summary line and its slowest tests."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", markers, path]
    if durations:
        command.append(f"--durations={durations}")
    cpu, start = children_cpu_seconds(), time.perf_counter()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - start, children_cpu_seconds() - cpu
    lines = result.stdout.strip().splitlines()
    summary = lines[-1].strip("= ") if lines else f"exit code {result.returncode}"
    slowest = [line for line in lines if re.match(r"^\d+\.\d+s (call|setup|teardown) ", line)]
    return wall, cpu, re.sub(r" in [\d.]+s.*", "", summary), "\n".join(f"    {line}" for line in slowest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="Test folders or files (default: each folder under tests/).")
    parser.add_argument("-m", dest="markers", default="not gpu and not long", help="Marker expression (`make test`'s).")
    parser.add_argument("--durations", type=int, default=0, help="Also print the N slowest tests of each path.")
    options = parser.parse_args()
    total_wall = total_cpu = 0.0
    print(f"{'path':<40} {'wall s':>8} {'cpu s':>8}  tests")
    for path in options.paths or default_paths():
        wall, cpu, summary, slowest = time_path(path, options.markers, options.durations)
        total_wall, total_cpu = total_wall + wall, total_cpu + cpu
        print(f"{path:<40} {wall:8.1f} {cpu:8.1f}  {summary}", flush=True)
        if slowest:
            print(slowest, flush=True)
    print(f"{'total':<40} {total_wall:8.1f} {total_cpu:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
