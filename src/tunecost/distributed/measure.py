"""Measure the same FSDP2 step on real ranks: `world_size` CPU processes (started by `distributed.launch`, as
torchrun starts them) on a gloo group over 127.0.0.1, each running `sharded_step.record_rank_step` on real tensors
(tiny models only: real fp32 weights on the CPU).

Sources and derivations: docs/multi-gpu.md, section `tunecost.distributed.measure`.
"""

from __future__ import annotations

from tunecost.distributed.launch import launch_local_ranks
from tunecost.distributed.sharded_step import RankStep, prepare_fsdp_rank, record_rank_step
from tunecost.simulate.prepare import build_prepared
from tunecost.simulate.step import make_batch, run_step
from tunecost.workload.job import FineTuneJob

SERIAL_GLOO = "tunecost_serial_gloo"  # gloo with a single worker thread (see docs/multi-gpu.md)


def _serial_gloo(store, rank: int, world_size: int, timeout):
    from torch.distributed import ProcessGroupGloo

    options = ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # the C++ options: threads, devices
    options._devices = [ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    options._threads = 1  # gloo's default is 2 per device; one thread runs the queued collectives in order
    options._timeout = timeout
    return ProcessGroupGloo(store, rank, world_size, options)


def _init_serial_gloo() -> None:
    import torch.distributed as dist

    if not hasattr(dist.Backend, SERIAL_GLOO.upper()):
        dist.Backend.register_backend(SERIAL_GLOO, _serial_gloo, devices=["cpu"])
    dist.init_process_group(SERIAL_GLOO)


def _release_collective(group) -> None:
    """Return once the gloo worker has released the collective that just completed: a one-element all-reduce
    queued behind it on the same single worker thread, run outside any dispatch mode so that the step's recorder
    does not see it. Not a barrier: gloo's barrier keeps weak references to the works in progress, and a work's
    tensors live until its last weak reference goes too (c10::intrusive_ptr), i.e. until the barrier is freed."""
    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        dist.all_reduce(torch.zeros(1), group=group)


def _release_after_collectives(model) -> None:
    """Make every FSDP2 unit of `model` wait for gloo to release each all-gather and reduce-scatter
    (FSDP2's `set_custom_all_gather` / `set_custom_reduce_scatter`, with the default buffers)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    class ReleasedAllGather(DefaultAllGather):
        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            work = super().__call__(output_tensor, input_tensor, group, async_op)
            if not async_op:
                _release_collective(group)
            return work

    class ReleasedReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            work = super().__call__(output_tensor, input_tensor, group, op, async_op)
            if not async_op:
                _release_collective(group)
            return work

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_all_gather(ReleasedAllGather())
            module.set_custom_reduce_scatter(ReleasedReduceScatter())


def _worker(job: FineTuneJob, strategy: str) -> RankStep:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    _init_serial_gloo()
    try:
        prepared = prepare_fsdp_rank(job, strategy, real=True, seed=0)
        _release_after_collectives(prepared.model)
        vocab = int(prepared.model.config.vocab_size)
        batch = make_batch(vocab, job.batch_size, job.worst_case_seq_len, None, seed=dist.get_rank())
        step = record_rank_step(prepared, batch, strategy=strategy, granule_bytes=1)
        del prepared
        _leave_together(dist)
        return step
    finally:
        dist.destroy_process_group()


def _leave_together(dist) -> None:
    """Wait for every rank, then free this rank's model before the group goes: a rank that tears gloo down while
    another still talks to it, or a DDP reducer that outlives its group, can abort the process at exit."""
    import gc

    dist.barrier()
    gc.collect()


def measure_fsdp_ranks(job: FineTuneJob, *, world_size: int = 2, strategy: str = "fsdp2") -> list[RankStep]:
    """Run one recorded FSDP2 step on `world_size` real gloo ranks; their RankSteps by rank."""
    return launch_local_ranks(_worker, (job, strategy), nproc=world_size)


def _ddp_worker(job: FineTuneJob) -> list[int]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        prepared = build_prepared(job, num_units=None, real=True, seed=0)
        vocab = int(prepared.spec.vocab_size)
        prepared.model = DistributedDataParallel(prepared.model)
        batch = make_batch(vocab, job.batch_size, job.worst_case_seq_len, None, seed=dist.get_rank())
        for _ in range(3):  # the reducer rebuilds its buckets in ready order after the first step; the
            run_step(prepared, batch)  # logging data reports them once later steps have run
        data = prepared.model._get_ddp_logging_data()
        sizes = str(data.get("rebuilt_bucket_sizes", ""))
        del prepared, data
        _leave_together(dist)
        return [int(s) for s in sizes.split(",") if s.strip()]
    finally:
        dist.destroy_process_group()


def measure_ddp_buckets(job: FineTuneJob, *, world_size: int = 2) -> list[int]:
    """DDP's own gradient bucket sizes (bytes, rebuilt after the first step) on `world_size` gloo ranks."""
    return launch_local_ranks(_ddp_worker, (job,), nproc=world_size)[0]
