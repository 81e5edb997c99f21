"""Per-rank memory derived from the single-GPU simulated step (`distributed.rank_memory`) against the FSDP2 step
simulated in a fake process group (`distributed.sharded_step.simulate_fsdp_rank`, PyTorch's real `fully_shard`).
Tiny models by default (about a minute on 2 cores); `--full-size` adds Mixtral-8x7B LoRA on 8 ranks (the fake
run of the full model takes about a minute).

Run: PYTHONPATH=src .venv/bin/python benchmarks/bench_rank_memory.py [--full-size]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tunecost.distributed.rank_memory import rank_memory, single_gpu_step
from tunecost.distributed.sharded_step import simulate_fsdp_rank
from tunecost.workload.job import FineTuneJob, LoraConfig
from tunecost.workload.parallel import ParallelPlan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "distributed"))
from tiny_jobs import tiny_job

STRATEGIES = ("fsdp2", "fsdp2-shard-grad-op")


def compare(label: str, job: FineTuneJob, world_sizes: tuple[int, ...], granule_bytes: int) -> None:
    step = single_gpu_step(job, granule_bytes=granule_bytes)
    for n in world_sizes:
        for strategy in STRATEGIES:
            derived = rank_memory(step, job, ParallelPlan(num_gpus=n, gpus_per_node=n, strategy=strategy))
            fake = simulate_fsdp_rank(job, world_size=n, strategy=strategy, granule_bytes=granule_bytes)
            error = 100.0 * (derived.peak_bytes - fake.peak_bytes) / fake.peak_bytes
            print(f"| {label} | {n} | {strategy} | {derived.peak_bytes:,} | {fake.peak_bytes:,} | {error:+.1f} % |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--full-size", action="store_true", help="also Mixtral-8x7B LoRA (bf16) on 8 ranks")
    args = parser.parse_args()
    print("| job | ranks | strategy | derived peak bytes | fake FSDP2 rank peak bytes | derived - fake |")
    print("|---|---|---|---|---|---|")
    lora = LoraConfig(rank=8, targets=("attention",))
    for config in ("tiny-mixtral-2l", "tiny-llama-2l"):
        for method in ("full", "lora"):
            compare(f"{config} {method}", tiny_job(config, method, lora), (2, 4), granule_bytes=1)
    if args.full_size:
        job = FineTuneJob(model="mixtral-8x7b", method="lora")
        compare("mixtral-8x7b lora (bf16, 1 x 512 tokens)", job, (8,), granule_bytes=512)


if __name__ == "__main__":
    main()
