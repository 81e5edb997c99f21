"""Time a Liger `estimate` with its loops sampled (`tunecost.simulate.loops`) and run whole, side by side, each in a
fresh process with an empty simulation cache, and check both print the same answer.

    .venv/bin/python benchmarks/bench_loops.py [-- estimate options]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from tunecost.simulate.loops import MIN_COUNT

DEFAULT = ["--model", "qwen2.5-0.5b", "--method", "lora", "--gpu", "RTX3080-10GB", "--seq-len", "1024"]
DEFAULT += ["--queries", "1000", "--epochs", "1", "--liger-kernel"]
RUN = "import sys; from tunecost.simulate import loops; loops.MIN_COUNT = int(sys.argv.pop(1)); from tunecost.cli.main import main; main()"  # noqa: E501


def estimate(min_count: int, options: list[str]) -> tuple[float, str]:
    """Seconds and --json output of `tunecost estimate OPTIONS` with loops of `min_count` or more sampled."""
    command = [sys.executable, "-c", RUN, str(min_count), "estimate", *options, "--json"]
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        out = subprocess.run(
            command, env={**os.environ, "TUNECOST_CACHE_DIR": cache}, stdout=subprocess.PIPE, text=True, check=True
        )
        return time.perf_counter() - start, out.stdout


def main() -> None:
    options = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else DEFAULT
    sampled, answer = estimate(MIN_COUNT, options)
    whole, reference = estimate(10**9, options)
    print(f"tunecost estimate {' '.join(options)}")
    print(f"loops sampled: {sampled:6.1f} s")
    print(f"loops whole:   {whole:6.1f} s  ({whole / sampled:.2f}x)")
    print("same answer" if answer == reference else "ANSWERS DIFFER")
    sys.exit(answer != reference)


if __name__ == "__main__":
    main()
