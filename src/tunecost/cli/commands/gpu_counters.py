"""`tunecost gpu-counters`: SM and DRAM utilization of the MoE kernels under Nsight Compute (Figs. 9, 10)."""

from __future__ import annotations

from pathlib import Path

import typer

from tunecost.cli.common import cli_errors, err_console, print_json, print_table, progress_bar, split_list


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


@cli_errors
def gpu_counters(
    out: Path = typer.Option(..., "--out", help="Folder for counters.jsonl, utilization.json and raw CSVs."),
    model: str = typer.Option("tiny-mixtral", "--model", help="tiny-mixtral, a local folder or a HF id."),
    method: str = typer.Option("qlora", "--method", help="full | lora | qlora"),
    experts_impl: str = typer.Option(
        None,
        "--experts-impl",
        help="Experts implementation (default: the method's; see `tunecost profile --help`).",
    ),
    experts_per_token: int = typer.Option(
        None,
        "--experts-per-token",
        help="Top-k: experts per token for this job (default: the model's; dense = the number of experts).",
    ),
    batch_sizes: str = typer.Option("1,32", "--batch-sizes", help="Comma-separated batch sizes."),
    seq_len: int = typer.Option(128, "--seq-len", help="Tokens per query (random ids)."),
    steps: int = typer.Option(2, "--steps", help="Profiled training steps per batch size."),
    warmup_steps: int = typer.Option(1, "--warmup-steps", help="Unprofiled steps first."),
    layers: str = typer.Option("0,1", "--layers", help="Decoder layers whose MoE block is profiled."),
    max_kernels: int = typer.Option(20000, "--max-kernels", help="At most this many kernels profiled."),
    ncu: str = typer.Option(None, "--ncu", help="Path of the ncu executable (default: found on PATH)."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Nsight Compute SM and DRAM utilization of the MoE layer's kernels, per class and batch size.

    A few training steps per batch size under `ncu --clock-control none`
    (clocks and settings are left as they are), only the MoE blocks of
    --layers (NVTX filter). Without ncu or counter permission, kernel
    durations come from torch.profiler instead.
    """

    from tunecost.profile.gpu_counters import GpuCountersJob, check_can_run, run_gpu_counters
    from tunecost.workload.job import FineTuneJob

    job = GpuCountersJob(
        job=FineTuneJob(model=model, method=method, experts_per_token=experts_per_token, seq_len=seq_len),  # type: ignore[arg-type]
        experts_impl=experts_impl,
        batch_sizes=tuple(split_list(batch_sizes, int, "batch size")),
        steps=steps,
        warmup_steps=warmup_steps,
        layers=tuple(split_list(layers, int, "layer")),
        max_kernels=max_kernels,
    )
    check_can_run(job)  # before the progress bar, so the error is the only line
    with progress_bar(console=err_console, transient=True) as progress:
        task = progress.add_task("gpu-counters", total=len(job.batch_sizes))

        def on_progress(done: int, total: int, label: str) -> None:
            progress.update(task, completed=done, total=total, description=label)

        result = run_gpu_counters(job, out, ncu_path=ncu, on_progress=on_progress)
    if json_out:
        print_json(
            {
                "source": result.source,
                "out_dir": result.out_dir,
                "notes": list(result.notes),
                "num_kernels": len(result.rows),
                "utilization": list(result.utilization),
            }
        )
        return
    print_table(
        f"MoE kernels of layers {layers}: time-weighted utilization ({result.source})",
        ["batch", "class", "kernels", "time ms", "share %", "SM %", "DRAM %"],
        [
            (
                u.batch_size,
                u.kernel_class,
                u.num_kernels,
                f"{u.duration_s * 1e3:.3f}",
                f"{u.time_share * 100:.1f}",
                _pct(u.sm_pct),
                _pct(u.dram_pct),
            )
            for u in result.utilization
        ],
        caption=f"rows: {result.out_dir}/counters.jsonl",
    )
    for note in result.notes:
        err_console.print(f"note: {note}")


def register(app: typer.Typer) -> None:
    app.command("gpu-counters")(gpu_counters)
