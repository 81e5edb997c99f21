"""`tunecost estimate --gpus N|auto --strategy S`: the job on several GPUs (memory per rank, step, cost)."""

from __future__ import annotations

from typing import Annotated

from tunecost.cli.common import console, print_json, print_table, split_list
from tunecost.cli.options import MAX_EXPERTS, count_option, opt
from tunecost.distributed.plan import MULTI_GPU_STRATEGIES
from tunecost.distributed.setups import DEFAULT_MAX_GPUS, MAX_SEARCH_GPUS
from tunecost.units import format_bytes

DEFAULT_GPUS_PER_NODE = 8
DEFAULT_SEQ_LEN = 512  # tokens per query when the job names none (the paper's eq. (1) artifact length)
MAX_GPUS_PER_NODE = 1024
NumGpus = Annotated[
    str | None, opt("--gpus", "Several GPUs: a number, or 'auto' for the fewest that fit and the cheapest setup.")
]
GpusPerNode = Annotated[
    int | None, count_option("--gpus-per-node", "Several GPUs: GPUs per node (default 8).", MAX_GPUS_PER_NODE)
]
Strategy = Annotated[
    str | None,
    opt("--strategy", "Several GPUs: " + ", ".join(MULTI_GPU_STRATEGIES) + ", or all (default; comma list)."),
]
MaxGpus = Annotated[
    int | None, count_option("--max-gpus", "--gpus auto: the most GPUs to consider (default 64).", MAX_SEARCH_GPUS)
]
Interconnect = Annotated[str | None, opt("--interconnect", "Several GPUs: the link inside a node (NVLink4, PCIe4...).")]
Offload = Annotated[
    str | None,
    opt(
        "--offload",
        "Several GPUs, CPU offload: none | optimizer (DeepSpeed zero1/2/3) | params (zero3 with the optimizer; "
        "FSDP's CPU offload for fsdp1/fsdp2).",
    ),
]
ExpertParallel = Annotated[
    int | None,
    count_option(
        "--expert-parallel", "Several GPUs, MoE: ranks that share the experts (divides experts, GPUs).", MAX_EXPERTS
    ),
]


def parse_gpu_count(text: str) -> int | None:
    """--gpus: a whole number of GPUs, or "auto" (search every count up to --max-gpus)."""
    from tunecost.errors import TunecostError

    if text.strip().lower() == "auto":
        return None
    from tunecost.limits import check_count

    try:
        count = int(text)
    except ValueError:
        raise TunecostError(f"--gpus must be a whole number or 'auto', got {text!r}") from None
    return check_count("--gpus", count, MAX_SEARCH_GPUS)


def run_multi_gpu(
    job,
    *,
    gpus: list[str],
    num_gpus: str,
    gpus_per_node: int | None,
    strategy: str | None,
    max_gpus: int | None,
    interconnect: str | None,
    expert_degree: int | None,
    offload: str | None,
    provider: str | None,
    prices_file,
    batch_size: str | None,
    num_queries: int,
    epochs: float,
    json_out: bool,
    out=None,
    force: bool = False,
) -> None:
    """Answer the multi-GPU question for `job` (the estimate command's job) and print it. Each rank runs a
    micro-batch of `batch_size` (default 1) at the job's sequence length (default 512 tokens)."""
    from tunecost.catalog.gpus import resolve_gpu_name
    from tunecost.distributed.expert_parallel import EP_STRATEGIES
    from tunecost.distributed.offload import OFFLOAD_STRATEGIES
    from tunecost.distributed.setups import estimate_multi_gpu
    from tunecost.errors import TunecostError

    offload = (offload or "none").strip().lower()
    every = [  # "all": the strategies that take the offload and the expert-parallel degree asked for
        s
        for s in OFFLOAD_STRATEGIES.get(offload, MULTI_GPU_STRATEGIES)
        if (expert_degree or 1) == 1 or s in EP_STRATEGIES
    ]
    strategies = every if strategy in (None, "all") else split_list(strategy, what="strategy")
    count = parse_gpu_count(num_gpus)
    if batch_size is not None and not batch_size.strip().isdigit():
        raise TunecostError(f"with --gpus, --batch-size is one whole number (per rank), got {batch_size!r}")
    job = job.with_(batch_size=int(batch_size) if batch_size else 1, seq_len=job.seq_len or DEFAULT_SEQ_LEN)
    answer = estimate_multi_gpu(
        job,
        gpus=[resolve_gpu_name(g).gpu for g in dict.fromkeys(gpus)],
        strategies=strategies,
        num_gpus=count,
        gpus_per_node=gpus_per_node or DEFAULT_GPUS_PER_NODE,
        max_gpus=max_gpus or DEFAULT_MAX_GPUS,
        node_link=interconnect,
        expert_degree=expert_degree or 1,
        offload=offload,
        provider=provider,
        prices_file=prices_file,
        num_queries=num_queries,
        epochs=epochs,
    )
    limit = max_gpus or DEFAULT_MAX_GPUS
    if out is not None:  # every setup evaluated, for `tunecost report` (memory per rank and cost vs GPU count)
        import sys

        from tunecost.results.records import save_multi_gpu_records

        save_multi_gpu_records(out, answer, command=sys.argv, force=force)
    if json_out:
        print_json(answer)
        return
    shown = answer.setups if count is not None else tuple(answer.smallest_fitting.values())
    ep = f", expert parallel {expert_degree}" if expert_degree and expert_degree > 1 else ""
    ep += f", CPU offload: {offload}" if offload != "none" else ""
    title = (
        f"{answer.model} ({answer.method}{ep}) on {count} GPUs"
        if count is not None
        else f"{answer.model} ({answer.method}{ep}): fewest GPUs that fit, per GPU and strategy (up to {limit})"
    )
    _print_setups(f"{title}: {answer.batch_size} x {answer.seq_len} tokens per rank", shown)
    for s in shown:
        if not s.fits:
            console.print(f"{s.plan.strategy} on {s.plan.num_gpus} x {s.gpu.name} does not fit: {why_not(s)}")
    beside = {(s.plan.strategy, s.plan.num_gpus): s for s in shown if s.deepspeed_estimate_bytes is not None}
    for (strategy_name, n), s in beside.items():
        deepspeed = s.deepspeed_estimate_bytes or 0
        console.print(
            f"DeepSpeed's own estimator, {strategy_name} on {n} GPUs: {deepspeed / 1e9:.1f} GB of model states "
            f"per GPU, every parameter trainable (tunecost: {s.memory.need_bytes / 1e9:.1f} GB in all)"
        )
    best = answer.cheapest
    if best is not None and best.cost is not None and best.cost.price is not None:
        price = best.cost.price
        console.print(
            f"cheapest: {best.plan.num_gpus} x {best.gpu.name} ({price.provider}, "
            f"${price.usd_per_gpu_hour:g}/GPU-hour{_node_text(best.cost)}) with {best.plan.strategy}: "
            f"{best.cost.hours:.1f} h, "
            f"[bold]${best.usd:.2f}[/bold]"
        )
    for note in (*answer.notes, *answer.assumptions):
        console.print(f"[dim]note: {note}[/dim]")


def _node_text(cost) -> str:
    """ ", billed as 2 x 8-GPU nodes" for a price that rents whole nodes; "" otherwise."""
    unit = cost.price.gpus_per_unit if cost is not None and cost.price is not None else 1
    nodes = cost.billed_gpus // unit
    return f", billed as {nodes} x {unit}-GPU node{'s' if nodes > 1 else ''}" if unit > 1 else ""


def _price_text(cost) -> str:
    if cost is None or cost.price is None:
        return "-"
    return f"{cost.billed_gpus} ({cost.price.provider}{_node_text(cost).replace(', billed as', ':')})"


def why_not(setup) -> str:
    """The need of a rank that does not fit, and its largest parts."""
    m = setup.memory
    parts = sorted(m.breakdown_bytes.items(), key=lambda kv: -kv[1])[:3]
    held = "the whole model and its states replicated per rank" if m.shard_group == 1 else "its shard of the states"
    return (
        f"each rank needs {format_bytes(m.need_bytes)} ({held}: "
        + ", ".join(f"{k} {format_bytes(v)}" for k, v in parts)
        + f", plus {format_bytes(m.device_overhead_bytes + m.nccl_bytes)} device and NCCL overhead) "
        f"but the GPU has {format_bytes(setup.gpu.usable_memory_bytes)}"
    )


def _print_setups(title: str, setups) -> None:
    def fmt(value, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    print_table(
        title,
        [
            "gpu",
            "strategy",
            "GPUs",
            "fits",
            "memory/rank GB",
            "nvidia-smi GB",
            "step s",
            "exposed comm",
            "queries/s",
            "hours",
            "billed GPUs",
            "cost $",
        ],
        [
            [
                s.gpu.name,
                s.plan.strategy,
                s.plan.num_gpus,
                "yes" if s.fits else "no",
                f"{s.memory.need_bytes / 1e9:.1f} of {s.gpu.usable_memory_bytes / 1e9:.1f}"
                + (f" (+{s.memory.host_bytes / 1e9:.1f} on CPU)" if s.memory.host_bytes else ""),
                f"{min(s.memory.nvidia_smi_bytes, s.gpu.memory_bytes) / 1e9:.1f}",
                fmt(s.timing.step_seconds if s.timing else None, ".3f"),
                "-" if s.exposed_comm_share is None else f"{100 * s.exposed_comm_share:.1f} %",
                fmt(s.queries_per_s, ".2f"),
                fmt(s.cost.hours if s.cost else None, ".1f"),
                _price_text(s.cost),
                fmt(s.usd, ".2f"),
            ]
            for s in setups
        ],
    )
