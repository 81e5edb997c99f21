"""`tunecost memory`: simulate one fine-tuning step from the model's config (no weights, no GPU): peak memory and
its breakdown, FLOPs per step, and the largest batch that fits a GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from tunecost.cli.common import (
    cli_errors,
    console,
    err_console,
    print_json,
    print_table,
    progress_callback,
)
from tunecost.cli.groups import GpuMemory, JobOptions, StackFlags, option_groups
from tunecost.cli.jobconfig import ConfigFiles, config_data_file, on_command_line, required
from tunecost.cli.options import DEFAULT_SEQ_LEN, BatchSize, ExpertsPerToken, JsonOut, MethodName, count_option, opt
from tunecost.csvfile import check_input_file
from tunecost.errors import TunecostError
from tunecost.estimate.memory_interval import peak_interval_bytes
from tunecost.limits import MAX_GPTQ_GROUP_SIZE, MAX_LAYERS, MAX_LENGTHS_FILE_BYTES, MAX_SEQ_LEN

if TYPE_CHECKING:
    from tunecost.workload.job import FineTuneJob, Method
from tunecost.limits import check_count
from tunecost.units import format_bytes, gb_from_bytes

LENGTHS_HELP = (
    "Token lengths of a dataset (JSON list or one per line): the worst batch (the longest query, padded) decides; "
    "overrides --seq-len."
)
DATASET_HELP = (
    "Dataset (a file, or a catalog dataset with a local copy): the worst batch of its own token lengths, cut at "
    "--seq-len, decides, as `estimate` sizes memory."
)
TRACE_HELP = "Trace this many layers (default: scale from one and two repeating units)."
QUANT_TYPE_HELP = (
    "4-bit type for qlora: nf4 | fp4 | gptq (default: gptq for a GPTQ checkpoint in the catalog, else nf4)."
)
GPTQ_GROUP_HELP = "GPTQ group size, -1 for one group (default: the checkpoint's quantize_config, else 128)."
GPTQ_KERNEL_HELP = "GPTQ kernel: triton-v2 (de-quantized temporary) | torch (auto-gptq torch path, weight kept)."


def _read_lengths(path: Path) -> tuple[int, ...]:
    """Token lengths: a JSON list, a JSON object with "lengths", or one integer per line."""
    path = check_input_file(path, "--dataset-lengths file")
    if path.stat().st_size > MAX_LENGTHS_FILE_BYTES:
        raise TunecostError(
            f"--dataset-lengths file {str(path)!r} is larger than {MAX_LENGTHS_FILE_BYTES // 2**20} MiB"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TunecostError(f"{str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        data = json.loads(text)
        values = data["lengths"] if isinstance(data, dict) else data
    except (ValueError, KeyError, TypeError, RecursionError):
        values = [line.strip() for line in text.splitlines() if line.strip()]
    bad = f"{path}: expected token lengths (a JSON list or one whole number per line)"
    if not isinstance(values, list):
        raise TunecostError(bad)
    lengths = []
    for i, v in enumerate(values, start=1):
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise TunecostError(f"{bad}; entry {i} is {repr(v)[:40]}")
        try:
            n = int(v)
        except ValueError:
            raise TunecostError(f"{bad}; entry {i} is {repr(v)[:40]}") from None
        if not 1 <= n <= MAX_SEQ_LEN:
            raise TunecostError(f"{path}: entry {i}: a token length must be between 1 and {MAX_SEQ_LEN}, got {n}")
        lengths.append(n)
    if not lengths:
        raise TunecostError(f"{path}: no lengths")
    return tuple(lengths)


def _gb(n: float) -> str:
    return format_bytes(n)


@cli_errors
@option_groups
def memory(
    *,
    job_options: JobOptions,
    method: MethodName = "qlora",
    experts_per_token: ExpertsPerToken = None,
    batch_size: BatchSize = 1,
    dataset: Annotated[str | None, opt("--dataset", DATASET_HELP)] = None,
    dataset_lengths: Annotated[Path | None, opt("--dataset-lengths", LENGTHS_HELP)] = None,
    gptq_group_size: Annotated[int | None, opt("--gptq-group-size", GPTQ_GROUP_HELP)] = None,
    gptq_kernel: Annotated[str, opt("--gptq-kernel", GPTQ_KERNEL_HELP)] = "triton-v2",
    stack_flags: StackFlags,
    gpu: Annotated[str | None, opt("--gpu", "GPU from the catalog: also report the largest batch that fits.")] = None,
    gpu_memory: GpuMemory,
    layers_to_trace: Annotated[int | None, count_option("--layers-to-trace", TRACE_HELP, MAX_LAYERS)] = None,
    no_cache: Annotated[bool, opt("--no-cache", "Ignore and do not write the result cache.")] = False,
    config: ConfigFiles = None,
    json_out: JsonOut = False,
) -> None:
    """Simulate one training step of MODEL from its config alone: peak memory with a breakdown, FLOPs, bytes
    moved, and (with --gpu or --gpu-memory-gb) the maximum batch size."""
    from tunecost.estimate.simulated import COMPILE_MEMORY_NOTE
    from tunecost.simulate import max_batch_size, simulate_step

    model = required("model", job_options.model)
    memory_bytes = gpu_memory.bytes_beside(gpu)
    if dataset_lengths is not None and on_command_line("dataset"):
        raise TunecostError("give --dataset or --dataset-lengths, not both")
    lengths: tuple[int, ...] | None
    name: str | None
    if dataset_lengths is not None:
        lengths, name = _read_lengths(dataset_lengths), str(dataset_lengths)
    else:
        lengths, name = _data_lengths(config_data_file(dataset), model, job_options.seq_len)
    job = memory_job(
        job_options,
        method=method,
        experts_per_token=experts_per_token,
        batch_size=batch_size,
        lengths=lengths,
        dataset=name,
        gptq=(gptq_group_size, gptq_kernel),
    )
    job = sized_for_data(job, job_options.seq_len)
    gpu_bytes, gpu_name, gpu_note = _gpu_budget(gpu, gpu_memory, memory_bytes, fp8=job.fp8)
    behaviour = stack_flags.behaviour(job.stack)
    with progress_callback("simulating", enabled=not json_out) as report:
        common = {"behaviour": behaviour, "use_cache": not no_cache, "on_progress": report}
        sim = simulate_step(job, num_layers_to_trace=layers_to_trace, **common)
        best = None
        if gpu_bytes is not None:
            best = max_batch_size(job, gpu_bytes, num_layers_to_trace=layers_to_trace, **common)
    out = sim.to_dict()
    low, high, basis = peak_interval_bytes(sim.stack, sim.peak_bytes)
    out.update(peak_interval_bytes=[low, high], peak_interval=basis)
    if job.torch_compile:
        out["torch_compile"] = COMPILE_MEMORY_NOTE
    if best is not None:
        out.update(gpu=gpu_name, gpu_memory_bytes=gpu_bytes, max_batch_size=best.batch_size, max_batch=best.to_dict())
        if gpu_note:
            out["gpu_memory_note"] = gpu_note
    if json_out:
        print_json(out)
        return
    notes = (COMPILE_MEMORY_NOTE,) if job.torch_compile else ()
    _render(sim, best, f"{gpu_name} ({gpu_note})" if gpu_note else gpu_name, notes)


def _data_lengths(dataset: str | None, model: str, cutoff: int | None) -> tuple[tuple[int, ...] | None, str | None]:
    """(token lengths, name) of `dataset` counted with `model`'s tokenizer and cut at `cutoff`, as `estimate` reads
    them; (None, None) without a dataset or for a catalog dataset with no local copy (its facts only)."""
    from tunecost.estimate.estimators import modelled_lengths
    from tunecost.workload.job_data import job_data

    data = job_data(dataset, model=model) if dataset else None
    if data is None:
        return None, None
    if data.lengths is None and not modelled_lengths(data.name, cutoff):
        err_console.print(
            f"assumed: dataset {data.name} has no copy on this machine: its lengths are not read; sized at "
            f"--seq-len {cutoff or DEFAULT_SEQ_LEN}"
        )
        return None, None
    if data.lengths is None:  # the catalog's length model sizes it (`sized_for_data`)
        return None, data.name
    return tuple(min(n, cutoff) if cutoff else n for n in data.lengths), data.name


def sized_for_data(job: FineTuneJob, seq_len: int | None) -> FineTuneJob:
    """`job` at the length `estimate` sizes a batch at when data is named (`seq_len`: the flag's or config's
    cutoff): its longest query padded as the collators pad it, or the catalog's length statistic's longest."""
    from tunecost.estimate.estimators import sizing_seq_len

    if job.packing != "none" or job.dataset is None:
        return job
    sized = sizing_seq_len(job.with_(seq_len=seq_len))
    if job.lengths is None:
        err_console.print(f"assumed: dataset {job.dataset} has no copy on this machine: sized at its longest query, "
                          f"{sized} tokens, from the catalog's length statistic, as estimate sizes it")  # fmt: skip
    return job.with_(seq_len=sized)


def memory_job(
    options: JobOptions,
    *,
    method: str,
    experts_per_token: int | None,
    batch_size: int,
    lengths: tuple[int, ...] | None,
    dataset: str | None,
    gptq: tuple[int | None, str],
) -> FineTuneJob:
    """The job `memory` simulates: the flags' job, with the 4-bit defaults of its checkpoint."""
    from tunecost.workload.job import (
        FineTuneJob,
        LoraConfig,
        default_gradient_checkpointing,
        default_lora_targets,
        parse_lora_targets,
        parse_names,
        quant_defaults,
    )

    model, seq_len = required("model", options.model), options.seq_len or DEFAULT_SEQ_LEN
    options.check_method(method)
    if options.lora_targets is None:
        from tunecost.models.catalog import resolve_model

        targets = default_lora_targets(is_moe=resolve_model(model).is_moe)
    else:
        targets = parse_lora_targets(options.lora_targets)
    gptq_group_size, gptq_kernel = gptq
    if gptq_group_size is not None and gptq_group_size != -1:  # -1: GPTQ's one group over all inputs
        check_count("--gptq-group-size", gptq_group_size, MAX_GPTQ_GROUP_SIZE)
    quant_kind, group_size = quant_defaults(model, options.quant_type, gptq_group_size)
    given = [
        f for f, o in (("--gptq-group-size", "gptq_group_size"), ("--gptq-kernel", "gptq_kernel")) if on_command_line(o)
    ]
    if given and (method != "qlora" or quant_kind != "gptq"):
        raise TunecostError(
            f"{given[0]}: GPTQ weights' setting; this job's base weights are "
            f"{quant_kind if method == 'qlora' else options.dtype or 'bf16'} (--quant-type gptq, or a GPTQ checkpoint)"
        )
    checkpointing = options.gradient_checkpointing
    if options.packing != "none":
        lengths = None  # packed: every row is seq_len tokens
    return FineTuneJob(
        model=model,
        method=cast("Method", method),  # FineTuneJob validates it
        experts_per_token=experts_per_token,
        compute_dtype=options.dtype or ("fp16" if method == "qlora" and quant_kind == "gptq" else "bf16"),
        quant_type=quant_kind,
        double_quant=options.double_quant,
        gptq_group_size=group_size,
        gptq_kernel=gptq_kernel,
        modules_to_save=parse_names(options.modules_to_save),
        gradient_checkpointing=default_gradient_checkpointing(method, options.selective_recompute)
        if checkpointing is None
        else checkpointing,
        selective_recompute=options.selective_recompute,
        recompute_layers=options.recompute_layers,
        attention=options.attention,
        optimizer=options.optimizer,
        batch_size=batch_size,
        grad_accum=options.grad_accum or 1,  # the step time's, not the peak's
        seq_len=None if lengths else seq_len,
        lengths=lengths,
        packing=options.packing,
        torch_compile=options.torch_compile,
        liger_kernel=options.liger_kernel,
        dataset=dataset,
        lora=LoraConfig(
            rank=options.lora_rank, alpha=options.lora_alpha, targets=targets, dropout=options.lora_dropout
        ),
        stack=options.stack,
        fp8=options.fp8,
        fp8_params=options.fp8_params,
        fp32_params=options.fp32_params,
    )


def _gpu_budget(gpu: str | None, gpu_memory: GpuMemory, memory_bytes: int | None, fp8: str = "none") -> tuple:
    """(bytes, name, note) of the GPU the largest batch is sought on; all None without one. FP8 on a GPU without
    FP8 tensor cores is an error."""
    if gpu is not None:
        from tunecost.catalog.gpus import no_fp8_error, resolve_gpu_name

        g = resolve_gpu_name(gpu).gpu
        if fp8 != "none" and not g.supports_fp8:
            raise no_fp8_error([g.name])
        return g.usable_memory_bytes, g.name, g.usable_memory_note()
    if memory_bytes is not None:
        return memory_bytes, gpu_memory.name, ""
    return None, None, ""


def _render(sim, best, gpu_name, notes: tuple[str, ...] = ()) -> None:
    title = (
        f"{sim.model} {sim.method} ({sim.stack} stack): batch {sim.batch_size} x {sim.seq_len} tokens, "
        f"{sim.num_layers} layers (traced {', '.join(map(str, sim.layers_traced))} and scaled)"
    )
    rows = [[k, _gb(v)] for k, v in sorted(sim.breakdown_bytes.items(), key=lambda kv: -kv[1])]
    rows.append(["PEAK (tensors)", _gb(sim.peak_bytes)])
    low, high, _ = peak_interval_bytes(sim.stack, sim.peak_bytes)
    rows.append(["  95 % interval (published peaks, held out)", f"{_gb(low)} - {_gb(high)}"])
    rows.append(["+ device overhead (assumed)", _gb(sim.device_overhead_bytes)])
    rows.append(["reserved by the caching allocator (replayed)", _gb(sim.peak_reserved_bytes)])
    print_table(title, ["at the peak (" + sim.peak_segment + ")", "bytes"], rows)
    print_table(
        "Stored weights",
        ["part", "bytes"],
        [[k, _gb(v)] for k, v in sorted(sim.weight_bytes.items(), key=lambda kv: -kv[1]) if v],
    )
    print_table(
        "Peak by module",
        ["module", "bytes"],
        [[k, _gb(v)] for k, v in sorted(sim.module_bytes.items(), key=lambda kv: -kv[1])],
    )
    total = sim.total_counts
    print_table(
        "Work per step",
        ["phase", "TFLOP", "GB moved"],
        [[p, f"{c.flops / 1e12:,.3f}", f"{gb_from_bytes(c.bytes_moved):,.2f}"] for p, c in sim.counts.items()]
        + [["total", f"{total.flops / 1e12:,.3f}", f"{gb_from_bytes(total.bytes_moved):,.2f}"]],
    )
    if best is not None:
        console.print(_largest_batch_line(best, gpu_name))
    console.print(f"simulated in {sim.seconds_taken:.1f} s. Assumptions:")
    for a in (*sim.assumptions, *notes):
        console.print(f"  - {a}")


def _largest_batch_line(best, gpu_name: str) -> str:
    """The largest batch with the margin and what it needs; none fitting with it, the borderline batch's need."""
    margin = f"{100 * best.margin_fraction:g} %"
    head = f"Largest batch on {gpu_name} with a {margin} safety margin:"
    if not best.batch_size:  # the simulated peak is the borderline batch's
        return (
            f"{head} [bold]none[/bold] (batch {best.borderline_batch_size} x {best.seq_len} tokens needs "
            f"{_gb(best.need_bytes)}: within the card only inside the margin)"
        )
    border = (
        f"; batch {best.borderline_batch_size} is borderline: within the card only inside the margin"
        if best.borderline_batch_size > best.batch_size
        else ""
    )
    return (
        f"{head} [bold]{best.batch_size}[/bold] x {best.seq_len} tokens (needs {_gb(best.need_bytes)}: reserved + "
        f"CUDA context; headroom {_gb(best.headroom_bytes)}){border}"
    )


def register(app: typer.Typer) -> None:
    app.command("memory")(memory)
