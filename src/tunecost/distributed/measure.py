"""Measure the same FSDP2 step on real ranks: `world_size` CPU processes on a gloo group over 127.0.0.1, each
running `sharded_step.record_rank_step` on real tensors (tiny models only: real fp32 weights on the CPU)."""

from __future__ import annotations

import os
import socket

from tunecost.distributed.sharded_step import RankStep
from tunecost.workload.job import FineTuneJob


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world_size: int, port: int, job: FineTuneJob, strategy: str, results) -> None:
    import torch
    import torch.distributed as dist

    from tunecost.distributed.sharded_step import prepare_fsdp_rank, record_rank_step
    from tunecost.simulate.step import make_batch

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, init_method=f"tcp://127.0.0.1:{port}")
    try:
        prepared = prepare_fsdp_rank(job, strategy, real=True, seed=0)
        vocab = int(prepared.model.config.vocab_size)
        batch = make_batch(vocab, job.batch_size, job.worst_case_seq_len, None, seed=rank)
        results.put(record_rank_step(prepared, batch, strategy=strategy, granule_bytes=1))
    finally:
        dist.destroy_process_group()


def measure_fsdp_ranks(job: FineTuneJob, *, world_size: int = 2, strategy: str = "fsdp2") -> list[RankStep]:
    """Run one recorded FSDP2 step on `world_size` real gloo ranks; their RankSteps by rank."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(
        _worker, args=(world_size, free_port(), job, strategy, results), nprocs=world_size, start_method="spawn"
    )
    steps = [results.get() for _ in range(world_size)]
    return sorted(steps, key=lambda s: s.rank)
