"""`tunecost max-batch`: the largest batch that fits (measured on a GPU, simulated on a CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tunecost.cli import options as cli
from tunecost.cli.commands.profile import catalog_only, inputs_spec, resolve_device
from tunecost.cli.common import cli_errors, console, err_console, print_json
from tunecost.cli.groups import GpuMemory, check_lora_options, option_groups
from tunecost.cli.jobconfig import ConfigFiles
from tunecost.errors import TunecostError
from tunecost.io import append_jsonl
from tunecost.limits import MAX_BATCH_SIZE
from tunecost.profile.threads import prepare_cpu_threads
from tunecost.results.schema import record_path
from tunecost.units import BYTES_PER_GIB as _GIB
from tunecost.workload.job import default_gradient_checkpointing


@cli_errors
@option_groups
def max_batch(
    *,
    model: cli.ModelName = "tiny-mixtral",
    method: cli.MethodName = "qlora",
    experts_per_token: cli.ExpertsPerToken = None,
    seq_len: cli.SeqLen = None,
    dataset: Annotated[str | None, cli.opt("--dataset", "Probe with the dataset's longest queries.")] = None,
    gpu: Annotated[str | None, cli.opt("--gpu", "Search against this catalog GPU's memory.")] = None,
    gpu_memory: GpuMemory,
    device: Annotated[
        str, cli.opt("--device", "cuda: measured search; cpu: simulated (auto: cuda if available).")
    ] = "auto",
    experts_impl: cli.ExpertsImpl = None,
    random_weights: cli.RandomWeights = False,
    gradient_checkpointing: cli.GradientCheckpointing = None,
    lora_rank: cli.LoraRank = cli.DEFAULT_LORA_RANK,
    lora_alpha: cli.LoraAlpha = cli.DEFAULT_LORA_ALPHA,
    limit: Annotated[int, cli.count_option("--limit", "Largest batch size tried.", MAX_BATCH_SIZE)] = 4096,
    tokenizer: cli.Tokenizer = "mistral",
    template: cli.Template = "mistral",
    max_length: cli.MaxLength = 1024,  # with --seq-len too, --seq-len (the job's cutoff) is the length
    out: Annotated[Path | None, cli.opt("--out", "Also append the result to OUT/max_batch.jsonl.")] = None,
    config: ConfigFiles = None,
    json_out: cli.JsonOut = False,
) -> None:
    """Largest batch size that fits (paper Table III): grow then bisect; a found OOM is the measured boundary."""
    check_lora_options(method)
    checkpointing = default_gradient_checkpointing(method) if gradient_checkpointing is None else gradient_checkpointing
    _check_out(out)
    prepare_cpu_threads(device)
    from tunecost.profile.maxbatch import find_max_batch_size, max_batch_row
    from tunecost.profile.model_setup import ModelSetup

    memory_bytes = gpu_memory.bytes_beside(gpu)
    setup = ModelSetup(
        model=model,
        method=method,
        experts_per_token=experts_per_token,
        experts_impl=experts_impl,
        device=resolve_device(device),
        random_weights=random_weights,
        gradient_checkpointing=checkpointing,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
    )
    memory_bytes, gpu_name = _catalog_budget(gpu, setup) if gpu is not None else (memory_bytes, None)
    if dataset is not None and catalog_only(dataset, seq_len):
        dataset = None
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
        append_jsonl(record_path(out, "max_batch"), row)
    if json_out:
        print_json(row)
        return
    _print_result(result, gpu_name, limit, out)


def _check_out(out: Path | None) -> None:
    """--out: a folder to append max_batch.jsonl to."""
    if out is None:
        return
    from tunecost.outputs import check_output_folder

    check_output_folder(out)
    if record_path(out, "max_batch").is_dir():
        raise TunecostError(f"--out {str(out)!r}: max_batch.jsonl there is a folder, not a file")


def _catalog_budget(gpu: str, setup: Any) -> tuple[int | None, str]:
    from tunecost.catalog.gpus import resolve_gpu_name
    from tunecost.profile.maxbatch import catalog_gpu_budget

    g = resolve_gpu_name(gpu).gpu
    return catalog_gpu_budget(g, setup.device), g.name


def _print_result(result: Any, gpu_name: str | None, limit: int, out: Path | None) -> None:
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
