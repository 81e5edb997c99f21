"""`tunecost bench moe`: forward+backward time and peak memory of one MoE block per experts implementation."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from tunecost.cli.common import cli_errors, print_json, print_table, progress_callback, split_list
from tunecost.cli.options import JsonOut, count_option, opt
from tunecost.limits import MAX_EXPERTS, MAX_HIDDEN, MAX_STEPS, MAX_THREADS, MAX_TOKENS


def _size(option: str, help: str, maximum: int = MAX_HIDDEN, minimum: int = 1) -> Any:
    return count_option(option, help, maximum, minimum)


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
    tokens: Annotated[int | None, _size("--tokens", "Tokens through the block (default 2048).", MAX_TOKENS)] = None,
    hidden: Annotated[int | None, _size("--hidden", "Hidden size H (default 512 CPU, 4096 CUDA).", MAX_HIDDEN)] = None,
    intermediate: Annotated[int | None, _size("--intermediate", "Expert size I (1792 CPU, 14336 CUDA).")] = None,
    experts: Annotated[int, _size("--experts", "Number of experts E.", MAX_EXPERTS)] = 8,
    top_k: Annotated[int, _size("--top-k", "Experts per token (E = dense).", MAX_EXPERTS)] = 2,
    rank: Annotated[int, _size("--rank", "LoRA rank on every expert projection and the router.")] = 16,
    repeats: Annotated[int, _size("--repeats", "Timed rounds (median reported).", MAX_STEPS)] = 5,
    warmup: Annotated[int, _size("--warmup", "Untimed rounds first.", MAX_STEPS, minimum=0)] = 1,
    impls: Annotated[str | None, opt("--impls", "Comma-separated subset of the implementations.")] = None,
    device: Annotated[str | None, opt("--device", "cpu or cuda (default: cuda if available).")] = None,
    dtype: Annotated[str | None, opt("--dtype", "float32 | bfloat16 | float16 (default fp32 CPU, bf16 CUDA).")] = None,
    threads: Annotated[int | None, _size("--threads", "torch CPU threads (default: torch's).", MAX_THREADS)] = None,
    no_memory: Annotated[bool, opt("--no-memory", "Skip the peak-memory pass.")] = False,
    json_out: JsonOut = False,
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
    with progress_callback("bench moe") as on_progress:
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
    _print_rows(rows, no_memory)


def _print_rows(rows: list, no_memory: bool) -> None:
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
