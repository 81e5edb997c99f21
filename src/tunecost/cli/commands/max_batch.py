"""`tunecost max-batch`: the largest batch that fits (measured on a GPU, simulated on a CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tunecost.cli import options as cli
from tunecost.cli.commands.profile import inputs_spec, model_setup
from tunecost.cli.common import cli_errors, console, err_console, print_json
from tunecost.cli.jobconfig import ConfigFiles
from tunecost.errors import TunecostError
from tunecost.io import append_jsonl
from tunecost.profile.threads import prepare_cpu_threads
from tunecost.units import BYTES_PER_GIB as _GIB
from tunecost.units import memory_bytes_from_options
from tunecost.workload.job import default_gradient_checkpointing


@cli_errors
def max_batch(
    model: cli.ModelName = "tiny-mixtral",
    method: cli.MethodName = "qlora",
    experts_per_token: cli.ExpertsPerToken = None,
    seq_len: cli.SeqLen = None,
    dataset: Annotated[str | None, cli.opt("--dataset", "Probe with the dataset's longest queries.")] = None,
    gpu: Annotated[str | None, cli.opt("--gpu", "Search against this catalog GPU's memory.")] = None,
    gpu_memory_gb: cli.GpuMemoryGb = None,
    gpu_memory_gib: cli.GpuMemoryGib = None,
    device: Annotated[
        str, cli.opt("--device", "cuda: measured search; cpu: simulated (auto: cuda if available).")
    ] = "auto",
    experts_impl: cli.ExpertsImpl = None,
    random_weights: cli.RandomWeights = False,
    gradient_checkpointing: cli.GradientCheckpointing = None,
    lora_rank: cli.LoraRank = cli.DEFAULT_LORA_RANK,
    lora_alpha: cli.LoraAlpha = cli.DEFAULT_LORA_ALPHA,
    limit: Annotated[int, cli.opt("--limit", "Largest batch size tried.")] = 4096,
    tokenizer: cli.Tokenizer = "mistral",
    template: cli.Template = "mistral",
    max_length: cli.MaxLength = 1024,  # with --seq-len too, --seq-len (the job's cutoff) is the length
    out: Annotated[Path | None, cli.opt("--out", "Also append the result to OUT/max_batch.jsonl.")] = None,
    config: ConfigFiles = None,
    json_out: cli.JsonOut = False,
) -> None:
    """Largest batch size that fits (paper Table III): grow then bisect; a found OOM is the measured boundary."""
    options = dict(locals())
    checkpointing = default_gradient_checkpointing(method) if gradient_checkpointing is None else gradient_checkpointing
    options["no_checkpointing"] = not checkpointing
    if out is not None:
        from tunecost.outputs import check_output_folder

        check_output_folder(out)
        if (Path(out) / "max_batch.jsonl").is_dir():
            raise TunecostError(f"--out {str(out)!r}: max_batch.jsonl there is a folder, not a file")
    prepare_cpu_threads(device)
    from tunecost.profile.maxbatch import catalog_gpu_budget, find_max_batch_size, max_batch_row

    gpu_name = None
    memory_bytes = memory_bytes_from_options(gpu_memory_gb=gpu_memory_gb, gpu_memory_gib=gpu_memory_gib)
    if gpu is not None and memory_bytes is not None:
        raise TunecostError("give --gpu or --gpu-memory-gb/--gpu-memory-gib, not both")
    setup = model_setup(options)
    if gpu is not None:
        from tunecost.catalog.gpus import resolve_gpu_name

        g = resolve_gpu_name(gpu).gpu
        memory_bytes, gpu_name = catalog_gpu_budget(g, setup.device), g.name
    if seq_len is None and dataset is None:
        seq_len = cli.DEFAULT_SEQ_LEN
    if seq_len is not None and dataset is not None:  # the job's cutoff: the dataset's queries cut at it
        max_length, seq_len = seq_len, None
    inputs = inputs_spec(None if seq_len is None else str(seq_len), dataset, tokenizer, template, max_length, None)

    def on_probe(p: Any) -> None:
        if not json_out:
            err_console.print(
                f"  batch {p.batch_size}: {'fits' if p.fits else 'does not fit'}"
                + (f" ({p.peak_bytes / _GIB:.2f} GiB)" if p.peak_bytes else "")
            )

    result = find_max_batch_size(setup, inputs, memory_bytes=memory_bytes, limit=limit, on_probe=on_probe)
    row = max_batch_row(result, setup, inputs, gpu=gpu_name)
    if out is not None:
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
        margin = f", {100 * result.margin_fraction:g} % safety margin" if result.margin_fraction else ""
        console.print(
            f"max batch size: [bold]{result.max_batch_size}[/bold] at {result.seq_len} tokens per query "
            f"in {budget} ({result.source}{margin}; "
            + (f"batch {edge.batch_size} does not fit" if edge else f"stopped at --limit {limit}")
            + ")"
        )
    if (result.borderline_batch_size or 0) > result.max_batch_size:
        console.print(f"batch {result.borderline_batch_size} is borderline: within the card only inside the margin")
    if out is not None:
        console.print(f"record: {Path(out) / 'max_batch.jsonl'}")


def register(app: typer.Typer) -> None:
    app.command("max-batch")(max_batch)
