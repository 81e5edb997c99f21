"""Time a cold `tunecost plan` (an empty simulation cache) in this tree and in another revision, side by side, and
check both answer the same: the steps read off batch lines (`tunecost.simulate.batch_line`) against tracing each.

    .venv/bin/python benchmarks/bench_cold_plan.py --base 4e5b071 [-- plan options]
"""

from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["--model", "mixtral-8x7b", "--method", "qlora", "--epochs", "1", "--dataset", "alpaca"]


def cold_plan(src: Path, options: list[str]) -> tuple[float, str]:
    """Seconds and stdout of `tunecost plan OPTIONS` run from the package under `src` with an empty cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TUNECOST_CACHE_DIR": cache, "PYTHONPATH": str(src)}
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", "from tunecost.cli.main import main; main()", "plan", *options],
            env=env,
            capture_output=True,
            text=True,
            cwd=src,
        )
        seconds = time.perf_counter() - start
    if out.returncode:
        sys.exit(f"tunecost plan failed under {src}: {out.stderr.strip()[-2000:]}")
    return seconds, out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the revision to compare with")
    parser.add_argument("options", nargs="*", help="plan options (default: %(default)s)", default=DEFAULT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tree:
        subprocess.run(
            ["git", "worktree", "add", "--detach", tree, args.base], cwd=ROOT, check=True, capture_output=True
        )
        try:
            base_s, base_out = cold_plan(Path(tree) / "src", args.options)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=ROOT, check=True, capture_output=True)
    here_s, here_out = cold_plan(ROOT / "src", args.options)
    print(f"command: tunecost plan {' '.join(args.options)} (cold: an empty simulation cache)")
    print(f"| tree | seconds |\n|---|---|\n| {args.base} | {base_s:.1f} |\n| this tree | {here_s:.1f} |")
    print(f"speed-up: {base_s / here_s:.2f}x; same answer: {'yes' if base_out == here_out else 'NO'}")
    if base_out != here_out:
        sys.stdout.writelines(
            difflib.unified_diff(base_out.splitlines(True), here_out.splitlines(True), args.base, "tree")
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
