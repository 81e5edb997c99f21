"""`tunecost gpu-counters`: SM and DRAM utilization of the MoE kernels under Nsight Compute (Figs. 9, 10)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, cast

import typer

from tunecost.cli.common import (
    cli_errors,
    err_console,
    print_json,
    print_table,
    progress_callback,
    split_list,
)
from tunecost.cli.options import (
    ExpertsImpl,
    ExpertsPerToken,
    JsonOut,
    MethodName,
    ModelName,
    SeqLen,
    WarmupSteps,
    count_option,
    opt,
)
from tunecost.limits import MAX_PROFILED_KERNELS, MAX_STEPS
from tunecost.workload.job import FineTuneJob, Method


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


# The utilization table: each column's heading and its cell of one (batch size, kernel class) row.
UTILIZATION_COLUMNS: dict[str, Callable[[Any], object]] = {
    "batch": lambda u: u.batch_size,
    "class": lambda u: u.kernel_class,
    "kernels": lambda u: u.num_kernels,
    "time ms": lambda u: f"{u.duration_s * 1e3:.3f}",
    "share %": lambda u: f"{u.time_share * 100:.1f}",
    "SM %": lambda u: _pct(u.sm_pct),
    "DRAM %": lambda u: _pct(u.dram_pct),
}


@cli_errors
def gpu_counters(
    out: Annotated[Path, opt("--out", "Folder for counters.jsonl, utilization.json and raw CSVs.")],
    model: ModelName = "tiny-mixtral",
    method: MethodName = "qlora",
    experts_impl: ExpertsImpl = None,
    experts_per_token: ExpertsPerToken = None,
    batch_sizes: Annotated[str, opt("--batch-sizes", "Comma-separated batch sizes.")] = "1,32",
    seq_len: SeqLen = 128,
    steps: Annotated[int, count_option("--steps", "Profiled training steps per batch size.", MAX_STEPS)] = 2,
    warmup_steps: WarmupSteps = 1,
    layers: Annotated[str, opt("--layers", "Decoder layers whose MoE block is profiled.")] = "0,1",
    max_kernels: Annotated[
        int, count_option("--max-kernels", "At most this many kernels.", MAX_PROFILED_KERNELS)
    ] = 20000,
    ncu: Annotated[str | None, opt("--ncu", "Path of the ncu executable (default: found on PATH).")] = None,
    json_out: JsonOut = False,
) -> None:
    """Nsight Compute SM and DRAM utilization of the MoE layer's kernels, per class and batch size.

    A few training steps per batch size under `ncu --clock-control none`
    (clocks and settings are left as they are), only the MoE blocks of
    --layers (NVTX filter). Without ncu or counter permission, kernel
    durations come from torch.profiler instead.
    """

    from tunecost.profile.gpu_counters import GpuCountersJob, check_can_run, run_gpu_counters

    job = GpuCountersJob(
        job=FineTuneJob(
            model=model, method=cast("Method", method), experts_per_token=experts_per_token, seq_len=seq_len
        ),
        experts_impl=experts_impl,
        batch_sizes=tuple(split_list(batch_sizes, int, "batch size")),
        steps=steps,
        warmup_steps=warmup_steps,
        layers=tuple(split_list(layers, int, "layer")),
        max_kernels=max_kernels,
    )
    check_can_run(job)  # before the progress bar, so the error is the only line
    with progress_callback("gpu-counters") as on_progress:
        result = run_gpu_counters(job, out, ncu_path=ncu, on_progress=on_progress)
    if json_out:
        summary = {key: getattr(result, key) for key in ("source", "out_dir", "notes")}
        print_json({**summary, "num_kernels": len(result.rows), "utilization": result.utilization})
        return
    print_table(
        f"MoE kernels of layers {layers}: time-weighted utilization ({result.source})",
        list(UTILIZATION_COLUMNS),
        [[cell(u) for cell in UTILIZATION_COLUMNS.values()] for u in result.utilization],
        caption=f"rows: {result.out_dir}/counters.jsonl",
    )
    for note in result.notes:
        err_console.print(f"note: {note}")


def register(app: typer.Typer) -> None:
    app.command("gpu-counters")(gpu_counters)
