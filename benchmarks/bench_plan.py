"""Time `tunecost plan` on the issue's search: Llama-2-70B, every catalog GPU, 1-64 GPUs, every strategy and
offload, all three methods; cold (an empty simulation cache) and cached, with the setups evaluated and pruned.

    .venv/bin/python benchmarks/bench_plan.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMAND = [
    "plan", "--model", "meta-llama/Llama-2-70b-hf", "--gpu", "all", "--max-gpus", "64",
    "--queries", "10000", "--epochs", "1", "--seq-len", "2048", "--json",
]  # fmt: skip
TUNECOST = str(Path(sys.executable).with_name("tunecost"))


def run(cache: str) -> tuple[float, dict]:
    start = time.perf_counter()
    out = subprocess.run(
        [TUNECOST, *COMMAND], env={**os.environ, "TUNECOST_CACHE_DIR": cache}, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    if out.returncode:
        sys.exit(f"tunecost plan failed: {out.stderr.strip()}")
    return seconds, json.loads(out.stdout)["plan"]


def main() -> None:
    with tempfile.TemporaryDirectory() as cache:
        cold, plan = run(cache)
        cached, _ = run(cache)
    best = plan["recommended"]
    where = f"{best['method']} on {best['setup']['plan']['num_gpus']} x {best['setup']['gpu']['name']}" if best else "-"
    print(f"command: tunecost {' '.join(COMMAND)}")
    print(f"setups evaluated (timed and priced): {plan['evaluated']}; pruned by memory first: {plan['pruned']}")
    print(f"recommended: {where}")
    print("| run | seconds |\n|---|---|")
    print(f"| cold (empty simulation cache) | {cold:.1f} |\n| cached | {cached:.1f} |")


if __name__ == "__main__":
    main()
