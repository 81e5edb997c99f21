"""`tunecost profile --nproc-per-node N`: one point trained on N ranks with FSDP2 or DDP (see
`tunecost.profile.ranks`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunecost.cli.common import console, err_console, print_json, print_table, split_list
from tunecost.errors import TunecostError
from tunecost.units import BYTES_PER_GIB as _GIB


def _one(text: str | None, what: str, option: str, default: int) -> int:
    values = split_list(text, int, what)
    if len(values) > 1:
        raise TunecostError(f"{option}: --nproc-per-node profiles one point; give one value, got {text}")
    return values[0] if values else default


def run_rank_profile(setup: Any, options: dict[str, Any], out: Path) -> None:
    """Profile one point on `--nproc-per-node` ranks, add its records to `out/ranks.jsonl`, print or --json it."""
    from tunecost.limits import MAX_BATCH_SIZE, MAX_SEQ_LEN, MAX_STEPS, check_count
    from tunecost.profile.model_setup import resolve_profile_model
    from tunecost.profile.ranks import (
        check_rank_strategy,
        load_rank_profiles,
        profile_ranks,
        rank_point_id,
        save_rank_profiles,
    )

    nproc, strategy = options["nproc_per_node"], options["strategy"] or "fsdp2"
    check_rank_strategy(strategy, nproc, setup.method)
    resolve_profile_model(setup.model)  # an unknown model is an error here, not in every rank
    if options["dataset"] is not None:
        raise TunecostError("--dataset: --nproc-per-node trains on random tokens of --seq-len; leave --dataset out")
    top_k = _one(options["experts_per_token"], "experts per token", "--experts-per-token", 0) or None
    batch = _one(options["batch_sizes"], "batch size", "--batch-sizes", 1)
    seq = _one(options["seq_len"], "sequence length", "--seq-len", 128)
    check_count("--batch-sizes", batch, MAX_BATCH_SIZE)
    check_count("--seq-len", seq, MAX_SEQ_LEN)
    check_count("--steps", options["steps"], MAX_STEPS)
    import dataclasses

    setup = dataclasses.replace(setup, experts_per_token=top_k)
    point = rank_point_id(setup, strategy=strategy, nproc_per_node=nproc, batch_size=batch, seq_len=seq)
    done = load_rank_profiles(out)
    if point not in done:
        if not options["json_out"]:
            err_console.print(f"launching {nproc} ranks ({strategy}, {setup.device}); rank logs in {out}/rank-logs")
        profiles = profile_ranks(
            setup,
            nproc_per_node=nproc,
            strategy=strategy,
            batch_size=batch,
            seq_len=seq,
            steps=options["steps"],
            warmup_steps=options["warmup_steps"],
            log_dir=out / "rank-logs",
        )
        save_rank_profiles(out, point, profiles)
        done = load_rank_profiles(out)
    ranks = sorted(done[point], key=lambda r: r["rank"])
    if options["json_out"]:
        print_json({"point_id": point, "out_dir": str(out), "ranks": ranks})
        return
    _print_ranks(point, ranks)


def _gib(value: Any) -> str:
    return "-" if value is None else f"{value / _GIB:.2f}"


def _print_ranks(point: str, ranks: list[dict[str, Any]]) -> None:
    rows = []
    for r in ranks:
        comm = ", ".join(
            f"{op} {c['count']}x {c['bytes'] / 2**20:.1f} MiB" for op, c in sorted(r["collectives"].items())
        )
        memory = _gib(r["peak_allocated_bytes"]) if r["peak_allocated_bytes"] is not None else _gib(r["peak_rss_bytes"])
        rows.append([r["rank"], f"{r['median_step_seconds']:.3f}", memory, f"{r['comm_seconds']:.3f}", comm or "-"])
    first = ranks[0]
    slowest = next(r for r in ranks if r["slowest"])
    print_table(
        f"{point} on {first['device'].split(':')[0]} ({first['world_size']} ranks)",
        ["rank", "step s", "peak GiB", "comm s", "collectives per step"],
        rows,
        caption="step s: median step; peak: CUDA max allocated, or on CPU the process's peak RSS (interpreter "
        "included); comm s: NCCL kernel time (CUDA) or host time of the c10d calls (CPU, gloo)",
    )
    console.print(
        f"step (slowest rank, {slowest['rank']}): {slowest['median_step_seconds']:.3f} s; records: ranks.jsonl "
        f"(point {point}); a rerun with the same options skips the finished point"
    )
