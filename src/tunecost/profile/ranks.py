"""Profile fine-tuning on several ranks with the real engines, launched as `torchrun` launches them.

Sources and derivations: docs/profiling.md, section `tunecost.profile.ranks`.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tunecost.errors import TunecostError, unknown_name_error
from tunecost.limits import MAX_NPROC_PER_NODE, check_count
from tunecost.results.records import add_records, read_records, record
from tunecost.results.schema import record_path
from tunecost.workload.parallel import check_fsdp2_method

RANK_STRATEGIES = ("fsdp2", "ddp")


@dataclass(frozen=True, kw_only=True)
class RankProfile:
    """What one rank measured."""

    rank: int
    world_size: int
    strategy: str
    device: str
    batch_size: int  # per rank
    seq_len: int
    step_seconds: list[float]
    peak_allocated_bytes: int | None  # CUDA only
    peak_reserved_bytes: int | None  # CUDA only
    peak_rss_bytes: int | None  # CPU only: the whole process
    comm_seconds: float  # one step, see docs/profiling.md
    collectives: dict[str, dict[str, int]] = field(default_factory=dict)  # op -> {"count", "bytes"}
    trainable_params: int = 0
    total_params: int = 0  # before sharding

    @property
    def median_step_seconds(self) -> float:
        return statistics.median(self.step_seconds)


def check_rank_strategy(strategy: str, nproc_per_node: int, method: str) -> None:
    """What `profile_ranks` refuses before launching anything."""
    if strategy not in RANK_STRATEGIES:
        raise unknown_name_error("--strategy", strategy, RANK_STRATEGIES)
    check_count("--nproc-per-node", nproc_per_node, MAX_NPROC_PER_NODE)
    if strategy == "fsdp2":
        check_fsdp2_method(method, alternatives="--method lora or full, or --strategy ddp")


def slowest_rank(profiles: list[RankProfile]) -> RankProfile:
    """The rank whose median step is longest: the step of the whole job."""
    if not profiles:
        raise TunecostError("no rank profiles")
    return max(profiles, key=lambda p: p.median_step_seconds)


class _CollectiveCounter:
    """A dispatch mode that counts c10d collectives and their bytes (nccl-tests' sizes)."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        from tunecost.distributed.recorder import buffer_nbytes, collective_kind

        counts: dict[str, dict[str, int]] = {}

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kind = collective_kind(func)
                if kind is not None:
                    nbytes = buffer_nbytes(kind, args)[0]
                    entry = counts.setdefault(kind, {"count": 0, "bytes": 0})
                    entry["count"] += 1
                    entry["bytes"] += int(nbytes)
                return func(*args, **(kwargs or {}))

        self.counts = counts
        self.mode = Mode()


def _comm_seconds(prof: Any, cuda: bool) -> float:
    """Communication time in one profiled step (see docs/profiling.md)."""
    total_us = 0.0
    for event in prof.events():
        name = event.name
        if cuda:
            if "nccl" in name.lower() and getattr(event, "device_type", None) is not None and event.device_time > 0:
                total_us += event.device_time
        elif name.startswith("c10d::"):
            total_us += event.cpu_time
    return total_us / 1e6


def _wrap(model: Any, strategy: str, device: str) -> Any:
    import torch.distributed as dist

    if strategy == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh

        from tunecost.distributed.sharded_step import shard_model

        mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (dist.get_world_size(),))
        shard_model(model, mesh, reshard_after_forward=True)
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [int(device.split(":")[1])] if device.startswith("cuda:") else None
    return DistributedDataParallel(model, device_ids=ids)


def _rank_main(setup: Any, strategy: str, batch_size: int, seq_len: int, steps: int, warmup_steps: int) -> RankProfile:
    """One rank's work (runs in a process the launcher started)."""
    import dataclasses
    import resource

    import torch
    import torch.distributed as dist

    from tunecost.profile.inputs import SyntheticSource
    from tunecost.profile.loop import make_optimizer, train_step
    from tunecost.profile.model_setup import build_training_model
    from tunecost.profile.timers import make_clock

    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    cuda = setup.device.startswith("cuda")
    device = f"cuda:{local}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(local)
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        prepared = build_training_model(dataclasses.replace(setup, device=device))
        model = _wrap(prepared.model, strategy, device)
        optimizer = make_optimizer(model)
        vocab = int(prepared.spec.vocab_size)
        source = SyntheticSource(vocab_size=vocab, seq_len=seq_len, num_queries=batch_size, seed=setup.seed + rank)
        batch = source.longest_batch(batch_size).to(device)
        clock = make_clock(device)
        for _ in range(warmup_steps):
            train_step(model, optimizer, batch, clock, device=device)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times = [train_step(model, optimizer, batch, clock, device=device).wall_seconds for _ in range(steps)]
        counter = _CollectiveCounter()
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        with torch.profiler.profile(activities=activities) as prof, counter.mode:
            train_step(model, optimizer, batch, clock, device=device)
        dist.barrier()
        return RankProfile(
            rank=rank,
            world_size=world,
            strategy=strategy,
            device=device,
            batch_size=batch_size,
            seq_len=seq_len,
            step_seconds=times,
            peak_allocated_bytes=int(torch.cuda.max_memory_allocated()) if cuda else None,
            peak_reserved_bytes=int(torch.cuda.max_memory_reserved()) if cuda else None,
            peak_rss_bytes=None if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            comm_seconds=_comm_seconds(prof, cuda),
            collectives=counter.counts,
            trainable_params=prepared.trainable_params,
            total_params=prepared.total_params,
        )
    finally:
        dist.destroy_process_group()


def profile_ranks(
    setup: Any,
    *,
    nproc_per_node: int,
    log_dir: str | os.PathLike[str] | None = None,
    strategy: str = "fsdp2",
    batch_size: int = 1,
    seq_len: int = 128,
    steps: int = 3,
    warmup_steps: int = 1,
) -> list[RankProfile]:
    """Launch `nproc_per_node` ranks on this machine (torchrun's launcher) and return their profiles by rank.
    Each rank's stdout and stderr go to files under `log_dir` (kept), or to this process's when None."""
    from tunecost.distributed.launch import launch_local_ranks

    check_rank_strategy(strategy, nproc_per_node, setup.method)
    if setup.device.startswith("cuda"):
        import torch

        if torch.cuda.device_count() < nproc_per_node:
            raise TunecostError(
                f"--nproc-per-node {nproc_per_node} needs as many GPUs; this machine has {torch.cuda.device_count()}"
            )
    args = (setup, strategy, batch_size, seq_len, steps, warmup_steps)
    return launch_local_ranks(_rank_main, args, nproc=nproc_per_node, log_dir=log_dir)


def rank_point_id(setup: Any, *, strategy: str, nproc_per_node: int, batch_size: int, seq_len: int) -> str:
    """The record key of a multi-rank point: what was trained, on how many ranks, how."""
    top_k = "model" if setup.experts_per_token is None else setup.experts_per_token
    name = os.path.basename(os.path.normpath(setup.model))
    return f"{name}-{setup.method}-k{top_k}-{strategy}-n{nproc_per_node}-bs{batch_size}-seq{seq_len}"


RANK_KEY = ("kind", "point_id", "rank")


def save_rank_profiles(
    out_dir: str | os.PathLike[str], point_id: str, profiles: list[RankProfile]
) -> list[dict[str, Any]]:
    """Add one point's rank profiles to `out_dir/ranks.jsonl` (one `rank` record per rank, atomically; the point
    is finished once its records exist: a rerun skips it) and return those records. The slowest rank is marked
    (`slowest`)."""
    slowest = slowest_rank(profiles).rank
    rows = [
        record(
            "rank",
            point_id=point_id,
            **asdict(p),
            median_step_seconds=p.median_step_seconds,
            slowest=p.rank == slowest,
        )
        for p in profiles
    ]
    add_records(record_path(out_dir, "rank"), rows, key=RANK_KEY)
    return rows


def load_rank_profiles(out_dir: str | os.PathLike[str]) -> dict[str, list[dict[str, Any]]]:
    """Every finished multi-rank point in a run folder (see `save_rank_profiles`): point id -> its rank records."""
    path = record_path(out_dir, "rank")
    points: dict[str, list[dict[str, Any]]] = {}
    for row in read_records(path) if path.is_file() else []:
        points.setdefault(str(row.get("point_id")), []).append(row)
    return points


def profile_point(
    setup: Any,
    out_dir: str | os.PathLike[str],
    *,
    strategy: str,
    nproc_per_node: int,
    batch_size: int,
    seq_len: int,
    steps: int = 3,
    warmup_steps: int = 1,
    on_launch: Any = None,
) -> tuple[str, list[dict[str, Any]]]:
    """One point on `nproc_per_node` ranks, resumable: its records from `out_dir/ranks.jsonl` when finished, else
    measured (`profile_ranks`, rank logs in `out_dir/rank-logs`) and added. Returns the point id and its records by
    rank; `on_launch(point_id)` is called before ranks are launched."""
    point = rank_point_id(
        setup, strategy=strategy, nproc_per_node=nproc_per_node, batch_size=batch_size, seq_len=seq_len
    )
    rows = load_rank_profiles(out_dir).get(point)
    if rows is None:
        if on_launch is not None:
            on_launch(point)
        profiles = profile_ranks(
            setup,
            nproc_per_node=nproc_per_node,
            strategy=strategy,
            batch_size=batch_size,
            seq_len=seq_len,
            steps=steps,
            warmup_steps=warmup_steps,
            log_dir=Path(out_dir) / "rank-logs",
        )
        rows = save_rank_profiles(out_dir, point, profiles)
    return point, sorted(rows, key=lambda r: r["rank"])
