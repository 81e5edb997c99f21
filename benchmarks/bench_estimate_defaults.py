"""The defaults a user acts on, measured: one batch search across the commands, and an answer that comes first.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_estimate_defaults.py [--skip-timing]

1. For 20 jobs, the largest batch from `memory --gpu`, `max-batch --device cpu`, `estimate` and `estimate --gpus 1`
   side by side, the borderline batch, and what the device gives at the largest batch x (1 + margin) against the
   card: every row must agree and stay within the card.
2. `estimate --model Qwen/Qwen2.5-32B --method lora --gpu all --gpus auto --queries 50000 --seq-len 1024 --epochs 1`
   timed twice (cold caches where they were cold, then warm) and its printed lines counted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.cli.main import app

JOBS = [  # (model, method, tokens per query, GPU)
    ("qwen2.5-0.5b", "full", 1024, "RTX-4090"),
    ("qwen2.5-0.5b", "lora", 2048, "RTX-4090"),
    ("qwen2.5-1.5b", "qlora", 2048, "RTX-4090"),
    ("llama-3.2-1b", "lora", 2048, "RTX-4090"),
    ("smollm2-135m", "full", 2048, "RTX-4060"),
    ("llama-3-8b", "qlora", 512, "H100"),
    ("llama-3-8b", "qlora", 2048, "RTX-4090"),
    ("mistral-7b-v0.1", "lora", 4096, "A100-40GB"),
    ("mistral-7b-v0.1", "qlora", 1024, "L4"),
    ("qwen2.5-7b", "lora", 1024, "A100-80GB"),
    ("llama-3.2-3b", "full", 2048, "A100-80GB"),
    ("phi-3-mini-4k", "lora", 2048, "A40"),
    ("gemma-2-2b", "lora", 1024, "RTX-4090"),
    ("mixtral-8x7b", "qlora", 512, "A40"),
    ("mixtral-8x7b", "qlora", 1024, "H100"),
    ("olmoe-1b-7b", "lora", 1024, "A100-80GB"),
    ("qwen3-8b", "qlora", 2048, "L40S"),
    ("tinyllama-1.1b", "full", 1024, "A100-40GB"),
    ("deepseek-r1-distill-qwen-1.5b", "full", 1024, "H100"),
    ("qwen2.5-14b", "qlora", 1024, "A100-40GB"),
]
QWEN_ANSWER = [
    *(["estimate", "--model", "Qwen/Qwen2.5-32B", "--method", "lora", "--gpu", "all", "--gpus", "auto"]),
    *(["--queries", "50000", "--seq-len", "1024", "--epochs", "1"]),
]


def _json(runner: CliRunner, args: list[str]):
    result = runner.invoke(app, [*args, "--json"])
    if result.exit_code != 0:
        return {"error": (result.stderr or result.output).strip().splitlines()[-1]}
    return json.loads(result.stdout)


def consistency() -> bool:
    runner = CliRunner()
    print(
        f"{'model':<30} {'method':<6} {'tokens':>6} {'gpu':<10} {'memory':>6} {'max-b':>6} {'estim':>6} "
        f"{'--gpus1':>7} {'border':>6} {'need x m / card GB':>20}"
    )
    agree = True
    for model, method, seq_len, gpu in JOBS:
        job = ["--model", model, "--method", method, "--seq-len", str(seq_len), "--gpu", gpu]
        memory = _json(runner, ["memory", *job])
        if "error" in memory:
            print(f"{model:<30} {method:<6} {seq_len:>6} {gpu:<10} {memory['error']}")
            continue
        max_batch = _json(runner, ["max-batch", *job, "--device", "cpu"])
        single = _json(runner, ["estimate", *job, "--queries", "1000", "--epochs", "1"])[0]
        (setup,) = _json(runner, ["estimate", *job, "--queries", "1000", "--epochs", "1", "--gpus", "1"])["setups"]
        best = memory["max_batch"]
        answers = (
            memory["max_batch_size"],
            max_batch["max_batch_size"],
            single["max_batch_size"],
            setup["micro_batch"],
        )
        card = resolve_gpu_name(gpu).gpu.usable_memory_bytes
        within = best["need_bytes"] * (1 + best["margin_fraction"]) <= card
        agree &= len(set(answers)) == 1 and within
        print(
            f"{model:<30} {method:<6} {seq_len:>6} {gpu:<10} {answers[0]:>6} {answers[1]:>6} {answers[2]:>6} "
            f"{answers[3]:>7} {best['borderline_batch_size']:>6} "
            f"{best['need_bytes'] * (1 + best['margin_fraction']) / 1e9:>9.1f} / {card / 1e9:<8.1f}"
            + ("" if len(set(answers)) == 1 and within else "  DIFFERS")
        )
    print("every command agrees, every answer within the card" if agree else "SOME ROWS DIFFER")
    return agree


def timing() -> None:
    cli = str(Path(sys.executable).with_name("tunecost"))
    for label in ("first", "again (warm)"):
        start = time.perf_counter()
        out = subprocess.run([cli, *QWEN_ANSWER], capture_output=True, text=True, check=True)
        seconds = time.perf_counter() - start
        lines = out.stdout.splitlines()
        print(f"{label}: {seconds:.1f} s, {len(lines)} lines; {lines[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-timing", action="store_true")
    args = parser.parse_args()
    print(f"# bench_estimate_defaults {datetime.date.today().isoformat()}")
    ok = consistency()
    if not args.skip_timing:
        print("\ntunecost " + " ".join(QWEN_ANSWER))
        timing()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
