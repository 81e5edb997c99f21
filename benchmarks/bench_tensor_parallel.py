"""Per-rank memory and collectives of a tensor-parallel step (PyTorch's DTensor TP, torchtitan's Llama plan): the
fake-process-group simulation of one rank against 2 real CPU ranks on gloo (same step, same recorder), on the tiny
Llama and the tiny Mixtral of tests/distributed; then one TP rank of Llama-2-70B and of Mixtral-8x7B at full width
(fake tensors). Every number printed here is measured in this run (about 1-2 minutes on 2 cores).

Run: PYTHONPATH=src .venv/bin/python benchmarks/bench_tensor_parallel.py
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from tunecost.distributed.tensor_parallel import simulate_tp_rank, tp_strategy
from tunecost.distributed.tp_measure import measure_tp_ranks
from tunecost.distributed.tp_single_step import tp_single_gpu_step
from tunecost.workload.job import FineTuneJob, LoraConfig

# the job tests/distributed/test_tensor_parallel.py checks
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "distributed"))
from tiny_jobs import tiny_job

# (method, sequence parallel, loss parallel); LoRA r 8 on attention and MLP with activation checkpointing
LAYOUTS = [
    ("full", False, True),
    ("full", True, True),
    ("full", False, False),
    ("full", True, False),
    ("lora", True, True),
]


def _collectives(step) -> str:
    return "; ".join(f"{op} {phase} {n} x {b:,} B" for (op, phase), (n, b) in sorted(step.collective_totals().items()))


def _signature(step) -> list:
    return [(c.op, c.phase, c.nbytes, c.dtype, c.group_size) for c in step.collectives]


def tiny_table() -> None:
    lora = LoraConfig(rank=8, targets=("attention", "mlp"))
    jobs = {
        "full": dataclasses.replace(tiny_job("tiny-llama-2l", "full", lora), seq_len=64),
        "lora": dataclasses.replace(tiny_job("tiny-llama-2l", "lora", lora, gradient_checkpointing=True), seq_len=64),
    }
    print("tiny Llama (2 layers, hidden 64, vocabulary 512), fp32, AdamW, batch 2 x 64 tokens, tp 2")
    _compare(jobs, LAYOUTS)
    moe_lora = LoraConfig(rank=8, targets=("attention", "experts", "router"))
    moe_jobs = {
        "full": dataclasses.replace(tiny_job("tiny-mixtral-2l", "full", moe_lora), seq_len=64),
        "lora": dataclasses.replace(tiny_job("tiny-mixtral-2l", "lora", moe_lora), seq_len=64),
    }
    print("\ntiny Mixtral (2 layers, hidden 64, 8 experts of 128, top-2), fp32, AdamW, batch 2 x 64 tokens, tp 2;")
    print("LoRA r 8 on attention, experts and router")
    _compare(moe_jobs, [("full", False, True), ("full", True, True), ("lora", True, True)])


def _compare(jobs: dict[str, FineTuneJob], layouts: list[tuple[str, bool, bool]]) -> None:
    print(f"{'layout':<27} {'simulated':>10} {'rank 0':>10} {'rank 1':>10} {'error':>7} {'collectives':<12} loss")
    for method, sp, lp in layouts:
        job = jobs[method]
        start = time.perf_counter()
        sim = simulate_tp_rank(job, tp=2, sequence_parallel=sp, granule_bytes=1, loss_parallel=lp)
        ranks = measure_tp_ranks(job, tp=2, sequence_parallel=sp, loss_parallel=lp)
        err = max(abs(sim.peak_bytes - r.step.peak_bytes) / r.step.peak_bytes for r in ranks)
        same = all(_signature(r.step) == _signature(sim) for r in ranks)
        losses = ", ".join(f"{r.loss:.6f}" for r in ranks)
        print(
            f"{method + ' ' + tp_strategy(2, sp, lp):<27} {sim.peak_bytes:>10,} {ranks[0].step.peak_bytes:>10,} "
            f"{ranks[1].step.peak_bytes:>10,} {100 * err:>6.3f}% {'equal' if same else 'DIFFERENT':<12} "
            f"{losses} (unsharded {ranks[0].unsharded_loss:.6f}; {time.perf_counter() - start:.0f} s)"
        )
        print(f"    simulated peak ({sim.peak_phase}): {sim.breakdown_bytes}")
        print(f"    collectives: {_collectives(sim)}")


def full_width(model: str, title: str) -> None:
    job = FineTuneJob(model=model, method="full", batch_size=1, seq_len=4096, gradient_checkpointing=True)
    print(f"\n{title}, full fine-tuning, bf16, AdamW, 1 x 4096 tokens, gradient checkpointing: one rank (GiB)")
    print(f"{'layout':<10} {'layer weights':>13} {'weights':>8} {'activations':>11} {'fwd/bwd peak':>12} {'peak':>8}")
    for tp, sp in ((1, False), (8, False), (8, True)):
        start = time.perf_counter()
        step = tp_single_gpu_step(job, tp=tp, sequence_parallel=sp, use_cache=False)
        seconds = time.perf_counter() - start
        totals = {k: sum(v.values()) for k, v in step.segments.items()}
        fwd_bwd = max(v for k, v in totals.items() if not k.startswith("optimizer"))
        print(
            f"{tp_strategy(tp, sp):<10} {step.layer_weight_bytes / 2**30:>13.3f} {step.weight_bytes / 2**30:>8.2f} "
            f"{step.segments['forward:post'].get('activations', 0) / 2**30:>11.2f} {fwd_bwd / 2**30:>12.2f} "
            f"{max(totals.values()) / 2**30:>8.2f}   (traced in {seconds:.1f} s)"
        )


if __name__ == "__main__":
    tiny_table()
    full_width("meta-llama/Llama-2-70b-hf", "Llama-2-70B")
    full_width("mistralai/Mixtral-8x7B-v0.1", "Mixtral-8x7B")
