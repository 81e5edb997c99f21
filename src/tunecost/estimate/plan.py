"""`tunecost plan`: which method, GPU, count and layout to run a job on, within a budget or by a deadline.

Method x GPU (rented or owned) x count x layout (every strategy, with and without CPU offload) x micro-batch, each
priced by the multi-GPU estimate (`estimate.gpu_search.estimate_multi_gpu`: memory per rank decides what fits
first). The answer: the Pareto front of cost vs hours, one recommended setup, and why the others are out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tunecost.catalog.gpus import GPU
from tunecost.catalog.prices import OWNED_PROVIDER, Price
from tunecost.estimate.estimators import sized_job
from tunecost.estimate.gpu_search import (
    estimate_multi_gpu,
    expert_strategies,
    searched_expert_degrees,
    strategies_holding,
)
from tunecost.estimate.rank_needs import RankNeeds
from tunecost.estimate.setups import Setup, setup_cost
from tunecost.estimate.throughput.stack_priors import framework_family
from tunecost.units import BYTES_PER_GB
from tunecost.workload.frameworks.registry import runnable_strategies
from tunecost.workload.job import FineTuneJob
from tunecost.workload.offload import OFFLOAD_CHOICES, OFFLOAD_STRATEGIES
from tunecost.workload.parallel import MULTI_GPU_STRATEGIES, ModelParallel, ParallelPlan

METHODS = ("full", "lora", "qlora")
# tied layouts: one GPU, then PyTorch's own data parallelism (accelerate's FSDP first, as most runs use it), then
# DeepSpeed's
PREFERENCE = ("single", "ddp", "fsdp1", "fsdp2", "fsdp2-shard-grad-op", "hsdp", "zero1", "zero2", "zero3")
TIE_FRACTION = 0.01  # options this close on cost and hours are a tie: the simpler one is recommended
METHOD_TRADES = (
    "method: QLoRA holds the base weights in 4 bits (least memory, de-quantized every step: slower per token than "
    "LoRA; 8 bits with --quant-type int8); LoRA keeps them in 16 bits; a full fine-tune also keeps gradients and "
    "optimizer states of every weight. Accuracy is not estimated (docs/accuracy.md: what tunecost measures about "
    "routing)"
)


@dataclass(frozen=True, kw_only=True)
class Owned:
    """GPUs the user already has: no rental cost, counted by their hours."""

    gpu: GPU
    count: int


@dataclass(frozen=True, kw_only=True)
class Option:
    """One setup the plan weighed: its method, the multi-GPU estimate, and why it is out ("" when it is in)."""

    method: str
    setup: Setup
    owned: bool = False
    accumulation: int = 1
    offload: str = "none"
    why_not: str = ""

    @property
    def hours(self) -> float:
        return self.setup.cost.hours if self.setup.cost else float("inf")

    @property
    def usd(self) -> float:
        cost = self.setup.cost
        return cost.usd if cost is not None and cost.usd is not None else float("inf")

    def interval(self, value: float) -> tuple[float, float]:
        """`value` (hours or dollars, both inverse to throughput) at the ends of the throughput's 95 % interval."""
        ratio = self.setup.interval_ratio
        return (value / ratio[1], value / ratio[0]) if ratio else (value, value)

    @property
    def headroom_fraction(self) -> float:
        """The card's memory left over at this setup's peak, as a share of the card."""
        usable = self.setup.gpu.usable_memory_bytes
        return 1 - self.setup.memory.nvidia_smi_bytes / usable


@dataclass(frozen=True, kw_only=True)
class Plan:
    model: str
    goal: str  # what the recommendation optimises, in words
    recommended: Option | None
    reason: str
    front: tuple[Option, ...]  # cost vs hours, cheapest first
    ruled_out: tuple[Option, ...]  # one per method, GPU and offload: the closest miss
    options: tuple[Option, ...] = ()  # every option weighed, each with its verdict (`why_not`)
    evaluated: int  # setups timed and priced
    pruned: int  # setups ruled out by memory before any time was estimated
    skipped: int = 0  # setups that fit but were not timed: GPU counts the search does not price
    notes: tuple[str, ...] = ()


def layout_strategies(offload: str, expert_degree: int = 1) -> list[str]:
    """The multi-GPU strategies that take `offload` and `expert_degree`."""
    return expert_strategies(OFFLOAD_STRATEGIES.get(offload, MULTI_GPU_STRATEGIES), expert_degree)


def _owned_cost(setup: Setup, num_queries: float, epochs: float) -> Setup:
    if setup.queries_per_s is None or setup.cost is None:
        return setup
    price = Price(provider=OWNED_PROVIDER, gpu=setup.gpu.name, usd_per_gpu_hour=0.0, date="", source_url="--own")
    cost = setup_cost(
        queries_per_s=setup.queries_per_s,
        num_gpus=setup.plan.num_gpus,
        price=price,
        num_queries=num_queries,
        epochs=epochs,
        startup_s=setup.cost.startup_s,
    )
    return dataclasses.replace(setup, cost=cost)


def _search(
    job: FineTuneJob,
    gpus: Sequence[GPU],
    *,
    owned: bool,
    max_gpus: int,
    gpus_per_node: int,
    num_queries: float,
    epochs: float,
    provider: str | None,
    prices_file,
    behaviour,
    needs: RankNeeds,
    global_batch: int | None,
) -> tuple[list[Option], list[str]]:
    """Every layout of `job` on `gpus` with each offload, and an MoE model's with each expert-parallel degree
    (`gpu_search.searched_expert_degrees`, without offload): the fewest GPUs that fit and that count doubled."""
    options: list[Option] = []
    notes: list[str] = runnable_strategies(MULTI_GPU_STRATEGIES, needs.framework)[1]
    degrees = searched_expert_degrees(job, offload="none", max_gpus=max_gpus)
    for offload, expert_degree in [(o, 1) for o in OFFLOAD_CHOICES] + [("none", e) for e in degrees]:
        strategies, _ = strategies_holding(job, layout_strategies(offload, expert_degree), offload)
        strategies, _ = runnable_strategies(strategies, needs.framework)
        one_gpu = not strategies and offload == "none" and expert_degree == 1  # one GPU needs no strategy
        strategies, limit = ([MULTI_GPU_STRATEGIES[0]], 1) if one_gpu else (strategies, max_gpus)
        if not strategies:  # 8-bit weights offloaded from sharded layouts, fp32 ones offloaded, none the framework runs
            continue
        answer = estimate_multi_gpu(
            job,
            gpus=gpus,
            strategies=strategies,
            gpus_per_node=gpus_per_node,
            max_gpus=limit,
            expert_degree=expert_degree,
            offload=offload,
            provider=None if owned else provider,
            prices_file=prices_file,
            num_queries=num_queries,
            epochs=epochs,
            behaviour=behaviour,
            more_gpus=True,
            needs=needs,
            require_fit=False,
            global_batch=global_batch,
        )
        notes.extend(answer.notes)
        for setup in answer.setups:
            if owned:
                setup = _owned_cost(setup, num_queries, epochs)
            options.append(
                Option(method=job.method, setup=setup, owned=owned, offload=offload, accumulation=job.grad_accum)
            )
    return options, notes


def _global_micro_batch(option: Option, global_batch: int) -> tuple[int, int] | str:
    """(micro-batch, accumulation) that keep the optimisation's batch at `global_batch` over the plan's micro-batches
    per step, with the largest micro-batch that fits and divides a rank's share; or why none does."""
    plan = option.setup.plan
    per_step = plan.micro_batch_slots
    if global_batch % per_step:
        ranks = f"{plan.dp} data-parallel ranks"
        ranks += f" x {plan.num_micro_batches} pipeline micro-batches" if plan.num_micro_batches > 1 else ""
        return f"global batch {global_batch} is not a multiple of {ranks}"
    share = global_batch // per_step
    micro = max(m for m in range(1, min(share, option.setup.micro_batch) + 1) if share % m == 0)
    return micro, share // micro


def model_parallel_of(plan: ParallelPlan) -> ModelParallel | None:
    """The TP/PP/CP part of `plan` (None: data parallelism only), to price the same layout again."""
    if plan.degree == 1:
        return None
    return ModelParallel(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(ModelParallel)})


def _with_global_batch(option: Option, job: FineTuneJob, global_batch: int | None, search: dict) -> Option:
    """`option` re-priced at the micro-batch x accumulation of `global_batch` (its own micro-batch without one)."""
    if global_batch is None or not option.setup.fits:
        return option
    chosen = _global_micro_batch(option, global_batch)
    if isinstance(chosen, str):
        return dataclasses.replace(option, why_not=chosen)
    micro, accumulation = chosen
    setup = option.setup
    if micro != setup.micro_batch or accumulation != job.grad_accum:  # the optimizer runs once per accumulation
        answer = estimate_multi_gpu(
            job.with_(grad_accum=accumulation),
            gpus=[setup.gpu],
            strategies=[MULTI_GPU_STRATEGIES[0] if setup.plan.strategy == "single" else setup.plan.strategy],
            num_gpus=setup.plan.num_gpus,
            gpus_per_node=setup.plan.node_size,
            expert_degree=setup.plan.expert_parallel,
            offload=option.offload,
            micro_batch=micro,
            model_parallel=model_parallel_of(setup.plan),
            **search,
        )
        (setup,) = [s for s in answer.setups if s.plan == setup.plan]
        if option.owned:
            setup = _owned_cost(setup, search["num_queries"], search["epochs"])
    return dataclasses.replace(option, setup=setup, accumulation=accumulation)


def pareto_front(options: Sequence[Option]) -> tuple[Option, ...]:
    """The options no other beats on both cost and hours, cheapest first; each the simplest of the options within
    1 % of it on both (`_simplest`), as `recommend` picks."""
    front: list[Option] = []
    for option in sorted(options, key=lambda o: (o.usd, o.hours, *_complexity(o))):
        if not front or option.hours < front[-1].hours:
            front.append(option)
    out: list[Option] = []
    for f in front:
        simplest = _simplest([o for o in options if _within_tie(o, f)], lambda o: (o.usd, o.hours))
        out += [] if any(simplest is o for o in out) else [simplest]
    return tuple(out)


def _verdict(option: Option, budget_usd: float | None, deadline_h: float | None) -> str:
    if option.why_not:
        return option.why_not
    if not option.setup.fits or option.setup.cost is None:
        return _does_not_fit(option)
    if budget_usd is not None and option.usd > budget_usd:
        return "over budget: ${} > ${}".format(*_apart(option.usd, budget_usd, 2))
    if deadline_h is not None and option.hours > deadline_h:
        return "past deadline: {} h > {} h".format(*_apart(option.hours, deadline_h, 1))
    return ""


def _apart(value: float, limit: float, decimals: int) -> tuple[str, str]:
    """`value` with `decimals` decimals, or the fewest more (up to 6) that show it above `limit`; `limit` as given."""
    d = next((d for d in range(decimals, 6) if round(value, d) > limit), 6)
    return f"{value:,.{d}f}", format(limit, ",f").rstrip("0").rstrip(".")


def _does_not_fit(option: Option) -> str:
    s = option.setup
    if s.fits and s.not_timed:
        return s.not_timed
    need, card = s.memory.nvidia_smi_bytes / BYTES_PER_GB, s.gpu.usable_memory_bytes / BYTES_PER_GB
    if s.fit == "borderline":
        return f"borderline: {need:.1f} GB per rank of {card:.1f} GB, inside the {100 * s.margin_fraction:g} % margin"
    if s.fit == "no":
        margin = f" ({need * (1 + s.margin_fraction):.1f} GB with the {100 * s.margin_fraction:g} % margin)"
        return f"does not fit: micro-batch 1 needs {need:.1f} GB per rank{margin} of {card:.1f} GB"
    return "no throughput estimate for this GPU"


def _closest_misses(options: Sequence[Option]) -> tuple[Option, ...]:
    """One ruled-out option per method, GPU, ownership and offload: the one closest to qualifying."""

    def closeness(o: Option) -> tuple[float, float]:  # what it misses by: dollars, hours, or memory then dollars
        by = {"over budget": (o.usd, o.hours), "past deadline": (o.hours, o.usd)}
        return by.get(o.why_not.split(":")[0], (1 - o.headroom_fraction, o.usd))

    best: dict[tuple, Option] = {}
    for o in options:
        key = (o.method, o.setup.gpu.name, o.owned, o.offload, o.why_not.split(":")[0])
        if key not in best or closeness(o) < closeness(best[key]):
            best[key] = o
    return tuple(sorted(best.values(), key=lambda o: (o.method, o.setup.gpu.name, o.offload)))


def _complexity(o: Option) -> tuple[int, bool, bool, int, int]:
    plan = o.setup.plan
    return plan.num_gpus, o.offload != "none", not o.owned, plan.degree, PREFERENCE.index(plan.strategy)


def _within_tie(option: Option, of: Option) -> bool:
    return option.usd <= of.usd * (1 + TIE_FRACTION) and option.hours <= of.hours * (1 + TIE_FRACTION)


def _simplest(options: Sequence[Option], key: Callable[[Option], tuple[float, float]]) -> Option:
    """The best by `key`, or, among the options within 1 % of it on both terms, the simplest to run: fewest GPUs,
    no offload, owned before rented, fewest model-parallel ranks, then `PREFERENCE`."""
    best = key(min(options, key=key))
    close = [o for o in options if all(v <= b * (1 + TIE_FRACTION) for v, b in zip(key(o), best))]
    return min(close, key=lambda o: (*_complexity(o), key(o)))


def recommend(
    feasible: Sequence[Option], budget_usd: float | None, deadline_h: float | None
) -> tuple[str, Option | None, str]:
    """(goal, the recommended option, why): cheapest by the deadline, fastest within the budget, else cheapest."""
    if not feasible:
        return "cheapest", None, "no setup meets the constraints (memory, budget, deadline)"
    if deadline_h is not None:
        goal, best = "cheapest within the deadline", _simplest(feasible, lambda o: (o.usd, o.hours))
    elif budget_usd is not None:
        goal, best = "fastest within the budget", _simplest(feasible, lambda o: (o.hours, o.usd))
    else:
        goal, best = "cheapest", _simplest(feasible, lambda o: (o.usd, o.hours))
    _, hi_usd = best.interval(best.usd)
    _, hi_hours = best.interval(best.hours)
    why = goal
    if budget_usd is not None and hi_usd > budget_usd:
        why += f"; its 95 % interval reaches ${hi_usd:,.2f}, over the ${budget_usd:,.2f} budget"
    if deadline_h is not None and hi_hours > deadline_h:
        why += f"; its 95 % interval reaches {hi_hours:.3g} h, past the {deadline_h:g} h deadline"
    return goal, best, why


def make_plan(
    jobs: Sequence[FineTuneJob],
    *,
    gpus: Sequence[GPU],
    own: Sequence[Owned] = (),
    max_gpus: int,
    gpus_per_node: int,
    num_queries: float,
    epochs: float,
    budget_usd: float | None = None,
    deadline_h: float | None = None,
    provider: str | None = None,
    prices_file=None,
    global_batch: int | None = None,
    behaviour=None,
    on_progress: Callable[[int, int, str], None] | None = None,
    host_cpu: str | None = None,
    framework: str | None = None,
) -> Plan:
    """Plan `jobs` (one per method) on the rented `gpus` and the `own`ed ones (on `host_cpu`'s machine, else a
    rented GPU's default host), run by `framework` (`EstimatorOptions.framework`); each sized at its longest batch's
    padded length and priced over its own lengths, as `estimate` sizes and prices it."""
    if framework is not None:
        framework_family(framework)  # an unknown framework is an error before the search
    rented = {job.method: RankNeeds(job.with_(batch_size=1), behaviour, framework) for job in jobs}
    mine = (
        {j.method: RankNeeds(j.with_(batch_size=1), behaviour, framework, host_cpu) for j in jobs}
        if host_cpu
        else rented
    )
    needs = {False: rented, True: mine}
    jobs = [sized_job(job) for job in jobs]
    groups = [(job, list(gpus), False, max_gpus, gpus_per_node) for job in jobs if gpus]
    groups += [(job, [o.gpu], True, o.count, o.count) for job in jobs for o in own]
    options: list[Option] = []
    notes: list[str] = []
    for i, (job, where, owned, limit, per_node) in enumerate(groups):
        if on_progress:
            on_progress(i, len(groups), f"{job.method} on {'owned ' if owned else ''}{len(where)} GPU type(s)")
        found, found_notes = _search(
            job,
            where,
            owned=owned,
            max_gpus=limit,
            gpus_per_node=per_node,
            num_queries=num_queries,
            epochs=epochs,
            provider=provider,
            prices_file=prices_file,
            behaviour=behaviour,
            needs=needs[owned][job.method],
            global_batch=global_batch,
        )
        search = {"num_queries": num_queries, "epochs": epochs, "needs": needs[owned][job.method]}
        search["prices_file"] = prices_file
        search["provider"] = None if owned else provider
        options += [_with_global_batch(o, job, global_batch, search) for o in found]
        notes += found_notes
    if on_progress:
        on_progress(len(groups), len(groups), "done")
    judged = [dataclasses.replace(o, why_not=_verdict(o, budget_usd, deadline_h)) for o in options]
    feasible = [o for o in judged if not o.why_not]
    goal, best, why = recommend(feasible, budget_usd, deadline_h)
    timed = sum(1 for o in options if o.setup.queries_per_s is not None)
    skipped = sum(1 for o in options if o.setup.fits and o.setup.not_timed)
    return Plan(
        model=jobs[0].model,
        goal=goal,
        recommended=best,
        reason=why,
        front=pareto_front(feasible),
        ruled_out=_closest_misses([o for o in judged if o.why_not and not (o.setup.fits and o.setup.not_timed)]),
        options=tuple(judged),
        evaluated=timed,
        pruned=len(options) - timed - skipped,
        skipped=skipped,
        notes=(METHOD_TRADES, *dict.fromkeys(notes)),
    )
