"""`tunecost estimate --gpus N|auto --strategy S`: the job on several GPUs (memory per rank, step, cost)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from tunecost.cli.common import console, dim, err_console, format_hours, print_json, print_table, split_list
from tunecost.cli.multi_options import model_parallel_option, parse_gpu_counts
from tunecost.errors import TunecostError
from tunecost.units import format_bytes
from tunecost.workload.offload import OFFLOAD_STRATEGIES
from tunecost.workload.parallel import (
    DEFAULT_GPUS_PER_NODE,
    DEFAULT_MAX_GPUS,
    MULTI_GPU_STRATEGIES,
    ModelParallel,
)

if TYPE_CHECKING:
    from tunecost.cli.groups import MultiGpuOptions, Pricing, RecordsOutput


def run_multi_gpu(
    job,
    options: MultiGpuOptions,
    *,
    gpus: list[str],
    pricing: Pricing,
    batch_size: str | None,
    num_queries: int,
    epochs: float,
    output: RecordsOutput,
    verbose: bool = False,
    steady_state: bool = False,
    behaviour=None,
    framework: str | None = None,
    host_cpu: str | None = None,
) -> None:
    """Answer the multi-GPU question for `job` and print it, the answer first: each rank runs `batch_size` (else the
    largest micro-batch that fits with the margin) under `framework`, on `host_cpu` (else each GPU's default host)."""
    from tunecost.estimate.gpu_search import expert_strategies, strategies_holding

    num_gpus, strategy = options.num_gpus or "auto", options.strategy
    max_gpus, expert_degree = options.max_gpus, options.expert_parallel
    offload = (options.offload or "none").strip().lower()
    # "all": the strategies that take the offload and the expert-parallel degree asked for
    every = expert_strategies(OFFLOAD_STRATEGIES.get(offload, MULTI_GPU_STRATEGIES), expert_degree or 1)
    every = strategies_holding(job, every, offload)[0] if job.fp32_params else every  # autocast or FSDP
    named = strategy not in (None, "all")
    strategies = split_list(strategy, what="strategy") if named else _framework_strategies(every, framework)
    count = parse_gpu_counts(num_gpus, gpus)
    if isinstance(count, int):
        from tunecost.cli.jobconfig import check_config_global_batch

        check_config_global_batch(count)
    if count is not None and max_gpus is not None:
        raise TunecostError(f"--max-gpus bounds the search of --gpus auto; --gpus {num_gpus} names the count")
    if batch_size is not None and not batch_size.strip().isdigit():
        raise TunecostError(f"with --gpus, --batch-size is one whole number (per rank), got {batch_size!r}")
    from tunecost.estimate.estimators import lengths_note

    answer = _searched(
        job,
        options,
        gpus=gpus,
        strategies=strategies,
        count=count,
        offload=offload,
        pricing=pricing,
        batch_size=int(batch_size) if batch_size else None,
        num_queries=num_queries,
        epochs=epochs,
        steady_state=steady_state,
        behaviour=behaviour,
        framework=framework,
        host_cpu=host_cpu,
    )
    if output.out is not None:  # every setup evaluated, for `tunecost report` (memory per rank and cost vs GPU count)
        from tunecost.results.records import save_multi_gpu_records

        save_multi_gpu_records(output.out, answer, command=sys.argv, force=output.force)
    if output.json_out:
        print_json(answer)
        return
    from tunecost.cli.jobconfig import nothing_fits_hint

    print_answer(
        answer,
        hint=nothing_fits_hint(count is not None, model_parallel_option(options) is not None),
        count=count,
        limit=max_gpus or DEFAULT_MAX_GPUS,
        expert_degree=expert_degree,
        offload=offload,
        verbose=verbose,
        lengths=lengths_note(job),
        fp8=job.fp8,
    )


def _framework_strategies(every: list[str], framework: str | None) -> list[str]:
    """Of `every`, the strategies the config's framework runs (`registry.runnable_strategies`), the rest said."""
    from tunecost.workload.frameworks.registry import runnable_strategies

    kept, dropped = runnable_strategies(every, framework)
    for line in dropped if kept else []:
        err_console.print(f"assumed: {line} (--strategy weighs them)")
    return kept or every


def _searched(
    job,
    options: MultiGpuOptions,
    *,
    gpus: list[str],
    strategies: list[str],
    count: int | dict[str, int] | None,
    offload: str,
    pricing: Pricing,
    batch_size: int | None,
    num_queries: int,
    epochs: float,
    steady_state: bool,
    behaviour,
    framework: str | None,
    host_cpu: str | None,
):
    """`estimate_multi_gpu` of `job` at the expert-parallel degree given; searching the GPU counts of an MoE model
    without a degree, offload or TP/PP/CP given, at each degree `plan` weighs too (one answer)."""
    from tunecost.catalog.gpus import resolve_gpu_name
    from tunecost.cli.jobconfig import layout_is_fixed, pipeline_micro_batches
    from tunecost.estimate import gpu_search
    from tunecost.estimate.estimators import sized_job
    from tunecost.estimate.rank_needs import RankNeeds

    sized, limit = sized_job(job), options.max_gpus or DEFAULT_MAX_GPUS
    stated = model_parallel_option(options)
    if stated is None and layout_is_fixed():  # data-parallel only: no TP/PP/CP or expert-parallel layout searched
        stated = ModelParallel()
    model_parallel = pipeline_micro_batches(stated, count, batch_size)
    searching = count is None and options.expert_parallel is None and model_parallel is None
    more = gpu_search.searched_expert_degrees(sized, offload=offload, max_gpus=limit) if searching else []
    more = [e for e in more if gpu_search.expert_strategies(strategies, e)]
    degree = options.expert_parallel or 1
    gpu_list = [resolve_gpu_name(g).gpu for g in dict.fromkeys(gpus)]
    needs = RankNeeds(job.with_(batch_size=1), behaviour, framework, host_cpu)
    answers = [
        gpu_search.estimate_multi_gpu(
            sized,
            gpus=gpu_list,
            num_gpus=count,
            strategies=strategies if e == degree else gpu_search.expert_strategies(strategies, e),
            max_gpus=limit,
            gpus_per_node=options.gpus_per_node or DEFAULT_GPUS_PER_NODE,
            expert_degree=e,
            node_link=options.interconnect,
            offload=offload,
            provider=pricing.provider,
            num_queries=num_queries,
            prices_file=pricing.prices_file,
            epochs=epochs,
            more_gpus=count is None and e == 1,  # searching: the fewest that fit and their power-of-two multiples
            micro_batch=batch_size,
            require_fit=not more,
            model_parallel=model_parallel,
            steady_state=steady_state,
            behaviour=behaviour,
            needs=needs,
        )
        for e in [degree, *more]
    ]
    if not more:
        return answers[0]
    return gpu_search.merged_estimates(answers, strategies=strategies, max_gpus=limit, gpus=gpu_list)


def print_answer(
    answer,
    *,
    hint: str,
    count,
    limit: int,
    expert_degree: int | None,
    offload: str,
    verbose: bool,
    lengths: str = "",
    fp8: str = "none",
) -> None:
    """The answer line, the best setups (every one with --verbose), why the rest do not fit, and the notes."""
    from tunecost.estimate.setups import cost_order

    best = answer.cheapest
    if best is not None and best.cost is not None and best.cost.price is not None:
        console.print(
            f"answer: {best.plan.num_gpus} x {best.gpu.name}{_layout(best)}, micro-batch {best.micro_batch}: "
            f"{format_hours(best.cost.hours)} h, [bold]${best.usd:.2f}[/bold] ({_price_text(best.cost)}"
            f"{f', start-up {_startup(best)} once' if _startup(best) else ''})"
        )
        if best.plan.degree > 1:
            console.print(_model_parallel_line(best))
    elif not any(s.fits for s in answer.setups):
        console.print(f"answer: no setup fits with the safety margin{hint}")
    ranked = sorted(
        (s for s in answer.setups if s.cost is not None or s.fit != "no" or count is not None),
        key=lambda s: (not s.fits, *cost_order(s)),
    )
    if count is None:
        ranked = [s for s in ranked if s.fit != "no" and s.cost is not None]
    rows = [(s, s.plan.layout_name) for s in ranked] if verbose else _merged(ranked)
    shown = rows if verbose else rows[:SHOWN_ROWS]
    ep = f", expert parallel {expert_degree}" if expert_degree and expert_degree > 1 else ""
    ep += f", CPU offload: {offload}" if offload != "none" else ""
    ep += f", FP8 {fp8}" if fp8 != "none" else ""
    what = (
        f"per layout, the fewest GPUs that fit and their power-of-two multiples (up to {limit})"
        if count is None
        else "GPUs as given"
    )
    _print_setups(
        f"{answer.model} ({answer.method}{ep}), {answer.seq_len} tokens per query: {what}", shown, wide=verbose
    )
    if not verbose:
        console.print("GB/rank: what nvidia-smi would show; layout +N: N more with the same figures (--verbose)")
    if lengths:
        console.print(dim(lengths))
    if len(shown) < len(rows):
        console.print(f"{len(rows) - len(shown)} more setups: --verbose shows them")
    for s, _ in shown:
        if s.fit == "no" and (verbose or count is not None):
            console.print(f"{_name(s)} does not fit: {why_not(s)}")
    if verbose:
        for s, _ in shown:
            if s.deepspeed_estimate_bytes is not None:
                console.print(
                    f"DeepSpeed's own estimator, {s.plan.layout_name} on {s.plan.num_gpus} GPUs: "
                    f"{s.deepspeed_estimate_bytes / 1e9:.1f} GB of model states per GPU, every parameter trainable "
                    f"(tunecost: {s.memory.nvidia_smi_bytes / 1e9:.1f} GB in all)"
                )
        for note in dict.fromkeys((*answer.notes, *answer.assumptions)):
            console.print(dim(f"note: {note}"))
    else:
        console.print(f"[dim]{len(set(answer.notes)) + len(set(answer.assumptions))} notes: --verbose[/dim]")


SHOWN_ROWS = 15


def _figures(s) -> tuple:
    smi = round(s.memory.nvidia_smi_bytes, -8)
    return (s.gpu.name, s.plan.num_gpus, s.micro_batch, s.fit, round(s.usd or 0, 2), smi)


def _model_parallel_line(s) -> str:
    """Memory per rank, and where a step's time goes: compute, exposed communication, the pipeline's bubble."""
    plan, t, m = s.plan, s.timing, s.memory
    text = (
        f"  per rank: {m.nvidia_smi_bytes / 1e9:.1f} GB of {s.gpu.usable_memory_bytes / 1e9:.0f} (peak at "
        f"{m.peak_segment}); tp {plan.tp}{' + sequence parallel' if plan.sequence_parallel else ''}, pp {plan.pp}, "
        f"cp {plan.cp}, data-parallel {plan.dp}, {plan.num_micro_batches} micro-batch(es) per step"
    )
    if t is not None and t.step_seconds:
        text += (
            f"\n  step {t.step_seconds:.3g} s: compute {t.compute_seconds:.3g} s, exposed communication "
            f"{t.exposed_comm_seconds:.3g} s ({100 * t.exposed_comm_share:.1f} %), pipeline bubble "
            f"{t.bubble_seconds:.3g} s ({100 * t.bubble_seconds / t.step_seconds:.1f} %)"
        )
    return text


def _merged(ranked: list) -> list[tuple]:
    """(setup, layout names): one row per set of layouts with the same figures (fsdp2/zero3), and of the
    expert-parallel layouts a search adds, the cheapest per GPU, count and degree."""
    groups: dict[tuple, list] = {}
    for s in ranked:
        ep = s.plan.expert_parallel
        key = (s.gpu.name, s.plan.num_gpus, ep) if ep > 1 and s.fits else _figures(s)
        if ep == 1 or key not in groups or _figures(s) == _figures(groups[key][0]):
            groups.setdefault(key, []).append(s)
    return [(same[0], "/".join(dict.fromkeys(x.plan.layout_name for x in same))) for same in groups.values()]


def _layout(s) -> str:
    return "" if s.plan.strategy == "single" else f" ({s.plan.layout_name})"


def _name(s) -> str:
    return f"{s.plan.layout_name} on {s.plan.num_gpus} x {s.gpu.name}"


def _startup(s) -> str:
    seconds = s.cost.startup_s if s.cost is not None else 0.0
    return f"{seconds / 60:.1f} min" if seconds else ""


def _node_text(cost) -> str:
    """ ", billed as 2 x 8-GPU nodes" for a price that rents whole nodes; "" otherwise."""
    unit = cost.price.gpus_per_unit if cost is not None and cost.price is not None else 1
    nodes = cost.billed_gpus // unit
    return f", billed as {nodes} x {unit}-GPU node{'s' if nodes > 1 else ''}" if unit > 1 else ""


def _price_text(cost) -> str:
    if cost is None or cost.price is None:
        return "-"
    from tunecost.catalog.prices import price_label

    return f"{price_label(cost.price)}{_node_text(cost)}"


def why_not(setup) -> str:
    """The need of a rank that does not fit, and its largest parts."""
    m = setup.memory
    parts = sorted(m.breakdown_bytes.items(), key=lambda kv: -kv[1])[:3]
    held = "the whole model and its states replicated per rank" if m.shard_group == 1 else "its shard of the states"
    if setup.plan.degree > 1:
        held = f"its {setup.plan.layout_name.rsplit(' ', 1)[0] if setup.plan.dp > 1 else setup.plan.layout_name} share"
    return (
        f"each rank needs {format_bytes(m.nvidia_smi_bytes)} as nvidia-smi shows it (the allocator's reserve of "
        f"{format_bytes(m.peak_reserved_bytes)} for a peak of {format_bytes(m.peak_bytes)} of tensors, {held}: "
        + ", ".join(f"{k} {format_bytes(v)}" for k, v in parts)
        + f"; plus {format_bytes(m.device_overhead_bytes + m.nccl_bytes)} device and NCCL overhead) "
        f"but the GPU has {format_bytes(setup.gpu.usable_memory_bytes)}"
    )


def _print_setups(title: str, setups, *, wide: bool = False) -> None:
    """The setups as a table: compact (fits a 100-column terminal) or, with --verbose, every figure."""

    def fmt(value, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    def batch(s) -> str:
        return {"yes": str(s.micro_batch), "borderline": f"{s.micro_batch} border"}.get(s.fit, "no")

    def layout_name(layout: str) -> str:
        names = layout.split("/")
        return names[0] + (f" +{len(names) - 1}" if len(names) > 1 else "")

    if not wide:
        print_table(
            title,
            ["setup", "layout", "batch", "GB/rank", "q/s", "hours", "cost $", "price"],
            [
                [
                    f"{s.plan.num_gpus} x {s.gpu.name}",
                    layout_name(layout),
                    batch(s),
                    f"{s.memory.nvidia_smi_bytes / 1e9:.1f}",
                    fmt(s.queries_per_s, ".3g"),
                    format_hours(s.cost.hours if s.cost else None),
                    fmt(s.usd, ".2f"),
                    _price_text(s.cost),
                ]
                for s, layout in setups
            ],
        )
        return
    print_table(
        title,
        [
            "gpu",
            "GPUs",
            "layout",
            "micro-batch",
            "fits",
            "GB/rank",
            "exposed comm",
            "queries/s",
            "hours",
            "cost $",
            "price",
        ],
        [
            [
                s.gpu.name,
                s.plan.num_gpus,
                layout,
                s.micro_batch,
                s.fit,
                f"{s.memory.nvidia_smi_bytes / 1e9:.1f}/{s.gpu.usable_memory_bytes / 1e9:.0f}"
                + (f" +{s.memory.host_bytes / 1e9:.1f} CPU" if s.memory.host_bytes else ""),
                "-" if s.exposed_comm_share is None else f"{abs(100 * s.exposed_comm_share):.1f} %",
                fmt(s.queries_per_s, ".2f"),
                format_hours(s.cost.hours if s.cost else None),
                fmt(s.usd, ".2f"),
                _price_text(s.cost),
            ]
            for s, layout in setups
        ],
    )
