"""`tunecost profile --nproc-per-node N`: one point trained on N ranks with FSDP2 or DDP (see
`tunecost.profile.ranks`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunecost.cli.common import console, err_console, print_json, print_table
from tunecost.errors import TunecostError
from tunecost.profile.ranks import check_rank_strategy, profile_point
from tunecost.units import BYTES_PER_GIB as _GIB


def _one(values: tuple[int, ...] | list[int], option: str, default: int) -> int:
    if len(values) > 1:
        given = ",".join(map(str, values))
        raise TunecostError(f"{option}: --nproc-per-node profiles one point; give one value, got {given}")
    return values[0] if values else default


@dataclass(frozen=True)
class RankRun:
    """How `profile --nproc-per-node` runs its point: ranks, strategy, steps, and whether it prints a table."""

    nproc_per_node: int
    strategy: str
    steps: int
    warmup_steps: int
    quiet: bool = False  # --json: the records only


def run_rank_profile(
    setup: Any,
    run: RankRun,
    out: Path,
    *,
    top_ks: list[int],
    batch_sizes: tuple[int, ...],
    seq_lens: tuple[int, ...],
    dataset: str | None = None,
) -> None:
    """Profile one point on `--nproc-per-node` ranks (the values checked by `profile` as for a sweep), add its
    records to `out/ranks.jsonl`, print or --json it."""
    import dataclasses

    from tunecost.profile.model_setup import resolve_profile_model
    from tunecost.profile.sweep import DEFAULT_SEQ_LEN

    nproc, strategy = run.nproc_per_node, run.strategy
    check_rank_strategy(strategy, nproc, setup.method)
    resolve_profile_model(setup.model)  # an unknown model is an error here, not in every rank
    if dataset is not None:
        raise TunecostError("--dataset: --nproc-per-node trains on random tokens of --seq-len; leave --dataset out")
    top_k = _one(top_ks, "--experts-per-token", 0) or None
    batch = _one(batch_sizes, "--batch-sizes", 1)
    seq = _one(seq_lens, "--seq-len", DEFAULT_SEQ_LEN)

    def announce(_point: str) -> None:
        if not run.quiet:
            err_console.print(f"launching {nproc} ranks ({strategy}, {setup.device}); rank logs in {out}/rank-logs")

    point, ranks = profile_point(
        dataclasses.replace(setup, experts_per_token=top_k),
        out,
        strategy=strategy,
        nproc_per_node=nproc,
        batch_size=batch,
        seq_len=seq,
        steps=run.steps,
        warmup_steps=run.warmup_steps,
        on_launch=announce,
    )
    if run.quiet:
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
