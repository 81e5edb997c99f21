"""`tunecost profile` (measure MoE fine-tuning: throughput, stages, layers, kernels, expert load, memory) and
`tunecost max-batch` (largest batch that fits: measured on a GPU, simulated on a CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from tunecost.cli.common import cli_errors, console, err_console, print_json, print_table, progress_bar, split_list
from tunecost.errors import TunecostError
from tunecost.profile.threads import prepare_cpu_threads
from tunecost.units import BYTES_PER_GIB as _GIB


def _device(device: str) -> str:
    if device != "auto":
        from tunecost.workload.device import check_device

        check_device(device)  # a typo is an error, not "auto"
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _batch_sizes(text: str, steps: int, warmup_steps: int) -> tuple[int, ...]:
    """--batch-sizes, each within what a GPU could hold, checked before any query is built."""
    from tunecost.errors import TunecostError
    from tunecost.limits import MAX_BATCH_SIZE, MAX_STEPS, check_count

    sizes = tuple(split_list(text, int, "batch size"))
    for size in sizes:
        check_count("--batch-sizes", size, MAX_BATCH_SIZE)
    for option, value in (("--steps", steps), ("--warmup-steps", warmup_steps)):
        if value > MAX_STEPS:  # the lower bounds are the sweep's own checks
            raise TunecostError(f"{option} must be at most {MAX_STEPS}, got {value}")
    return sizes


def _inputs(
    seq_len: str | None, dataset: str | None, tokenizer: str, template: str, max_length: int, dataset_limit: int | None
) -> Any:
    from tunecost.errors import TunecostError
    from tunecost.limits import MAX_QUERIES, MAX_SEQ_LEN, check_count
    from tunecost.profile.sweep import InputSpec
    from tunecost.workload.templates import template_by_name

    seq_lens = tuple(split_list(seq_len, int, "sequence length"))
    for n in seq_lens:
        check_count("--seq-len", n, MAX_SEQ_LEN)
    check_count("--max-length", max_length, MAX_SEQ_LEN)
    check_count("--dataset-limit", dataset_limit, MAX_QUERIES)
    if dataset is not None and not dataset.strip():
        raise TunecostError("--dataset is empty: give a dataset name or file")
    template_by_name(template)  # an unknown name is an error also where it would go unused
    if dataset is None:
        unused = [
            o for o, given in (("--tokenizer", tokenizer != "mistral"), ("--dataset-limit", dataset_limit)) if given
        ]
        if unused:
            raise TunecostError(f"{unused[0]} applies to --dataset queries; give --dataset or leave it out")
    return InputSpec(
        seq_lens=seq_lens,
        dataset=dataset,
        tokenizer=tokenizer,
        template=template,
        max_length=max_length,
        dataset_limit=dataset_limit,
    )


def _fmt(value: Any, spec: str = ".3g", scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


@cli_errors
def profile(
    model: str = typer.Option(
        "tiny-mixtral",
        "--model",
        help="Catalog model (tiny-mixtral, mixtral-8x7b, ...), local folder or cached hub id.",
    ),
    method: str = typer.Option("qlora", "--method", help="full | lora | qlora"),
    experts_per_token: str = typer.Option(
        None,
        "--experts-per-token",
        help="Top-k values to sweep, a comma list, e.g. 2,8 (sparse top-2 vs dense Mixtral); default: the model's.",
    ),
    batch_sizes: str = typer.Option("1", "--batch-sizes", help="Comma list, e.g. 1,2,4."),
    seq_len: str = typer.Option(
        None,
        "--seq-len",
        help="Comma list of sequence lengths of random-token queries "
        "(default 128, the paper's); 64,128,256,512,1024 is the §IV-B6 study.",
    ),
    dataset: str = typer.Option(None, "--dataset", help="Train on a dataset instead (name or file; tokenized)."),
    steps: int = typer.Option(3, "--steps", help="Timed steps per point."),
    out: Path = typer.Option(..., "--out", help="Run folder for the records (resumable: rerun to continue)."),
    experts_impl: str = typer.Option(
        None,
        "--experts-impl",
        help="stock | peft-fused | qlora-linear4bit | fast | "
        "fast-4bit (default: stock for full, peft-fused for lora, qlora-linear4bit "
        "for qlora).",
    ),
    no_overhead: bool = typer.Option(
        False,
        "--no-instrumentation-overhead",
        help="Skip the plain-vs-instrumented comparison (one instrumented step for the layer breakdown).",
    ),
    no_kernels: bool = typer.Option(False, "--no-kernels", help="Skip the torch.profiler kernel breakdown."),
    warmup_steps: int = typer.Option(1, "--warmup-steps", help="Untimed steps before timing."),
    device: str = typer.Option("auto", "--device", help="cpu | cuda | auto (cuda when available)."),
    random_weights: bool = typer.Option(
        False, "--random-weights", help="Random weights from the config (full-size models without downloaded weights)."
    ),
    no_checkpointing: bool = typer.Option(
        False,
        "--no-gradient-checkpointing",
        help="Train without activation checkpointing (the paper's Mixtral runs used it).",
    ),
    num_layers: int = typer.Option(None, "--num-layers", help="Keep only the first N decoder layers."),
    tokenizer: str = typer.Option("mistral", "--tokenizer", help="Tokenizer for --dataset."),
    template: str = typer.Option("mistral", "--template", help="Prompt template for --dataset."),
    max_length: int = typer.Option(1024, "--max-length", help="Cut dataset queries to this many tokens."),
    dataset_limit: int = typer.Option(None, "--dataset-limit", help="Use only the first N dataset queries."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Profile MoE fine-tuning over experts-per-token x sequence lengths x batch sizes; writes tidy records."""
    from tunecost.outputs import check_output_folder

    check_output_folder(out)
    prepare_cpu_threads(device)
    from tunecost.profile.model_setup import ModelSetup
    from tunecost.profile.point import MeasureOptions
    from tunecost.profile.sweep import SweepSpec

    spec = SweepSpec(
        setup=ModelSetup(
            model=model,
            method=method,
            experts_impl=experts_impl,
            device=_device(device),
            random_weights=random_weights,
            gradient_checkpointing=not no_checkpointing,
            num_layers=num_layers,
        ),
        experts_per_token=tuple(split_list(experts_per_token, int, "experts per token")),
        batch_sizes=_batch_sizes(batch_sizes, steps, warmup_steps),
        inputs=_inputs(seq_len, dataset, tokenizer, template, max_length, dataset_limit),
        options=MeasureOptions(
            steps=steps, warmup_steps=warmup_steps, instrumentation_overhead=not no_overhead, kernels=not no_kernels
        ),
    )
    finished = [0]
    try:
        result = _run_with_progress(spec, out, json_out, finished)
    except KeyboardInterrupt:
        err_console.print(
            f"interrupted: {finished[0]} finished point(s) are kept in {out}; rerun the same "
            "command to resume (finished points are skipped)"
        )
        raise typer.Exit(code=130) from None
    if json_out:
        print_json(
            {
                "out_dir": str(result.out_dir),
                "measured": list(result.measured),
                "skipped": list(result.skipped),
                "oom": list(result.oom),
                "points": list(result.table),
            }
        )
        return
    _print_summary(result)


def _run_with_progress(spec: Any, out: Path, quiet: bool, finished: list[int]) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from tunecost.profile.sweep import run_sweep

    def count(_: Any) -> None:
        finished[0] += 1

    if quiet:
        return run_sweep(spec, out, on_point=count)
    with progress_bar(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as progress:
        points = progress.add_task("points", total=None)
        steps = progress.add_task("steps", total=None, visible=False)

        def on_progress(done: int, total: int, label: str) -> None:
            progress.update(points, completed=done, total=total, description=f"points ({label})")

        def on_step(done: int, total: int, label: str) -> None:
            progress.update(steps, completed=done, total=total, description=label, visible=True)

        return run_sweep(spec, out, on_progress=on_progress, on_step=on_step, on_point=count)


def _short(value: Any) -> str:
    """3 significant digits with a k/M suffix: tables stay narrow enough for an 80-column terminal."""
    if value is None:
        return "-"
    v = float(value)
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}"
    return f"{v:.3g}"


def _stage_split(r: dict[str, Any]) -> str:
    parts = [r.get(f"{s}_seconds") for s in ("forward", "backward", "optimizer")]
    values = [p for p in parts if p is not None]
    total = sum(values)
    if not total or len(values) != len(parts):
        return "-"
    return "/".join(f"{100 * p / total:.0f}" for p in values)


def _print_summary(result: Any) -> None:
    rows, loads = [], []
    for r in result.table:
        where = str(r["seq_len"]) if r.get("seq_len") else str(r.get("dataset"))
        if r["status"] != "done":
            rows.append([r["experts_per_token"], r["batch_size"], where, r["status"].upper()] + ["-"] * 6)
            continue
        rows.append(
            [
                r["experts_per_token"],
                r["batch_size"],
                where,
                _short(r.get("queries_per_s")),
                _short(r.get("tokens_per_s")),
                _short(r.get("step_seconds")),
                _stage_split(r),
                _fmt(r.get("moe_share"), ".0%"),
                _fmt(r.get("peak_bytes"), ".2f", 1 / _GIB),
                _fmt(r.get("overhead_ratio"), ".2f"),
            ]
        )
        loads.append(
            [
                r["experts_per_token"],
                r["batch_size"],
                where,
                _short(r.get("load_variance_before")),
                _short(r.get("load_variance_after")),
            ]
        )
    first = result.table[0] if result.table else {}
    print_table(
        f"{first.get('model')} {first.get('method')} ({first.get('experts_impl')}) on {first.get('device')}",
        ["k", "bs", "seq", "q/s", "tok/s", "step s", "f/b/o %", "MoE", "GiB", "ovh"],
        rows,
        caption="k: experts per token; step s: median step; f/b/o: forward/backward/optimizer share; "
        "MoE: router + experts share of layer time; GiB: peak memory; ovh: instrumented / plain",
    )
    if loads:
        print_table("Tokens-per-expert variance (mean over layers)", ["k", "bs", "seq", "before", "after"], loads)
    console.print(
        f"measured {len(result.measured)} point(s), {len(result.skipped)} already finished"
        + (f", {len(result.oom)} out of memory (recorded as a boundary)" if result.oom else "")
    )
    console.print(
        f"records: {result.out_dir}/ (meta.json, points, throughput, stages, layers, kernels, "
        "expert_load, memory, overhead .jsonl)"
    )


@cli_errors
def max_batch(
    model: str = typer.Option("tiny-mixtral", "--model", help="Catalog model, local folder or cached hub id."),
    method: str = typer.Option("qlora", "--method", help="full | lora | qlora"),
    experts_per_token: int = typer.Option(
        None,
        "--experts-per-token",
        help="Top-k: experts per token for this job (default: the model's; dense = the number of experts).",
    ),
    seq_len: int = typer.Option(None, "--seq-len", help="Tokens per query (default 128 unless --dataset)."),
    dataset: str = typer.Option(None, "--dataset", help="Probe with the dataset's longest queries."),
    gpu: str = typer.Option(None, "--gpu", help="Search against this catalog GPU's memory."),
    gpu_memory_gb: float = typer.Option(
        None, "--gpu-memory-gb", help="Search against this much memory, in GB (10^9 bytes, as datasheets)."
    ),
    gpu_memory_gib: float = typer.Option(
        None, "--gpu-memory-gib", help="Search against this much memory, in GiB (2^30 bytes, as CUDA reports)."
    ),
    device: str = typer.Option(
        "auto", "--device", help="cuda: measured search; cpu: simulated (auto: cuda if available)."
    ),
    experts_impl: str = typer.Option(None, "--experts-impl", help="Experts implementation (see tunecost profile)."),
    random_weights: bool = typer.Option(False, "--random-weights", help="Random weights from the config."),
    no_checkpointing: bool = typer.Option(False, "--no-gradient-checkpointing", help="No activation checkpointing."),
    limit: int = typer.Option(4096, "--limit", help="Largest batch size tried."),
    tokenizer: str = typer.Option("mistral", "--tokenizer", help="Tokenizer for --dataset."),
    template: str = typer.Option("mistral", "--template", help="Prompt template for --dataset."),
    max_length: int = typer.Option(1024, "--max-length", help="Cut dataset queries to this many tokens."),
    out: Path = typer.Option(None, "--out", help="Also append the result to OUT/max_batch.jsonl."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Largest batch size that fits (paper Table III): grow then bisect; a found OOM is the measured boundary."""
    if out is not None:
        from tunecost.outputs import check_output_folder

        check_output_folder(out)
        if (Path(out) / "max_batch.jsonl").is_dir():
            raise TunecostError(f"--out {str(out)!r}: max_batch.jsonl there is a folder, not a file")
    prepare_cpu_threads(device)
    from tunecost.profile.maxbatch import find_max_batch_size, max_batch_row
    from tunecost.profile.model_setup import ModelSetup
    from tunecost.units import memory_bytes_from_options

    gpu_name = None
    memory_bytes = memory_bytes_from_options(gpu_memory_gb=gpu_memory_gb, gpu_memory_gib=gpu_memory_gib)
    if gpu is not None and memory_bytes is not None:
        raise TunecostError("give --gpu or --gpu-memory-gb/--gpu-memory-gib, not both")
    if gpu is not None:
        from tunecost.catalog.gpus import resolve_gpu_name

        g = resolve_gpu_name(gpu).gpu
        memory_bytes, gpu_name = g.memory_bytes, g.name
    setup = ModelSetup(
        model=model,
        method=method,
        experts_per_token=experts_per_token,
        experts_impl=experts_impl,
        device=_device(device),
        random_weights=random_weights,
        gradient_checkpointing=not no_checkpointing,
    )
    inputs = _inputs(None if seq_len is None else str(seq_len), dataset, tokenizer, template, max_length, None)

    def on_probe(p: Any) -> None:
        if not json_out:
            err_console.print(
                f"  batch {p.batch_size}: {'fits' if p.fits else 'does not fit'}"
                + (f" ({p.peak_bytes / _GIB:.2f} GiB)" if p.peak_bytes else "")
            )

    result = find_max_batch_size(setup, inputs, memory_bytes=memory_bytes, limit=limit, on_probe=on_probe)
    row = max_batch_row(result, setup, inputs, gpu=gpu_name)
    if out is not None:
        from tunecost.io import append_jsonl

        append_jsonl(Path(out) / "max_batch.jsonl", row)
    if json_out:
        print_json(row)
        return
    budget = f"{result.memory_bytes / _GIB:.1f} GiB" + (f" ({gpu_name})" if gpu_name else "")
    if result.max_batch_size == 0:
        b = result.boundary
        console.print(
            f"[bold]nothing fits[/bold]: batch size 1 at {result.seq_len} tokens per query needs more "
            f"than {budget}"
            + (f" ({b.detail})" if b and b.detail else "")
            + (f"; peak {b.peak_bytes / _GIB:.2f} GiB" if b and b.peak_bytes else "")
        )
    else:
        edge = result.boundary
        console.print(
            f"max batch size: [bold]{result.max_batch_size}[/bold] at {result.seq_len} tokens per query "
            f"in {budget} ({result.source}; "
            + (f"batch {edge.batch_size} does not fit" if edge else f"stopped at --limit {limit}")
            + ")"
        )
    if out is not None:
        console.print(f"record: {Path(out) / 'max_batch.jsonl'}")


def register(app: typer.Typer) -> None:
    app.command("profile")(profile)
    app.command("max-batch")(max_batch)
