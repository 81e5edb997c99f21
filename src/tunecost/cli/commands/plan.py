"""`tunecost plan`: what to run a job on (method, GPU, count, layout), the answer first."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Annotated

import typer

from tunecost.cli import multi_options as multi
from tunecost.cli import options as cli
from tunecost.cli.common import (
    checked_host_cpu,
    cli_errors,
    console,
    dim,
    err_console,
    format_hours,
    print_json,
    print_table,
    progress_callback,
    split_list,
)
from tunecost.cli.groups import JobOptions, Pricing, StackFlags, option_groups
from tunecost.cli.jobconfig import (
    ConfigFiles,
    config_cuts_the_data,
    config_data_file,
    config_global_batch,
    config_layout,
    on_command_line,
    required,
    run_length,
)
from tunecost.errors import TunecostError
from tunecost.limits import (
    MAX_BATCH_SIZE,
    MAX_BUDGET_USD,
    MAX_DEADLINE_HOURS,
    MAX_EPOCHS,
    MAX_OWNED_GPUS,
    MAX_QUERIES,
    MAX_SEARCH_GPUS,
    MAX_SEQ_LEN,
    check_count,
    check_positive,
)
from tunecost.workload.parallel import DEFAULT_GPUS_PER_NODE, DEFAULT_MAX_GPUS

OWN_HELP = 'GPUs you own, e.g. "2xRTX-4090,1xA100-80GB": no rental cost, counted by their hours.'
HOST_HELP = (
    "CPU of the machine with your --own GPUs (13900K, 7950X, 8480C, ...): its speed times the host work and, "
    "with offload, its memory the optimizer step (default: as a rented GPU's)."
)
METHOD_HELP = "Methods to weigh: a comma list of full, lora, qlora (default: all three, unless --config names one)."
GLOBAL_BATCH_HELP = "The optimisation's batch, kept fixed: micro-batch x accumulation x data-parallel ranks."
TOKENS_HELP = "Tokens to train on instead of --queries x --epochs (one epoch of tokens / --seq-len queries)."
EMIT_HELP = "Write the recommended setup's launch recipe into this folder (never over a file without --force)."
OUT_HELP = (
    "Run directory to add every setup weighed to (for `tunecost report`); a plan already there only with --force."
)
TARGET_HELP = "Recipe to emit: accelerate (HF Trainer + accelerate/DeepSpeed), torchtune, llamafactory, skypilot."
FRONT_ROWS = 12


def _workload(
    run: tuple, tokens: int | None, seq_len: int | None, data, global_batch: int | None, per_row: float
) -> tuple:
    """(queries, epochs) of the run: `run` (--queries, --epochs, --max-steps) x the dataset's size or the global
    batch, or --tokens over --seq-len (`per_row`: the queries a packed row holds)."""
    queries, epochs, max_steps = run
    if tokens is not None:
        if queries is not None or epochs is not None or on_command_line("max_steps") or seq_len is None:
            raise TunecostError("--tokens needs --seq-len and replaces --queries, --epochs and --max-steps")
        return max(1, round(-(-tokens // seq_len) * per_row)), 1.0
    if queries is None and data is not None:
        queries = data.num_queries
    if queries is None and max_steps is None and not config_cuts_the_data():
        raise TunecostError("give --dataset, --queries or --tokens")
    length = run_length(epochs, max_steps, queries, global_batch, searching=True, queries_per_row=per_row)
    return length.num_queries, length.epochs


@cli_errors
@option_groups
def plan(
    *,
    job_options: JobOptions,
    stack_flags: StackFlags,
    method: Annotated[str | None, cli.opt("--method", METHOD_HELP)] = None,
    dataset: Annotated[str | None, cli.opt("--dataset", "Dataset: a known name or a local file.")] = None,
    queries: Annotated[int | None, cli.opt("--queries", "Queries (default: the dataset's size).")] = None,
    epochs: cli.Epochs = None,
    max_steps: cli.MaxSteps = None,
    tokens: Annotated[int | None, cli.opt("--tokens", TOKENS_HELP)] = None,
    budget: Annotated[float | None, cli.opt("--budget", "Most dollars to spend.")] = None,
    deadline: Annotated[float | None, cli.opt("--deadline", "Most hours the run may take.")] = None,
    gpu: Annotated[str, cli.opt("--gpu", "GPUs that may be rented: a comma list or 'all' ('none': own only).")] = "all",
    own: Annotated[str | None, cli.opt("--own", OWN_HELP)] = None,
    host_cpu: Annotated[str | None, cli.opt("--host-cpu", HOST_HELP)] = None,
    framework: cli.Framework = None,
    pricing: Pricing,
    max_gpus: multi.MaxGpus = None,
    gpus_per_node: multi.GpusPerNode = None,
    global_batch: Annotated[int | None, cli.opt("--global-batch", GLOBAL_BATCH_HELP)] = None,
    emit: Annotated[Path | None, cli.opt("--emit", EMIT_HELP)] = None,
    target: Annotated[str | None, cli.opt("--target", TARGET_HELP)] = None,
    force: cli.Force = False,
    out: Annotated[Path | None, cli.opt("--out", OUT_HELP)] = None,
    verbose: Annotated[bool, cli.opt("--verbose", "Every setup of the front and every note.")] = False,
    config: ConfigFiles = None,
    json_out: cli.JsonOut = False,
) -> None:
    """Which method, GPU, count and layout to fine-tune on: the cheapest within --deadline or the fastest within
    --budget, the cost-vs-hours front, what was ruled out and why, and the launch recipe (--emit)."""
    from tunecost.estimate.estimators import lengths_note
    from tunecost.estimate.plan import make_plan
    from tunecost.estimate.throughput.packing import queries_per_row
    from tunecost.workload.job_data import job_data

    model = required("model", job_options.model)
    methods = _before_search(method, target, job_options, (out, emit))
    _check_numbers(budget, deadline, epochs, queries, tokens, global_batch, max_gpus, gpus_per_node)
    owned, host_cpu = _owned(own, host_cpu)
    gpus = _rented_gpus(gpu, owned)
    data = job_data(dataset, model=model) if dataset and config_data_file(dataset) else None  # emit names it
    global_batch = _kept_global_batch(global_batch)
    rows = max_steps is not None or tokens is not None
    jobs = [job_options.estimate_job(model, m, data, rows=rows) for m in methods]
    if global_batch is not None:  # each setup's accumulation comes from the global batch (plan._with_global_batch)
        jobs = [j.with_(grad_accum=1) for j in jobs]
    per_row = queries_per_row(jobs[0])
    num_queries, num_epochs = _workload(
        (queries, epochs, max_steps), tokens, job_options.seq_len, data, global_batch, per_row
    )
    with progress_callback("planning", enabled=not json_out, counted=True) as on_progress:
        result = make_plan(
            jobs,
            gpus=gpus,
            own=owned,
            max_gpus=max_gpus or DEFAULT_MAX_GPUS,
            gpus_per_node=gpus_per_node or DEFAULT_GPUS_PER_NODE,
            num_queries=num_queries,
            epochs=num_epochs,
            budget_usd=budget,
            deadline_h=deadline,
            provider=pricing.provider,
            prices_file=pricing.prices_file,
            global_batch=global_batch,
            behaviour=stack_flags.behaviour(job_options.stack),
            on_progress=on_progress,
            host_cpu=host_cpu,
            framework=framework,
        )
    if out is not None:
        _save_records(out, result, force)
    how = (stack_flags.behaviour(job_options.stack), config, None if max_steps is None else num_queries / per_row)
    written = _emit(result, jobs, (emit, model, dataset), target, force, num_epochs, how) if emit is not None else []
    if json_out:
        # every option weighed goes to --out RUN; the JSON answer keeps the front and the closest misses
        print_json({"plan": dataclasses.replace(result, options=()), "emitted": [str(p) for p in written]})
        return
    print_plan(result, verbose=verbose, lengths=lengths_note(jobs[0]))
    for path in written:
        console.print(f"wrote {path}")


def _save_records(out: Path, result, force: bool) -> None:
    """Every setup weighed, for `tunecost report` (cost vs hours with the Pareto front)."""
    import sys

    from tunecost.results.plan_records import save_plan_records

    save_plan_records(out, result, command=sys.argv, force=force)


def _before_search(method: str | None, target: str | None, job_options: JobOptions, outputs: tuple) -> list[str]:
    """The checks that need no search (--out and --emit folders, --method, --target, the options no method takes),
    and --method as a list (default: every method)."""
    from tunecost.estimate.plan import METHODS
    from tunecost.estimate.recipes import TARGETS
    from tunecost.outputs import check_output_folder

    out, emit = outputs
    if out is not None:
        check_output_folder(out)
    if emit is not None and emit.exists() and not emit.is_dir():
        raise TunecostError(f"--emit {str(emit)!r} is a file; give a folder")
    methods = split_list(method, what="method") or list(METHODS)
    for m in methods:
        if m not in METHODS:
            raise TunecostError(f"--method {m!r}: expected {', '.join(METHODS)}")
    if target is not None and target not in TARGETS:
        raise TunecostError(f"--target {target!r}: expected {', '.join(TARGETS)}")
    job_options.check_method(*methods)
    return methods


def _owned(own: str | None, host_cpu: str | None) -> tuple[tuple, str | None]:
    """--own's GPUs, and --host-cpu (their machine's CPU) as the catalog names it."""
    owned = parse_owned(own)
    if host_cpu is not None and not owned:
        raise TunecostError("--host-cpu names the machine of your --own GPUs; give --own")
    return owned, checked_host_cpu(host_cpu)


def parse_owned(text: str | None) -> tuple:
    """`--own "2xRTX-4090,1xA100-80GB"`: counts of catalog GPUs (a bare name is one GPU), as `estimate.plan.Owned`."""
    from tunecost.catalog.gpus import resolve_gpu_name
    from tunecost.estimate.plan import Owned

    out: list[Owned] = []
    for item in (text or "").split(","):
        if not item.strip():
            continue
        m = re.fullmatch(r"\s*(?:(\d+)\s*[xX*]\s*)?(.+?)\s*", item)
        count = int(m.group(1)) if m and m.group(1) else 1
        if not m or not 1 <= count <= MAX_OWNED_GPUS:
            raise TunecostError(f"--own {item.strip()!r}: expected COUNTxGPU with 1 to {MAX_OWNED_GPUS} GPUs")
        try:
            out.append(Owned(gpu=resolve_gpu_name(m.group(2)).gpu, count=count))
        except TunecostError as exc:
            raise TunecostError(f"--own {item.strip()!r}: {exc}") from None
    return tuple(out)


def _kept_global_batch(global_batch: int | None) -> int | None:
    """--global-batch, else the one the --config files state (said on stderr: the optimisation every setup keeps,
    each with its own micro-batch x accumulation); an error beside --grad-accum. The config's own layout is said to
    be weighed among the others (a plan searches layouts)."""
    if global_batch is not None and on_command_line("grad_accum"):
        raise TunecostError("give --global-batch or --grad-accum: the global batch sets each setup's accumulation")
    layout = config_layout()
    if layout:
        err_console.print(f"assumed: {layout} from --config is weighed among every layout the plan searches")
    stated = config_global_batch() if global_batch is None else None
    if stated is None:
        return global_batch
    err_console.print(f"assumed: {stated[1]}, kept in every setup (--global-batch N to change it)")
    return stated[0]


def _check_numbers(
    budget: float | None,
    deadline: float | None,
    epochs: float | None,
    queries: int | None,
    tokens: int | None,
    global_batch: int | None,
    max_gpus: int | None,
    gpus_per_node: int | None,
) -> None:

    check_positive("--budget", budget, MAX_BUDGET_USD)
    check_positive("--deadline", deadline, MAX_DEADLINE_HOURS)
    check_positive("--epochs", epochs, MAX_EPOCHS)
    check_count("--queries", queries, MAX_QUERIES)
    check_count("--tokens", tokens, MAX_QUERIES * MAX_SEQ_LEN)
    check_count("--global-batch", global_batch, MAX_BATCH_SIZE * MAX_SEARCH_GPUS)
    check_count("--max-gpus", max_gpus, MAX_SEARCH_GPUS)
    check_count("--gpus-per-node", gpus_per_node, MAX_SEARCH_GPUS)


def _rented_gpus(gpu: str, owned) -> list:
    """--gpu: the catalog GPUs that may be rented ('all', a comma list, or 'none' beside --own)."""
    from tunecost.catalog.gpus import gpu_catalog

    names = [] if gpu.strip().lower() == "none" else split_list(gpu, what="GPU")
    gpus = list(gpu_catalog().values()) if [n.lower() for n in names] == ["all"] else []
    if not gpus and names:
        from tunecost.catalog.gpus import resolve_gpu_name

        gpus = [resolve_gpu_name(n).gpu for n in dict.fromkeys(names)]
    if not gpus and not owned:
        raise TunecostError("--gpu none needs --own: nothing to plan on")
    return gpus


def _emit(result, jobs: list, emit: tuple, target: str | None, force: bool, epochs: float, how: tuple) -> list[Path]:
    """The recommended setup's recipe in folder `emit[0]`, for the model and data the user named (`emit[1:]`); `how`:
    (behaviour, --config files, the rows of an epoch where the run was given in optimizer steps, else None). The
    target defaults to the config's framework where it is one (else accelerate); a LLaMA-Factory recipe starts from
    the user's LLaMA-Factory config."""
    from tunecost.estimate.plan_launch import launch_job
    from tunecost.estimate.recipes import write_recipe
    from tunecost.simulate.behaviour import runs_fused_adamw
    from tunecost.workload.frameworks.registry import configs_of

    best = result.recommended
    if best is None:
        raise TunecostError("--emit: no setup to launch (nothing fits within the constraints)")
    job = next(j for j in jobs if j.method == best.method)
    behaviour, configs, rows = how
    own = configs_of(configs or (), ("llamafactory", "torchtune"))
    target = target or next((t for t in ("llamafactory", "torchtune") if t in own), "accelerate")
    base = own.get("llamafactory") if target == "llamafactory" else None
    out, model, dataset = emit
    fused = runs_fused_adamw(job.stack, behaviour)
    global_batch = best.setup.micro_batch * best.accumulation * best.setup.plan.dp
    steps = None if rows is None else math.ceil(rows * epochs / global_batch - 1e-9)
    recipe = launch_job(
        best, job, epochs=epochs, model=model, dataset=dataset, fused_adamw=fused, base=base, max_steps=steps
    )
    return write_recipe(recipe, target, out, force=force, inputs=configs or ())


def _note(option) -> str:
    """What the row's hours rest on: an offload's host optimizer step (at datasheet bandwidth), extrapolation."""
    said = ["host optimizer step: a floor"] if option.offload != "none" else []
    return "; ".join(said + (["outside validated range"] if option.setup.extrapolation else []))


def _where(option) -> str:
    s = option.setup
    layout = s.plan.layout_name + (f" + {option.offload} offload" if option.offload != "none" else "")
    owned = " (owned)" if option.owned else ""
    return f"{s.plan.num_gpus} x {s.gpu.name}{owned}, {layout}"


def _batch(option) -> str:
    accumulation = f" x {option.accumulation}" if option.accumulation > 1 else ""
    return f"{option.setup.micro_batch}{accumulation}"


def _range(option, value: float, spec: str) -> str:
    lo, hi = option.interval(value)
    return f"{value:{spec}} [{lo:{spec}}-{hi:{spec}}]" if hi > lo else f"{value:{spec}}"


def print_plan(result, *, verbose: bool = False, lengths: str = "") -> None:
    best = result.recommended
    if best is None:
        console.print(f"[bold]no setup[/bold] for {result.model}: {result.reason}", highlight=False)
    else:
        usd = "$0 (owned)" if best.owned else f"${best.usd:,.2f}"
        console.print(
            f"[bold]plan:[/bold] {best.method} on {_where(best)}, micro-batch {_batch(best)}: "
            f"{format_hours(best.hours)} h, {usd} ({result.reason})",
            highlight=False,
        )
    front = list(result.front) if verbose else list(result.front)[:FRONT_ROWS]
    print_table(
        f"{result.model}: cost vs hours (the setups no other beats on both)",
        ["method", "setup", "batch", "headroom", "hours [95 %]", "cost $ [95 %]", "price", "note"],
        [
            [
                o.method,
                _where(o),
                _batch(o),
                f"{100 * o.headroom_fraction:.0f} %",
                _range(o, o.hours, ".3g"),
                "0 (owned)" if o.owned else _range(o, o.usd, ",.2f") if math.isfinite(o.usd) else "no price",
                _price(o),
                _note(o),
            ]
            for o in front
        ],
        caption=f"{result.evaluated} setups timed and priced, {result.pruned} ruled out by memory first"
        + (f", {result.skipped} fit at GPU counts the search does not price" if result.skipped else ""),
    )
    if lengths:
        console.print(dim(lengths))
    if result.ruled_out:
        _print_ruled_out(result, verbose)
    notes = result.notes if verbose else result.notes[:1]
    for note in notes:
        console.print(f"note: {note}", highlight=False)
    if not verbose and len(result.notes) > 1:
        console.print(f"{len(result.notes) - 1} more notes: --verbose", highlight=False)


def _print_ruled_out(result, verbose: bool) -> None:
    print_table(
        "Ruled out (the closest miss per method, GPU and offload)",
        ["method", "setup", "why"],
        [[o.method, _where(o), o.why_not] for o in result.ruled_out[: None if verbose else FRONT_ROWS]],
    )


def _price(option) -> str:
    cost = option.setup.cost
    if option.owned or cost is None or cost.price is None:
        return "owned" if option.owned else "-"
    return f"{cost.price.provider} {cost.price.date}"


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
