"""`tunecost bench moe`: forward+backward time and peak memory of one MoE block per experts implementation."""

from __future__ import annotations

import os

import typer

from tunecost.cli.common import cli_errors, err_console, print_json, print_table, progress_bar, split_list

bench_app = typer.Typer(
    help="Micro-benchmarks (side by side in one run, ratios measured together).", no_args_is_help=True
)


def _mib(num_bytes: int) -> str:
    return f"{num_bytes / 2**20:.1f}"


def _ratio(value: float | None, suffix: str = "x") -> str:
    return "-" if value is None else f"{value:.2f}{suffix}"


@bench_app.command("moe")
@cli_errors
def bench_moe(
    tokens: int = typer.Option(None, "--tokens", help="Tokens through the block (default 2048)."),
    hidden: int = typer.Option(None, "--hidden", help="Hidden size H (default 512 on CPU, 4096 on CUDA)."),
    intermediate: int = typer.Option(None, "--intermediate", help="Expert size I (default 1792 CPU, 14336 CUDA)."),
    experts: int = typer.Option(8, "--experts", help="Number of experts E."),
    top_k: int = typer.Option(2, "--top-k", help="Experts per token (E = dense)."),
    rank: int = typer.Option(16, "--rank", help="LoRA rank on every expert projection and the router."),
    repeats: int = typer.Option(5, "--repeats", help="Timed rounds (median reported)."),
    warmup: int = typer.Option(1, "--warmup", help="Untimed rounds first."),
    impls: str = typer.Option(None, "--impls", help="Comma-separated subset of the implementations."),
    device: str = typer.Option(None, "--device", help="cpu or cuda (default: cuda if available)."),
    dtype: str = typer.Option(None, "--dtype", help="float32 | bfloat16 | float16 (default fp32 CPU, bf16 CUDA)."),
    threads: int = typer.Option(None, "--threads", help="torch CPU threads for the run (default: torch's)."),
    no_memory: bool = typer.Option(False, "--no-memory", help="Skip the peak-memory pass."),
    json_out: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
) -> None:
    """Time forward+backward of ONE Mixtral MoE block for each experts implementation, side by side.

    eager, grouped_mm: transformers' experts, full fine-tune of the block.

    peft-fused: PEFT LoRA on the fused experts and the router.

    qlora-linear4bit: per-expert bitsandbytes Linear4bit + LoRA (the paper's QLoRA stack).

    fast, fast-4bit: tunecost's experts (grouped GEMMs, LoRA on routed tokens only; nf4 weights).

    Opt-in via --impls: grouped_mm-frozen (experts frozen, no LoRA: the floor for LoRA on experts).
    On a CPU shared with other work, --threads 1 gives the steadiest numbers.
    """

    from tunecost.moe.bench import BENCH_IMPLS, bench_moe_layer

    chosen = split_list(impls, str, "implementation") or list(BENCH_IMPLS)
    with progress_bar(console=err_console, transient=True) as progress:
        task = progress.add_task("bench moe", total=1)

        def on_progress(done: int, total: int, label: str) -> None:
            progress.update(task, completed=done, total=total, description=label)

        rows = bench_moe_layer(
            tokens=tokens,
            hidden=hidden,
            intermediate=intermediate,
            experts=experts,
            top_k=top_k,
            rank=rank,
            repeats=repeats,
            warmup=warmup,
            impls=chosen,
            device=device,
            dtype=dtype,
            measure_memory=not no_memory,
            threads=threads,
            on_progress=on_progress,
        )
    if json_out:
        print_json(rows)
        return
    first = rows[0]
    load = ""
    if hasattr(os, "getloadavg"):
        load = f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (other work slows every row)"
    print_table(
        f"One MoE block, forward+backward: {first.tokens} tokens, H={first.hidden}, I={first.intermediate}, "
        f"E={first.experts}, top-{first.top_k}, {first.dtype} on {first.device}",
        [
            "impl",
            "trains",
            "fwd+bwd ms",
            "fwd ms",
            "vs peft-fused",
            "CPU ms",
            "CPU vs peft",
            "peak MiB",
            "weights MiB",
            "peak vs peft",
        ],
        [
            (
                r.impl,
                f"LoRA r{r.rank}" if r.trainable == "lora" else r.trainable,
                f"{r.ms_forward_backward:.1f}",
                f"{r.ms_forward:.1f}",
                _ratio(r.speedup_vs_peft_fused),
                f"{r.cpu_ms_forward_backward:.1f}",
                _ratio(r.cpu_speedup_vs_peft_fused),
                _mib(r.peak_bytes) if not no_memory else "-",
                _mib(r.weight_bytes),
                _ratio(r.peak_vs_peft_fused),
            )
            for r in rows
        ],
        caption=f"median of {first.repeats} round-robin repeats, {first.threads} torch thread(s); "
        f"'vs peft-fused' > 1 is faster{load}",
    )


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
