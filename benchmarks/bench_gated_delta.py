"""Qwen3.5 and Qwen3-Next jobs: the simulated peak with flash-linear-attention's and causal-conv1d's kernels (what
tunecost assumes) side by side with transformers' PyTorch fallbacks (a machine without those packages), with and
without activation checkpointing (with it, the DeltaNet's internals live during one layer's recompute only), the
largest batch that fits an 80 GB H100 with the kernels, and the estimated throughput and cost of 10,000 queries there.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_gated_delta.py

Nothing here is a measurement: the peaks are the step simulator's (docs/memory-model.md, section
`tunecost.simulate.gated_delta`), the throughput the calibrated model's counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from unittest import mock

GIB = 2**30
# (model, method, tokens per query, batch)
JOBS = [
    ("Qwen/Qwen3.5-9B", "lora", 4096, 1),
    ("Qwen/Qwen3.5-35B-A3B", "qlora", 4096, 1),
    ("Qwen/Qwen3-Next-80B-A3B-Instruct", "qlora", 2048, 1),
]


def _peak_gib(model: str, method: str, seq_len: int, batch: int, *, kernels: bool, checkpointing: bool) -> float:
    from tunecost.simulate import pool, simulate_step
    from tunecost.workload.job import FineTuneJob, LoraConfig

    lora = LoraConfig(rank=16, targets=("attention", "mlp"))
    job = FineTuneJob(
        model=model,
        method=method,
        lora=lora,
        batch_size=batch,
        seq_len=seq_len,
        gradient_checkpointing=checkpointing,
    )
    pool.clear()  # a prepared model is kept per job: build each variant anew
    if kernels:
        return simulate_step(job, use_cache=False).peak_bytes / GIB
    with mock.patch("tunecost.simulate.prepare.install_gated_delta_kernels", lambda model: None):
        return simulate_step(job, use_cache=False).peak_bytes / GIB


def _estimate(model: str, method: str, seq_len: int) -> dict:
    args = ["estimate", "--model", model, "--method", method, "--lora-targets", "attention,mlp", "--gpu", "H100"]
    args += ["--seq-len", str(seq_len), "--queries", "10000", "--epochs", "1", "--stack", "hf-peft", "--json"]
    out = subprocess.run([sys.executable, "-m", "tunecost.cli.main", *args], check=True, capture_output=True)
    rows = json.loads(out.stdout)
    return min(rows, key=lambda row: row["usd"])


def main() -> None:
    print("peak GiB with the kernels / with transformers' PyTorch fallbacks, with and without checkpointing")
    print("| job | checkpointing | no checkpointing | largest batch (H100) | queries/s | $ |")
    print("|---|---|---|---|---|---|")
    for model, method, seq_len, batch in JOBS:
        cells = []
        for checkpointing in (True, False):
            on, off = (
                _peak_gib(model, method, seq_len, batch, kernels=k, checkpointing=checkpointing) for k in (True, False)
            )
            cells.append(f"{on:.2f} / {off:.2f}")
        row = _estimate(model, method, seq_len)
        print(
            f"| {model} {method} {batch} x {seq_len} | {cells[0]} | {cells[1]} "
            f"| {row['max_batch_size']} | {row['queries_per_s']:.3g} | {row['usd']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
