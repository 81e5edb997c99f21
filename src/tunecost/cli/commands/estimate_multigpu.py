"""`tunecost estimate --gpus N|auto --strategy S`: the job on several GPUs (memory per rank, step, cost)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from tunecost.cli.common import console, dim, format_hours, print_json, print_table, split_list
from tunecost.cli.multi_options import DEFAULT_GPUS_PER_NODE
from tunecost.errors import TunecostError
from tunecost.limits import check_count
from tunecost.units import format_bytes
from tunecost.workload.offload import OFFLOAD_STRATEGIES
from tunecost.workload.parallel import (
    DEFAULT_MAX_GPUS,
    MAX_SEARCH_GPUS,
    MULTI_GPU_STRATEGIES,
    ModelParallel,
)

if TYPE_CHECKING:
    from tunecost.cli.groups import MultiGpuOptions, Pricing, RecordsOutput


def model_parallel_option(options: MultiGpuOptions):
    """The TP/PP/CP layout the options give (None: none of them given)."""
    o = options
    given = (o.tp, o.pp, o.cp, o.micro_batches, o.pipeline_schedule, o.virtual_stages, o.sequence_parallel, o.tp_impl)
    split = (o.first_stage_less_layers, o.last_stage_less_layers, o.first_stage_layers, o.last_stage_layers)
    if all(v is None for v in (*given, o.tp_comm_overlap, *split)):
        return None
    tp = options.tp or 1
    if options.sequence_parallel and tp == 1:
        raise TunecostError("--sequence-parallel shards along the tensor-parallel group; it needs --tp 2 or more")
    return ModelParallel(
        tp=tp,
        pp=options.pp or 1,
        cp=options.cp or 1,
        sequence_parallel=tp > 1 and options.sequence_parallel is not False,
        tp_impl=(options.tp_impl or "torchtitan").strip().lower(),
        tp_comm_overlap=bool(options.tp_comm_overlap),
        micro_batches=options.micro_batches,
        pipeline_schedule=(options.pipeline_schedule or "1f1b").strip().lower(),
        virtual_stages=options.virtual_stages or 1,
        first_stage_less_layers=1 if options.first_stage_less_layers is None else options.first_stage_less_layers,
        last_stage_less_layers=1 if options.last_stage_less_layers is None else options.last_stage_less_layers,
        first_stage_layers=options.first_stage_layers,
        last_stage_layers=options.last_stage_layers,
    )


def parse_gpu_counts(text: str, gpus: list[str]) -> int | dict[str, int] | None:
    """--gpus: "auto" (a search up to --max-gpus), one number, or one per --gpu ("2,1" with --gpu RTX-4090,H100)."""
    from tunecost.catalog.gpus import resolve_gpu_name

    if text.strip().lower() == "auto":
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise TunecostError(f"--gpus must be a whole number, one per --gpu, or 'auto', got {text!r}")
    counts = []
    for part in parts:
        try:
            counts.append(check_count("--gpus", int(part), MAX_SEARCH_GPUS) or 0)
        except ValueError:
            raise TunecostError(f"--gpus must be a whole number or 'auto' (or one per --gpu), got {text!r}") from None
    if len(counts) == 1:
        return counts[0]
    if len(counts) != len(gpus):
        raise TunecostError(f"--gpus has {len(counts)} counts for {len(gpus)} GPUs; give one, or one per --gpu")
    names = [resolve_gpu_name(g).gpu.name for g in gpus]
    if len(set(names)) != len(names):
        raise TunecostError("--gpus with a count per GPU needs each --gpu once")
    return dict(zip(names, counts, strict=True))


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
    from tunecost.catalog.gpus import resolve_gpu_name
    from tunecost.distributed.expert_parallel import EP_STRATEGIES
    from tunecost.estimate.gpu_search import estimate_multi_gpu

    num_gpus, gpus_per_node, strategy = options.num_gpus or "auto", options.gpus_per_node, options.strategy
    max_gpus, interconnect, expert_degree = options.max_gpus, options.interconnect, options.expert_parallel
    offload = (options.offload or "none").strip().lower()
    every = [  # "all": the strategies that take the offload and the expert-parallel degree asked for
        s
        for s in OFFLOAD_STRATEGIES.get(offload, MULTI_GPU_STRATEGIES)
        if (expert_degree or 1) == 1 or s in EP_STRATEGIES
    ]
    strategies = every if strategy in (None, "all") else split_list(strategy, what="strategy")
    count = parse_gpu_counts(num_gpus, gpus)
    if count is not None and max_gpus is not None:
        raise TunecostError(f"--max-gpus bounds the search of --gpus auto; --gpus {num_gpus} names the count")
    if batch_size is not None and not batch_size.strip().isdigit():
        raise TunecostError(f"with --gpus, --batch-size is one whole number (per rank), got {batch_size!r}")
    from tunecost.estimate.estimators import lengths_note, sized_job
    from tunecost.estimate.rank_needs import RankNeeds

    sized = sized_job(job)
    answer = estimate_multi_gpu(
        sized,
        gpus=[resolve_gpu_name(g).gpu for g in dict.fromkeys(gpus)],
        strategies=strategies,
        num_gpus=count,
        gpus_per_node=gpus_per_node or DEFAULT_GPUS_PER_NODE,
        max_gpus=max_gpus or DEFAULT_MAX_GPUS,
        node_link=interconnect,
        expert_degree=expert_degree or 1,
        offload=offload,
        provider=pricing.provider,
        prices_file=pricing.prices_file,
        num_queries=num_queries,
        epochs=epochs,
        micro_batch=int(batch_size) if batch_size else None,
        steady_state=steady_state,
        behaviour=behaviour,
        model_parallel=model_parallel_option(options),
        needs=RankNeeds(job.with_(batch_size=1), behaviour, framework, host_cpu),
        more_gpus=count is None,  # searching: the fewest that fit and their power-of-two multiples, as plan prices
    )
    if output.out is not None:  # every setup evaluated, for `tunecost report` (memory per rank and cost vs GPU count)
        from tunecost.results.records import save_multi_gpu_records

        save_multi_gpu_records(output.out, answer, command=sys.argv, force=output.force)
    if output.json_out:
        print_json(answer)
        return
    print_answer(
        answer,
        count=count,
        limit=max_gpus or DEFAULT_MAX_GPUS,
        expert_degree=expert_degree,
        offload=offload,
        verbose=verbose,
        lengths=lengths_note(job),
    )


def print_answer(
    answer, *, count, limit: int, expert_degree: int | None, offload: str, verbose: bool, lengths: str = ""
) -> None:
    """The answer line, the best setups (every one with --verbose), why the rest do not fit, and the notes."""
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
        hint = "; --gpus auto finds the counts that do" if count is not None else ""
        console.print(f"answer: no setup fits with the safety margin{hint}")
    ranked = sorted(
        (s for s in answer.setups if s.cost is not None or s.fit != "no" or count is not None),
        key=lambda s: (s.fit != "yes", s.usd is None, s.usd or 0.0, s.plan.num_gpus),
    )
    if count is None:
        ranked = [s for s in ranked if s.fit != "no" and s.cost is not None]
    rows = [(s, s.plan.layout_name) for s in ranked] if verbose else _merged(ranked)
    shown = rows if verbose else rows[:SHOWN_ROWS]
    ep = f", expert parallel {expert_degree}" if expert_degree and expert_degree > 1 else ""
    ep += f", CPU offload: {offload}" if offload != "none" else ""
    what = (
        f"fewest GPUs that fit and their power-of-two multiples (up to {limit})" if count is None else "GPUs as given"
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
                    f"DeepSpeed's own estimator, {s.plan.strategy} on {s.plan.num_gpus} GPUs: "
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
    """(setup, layout names): one row per set of layouts with the same figures (fsdp2/zero3)."""
    groups: dict[tuple, list] = {}
    for s in ranked:
        groups.setdefault(_figures(s), []).append(s)
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
                + (f" +{s.memory.host_bytes / 1e9:.0f} CPU" if s.memory.host_bytes else ""),
                "-" if s.exposed_comm_share is None else f"{abs(100 * s.exposed_comm_share):.1f} %",
                fmt(s.queries_per_s, ".2f"),
                format_hours(s.cost.hours if s.cost else None),
                fmt(s.usd, ".2f"),
                _price_text(s.cost),
            ]
            for s, layout in setups
        ],
    )
