"""Step time, cost and the GPU-count search for a fine-tune on several GPUs.

Sources and derivations: docs/multi-gpu.md, section `tunecost.estimate.setups`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tunecost.catalog.gpus import GPU
from tunecost.catalog.prices import Price, billed_gpus, cheapest_for, price_catalog, prices_for
from tunecost.distributed import deepspeed_estimator, expert_parallel, overlap
from tunecost.distributed.rank_memory import RankMemory, SingleGpuStep, rank_memory, single_gpu_step
from tunecost.distributed.timing import Links, StepCollective, default_links, step_time
from tunecost.errors import TunecostError
from tunecost.estimate.estimators import EstimateRequest, EstimatorOptions
from tunecost.estimate.paper import training_hours, usd_for_hours
from tunecost.estimate.simulated import Throughput, throughput_at
from tunecost.io import atomic_write_json
from tunecost.models.catalog import resolve_model
from tunecost.models.params import ParamCounts, count_parameters
from tunecost.simulate import cache
from tunecost.simulate.batch import MAX_BATCH, default_margin_fraction, fit_verdict, margin_note, search_with_margin
from tunecost.simulate.overhead import DEFAULT_OVERHEAD
from tunecost.workload.job import FineTuneJob
from tunecost.workload.parallel import DEFAULT_MAX_GPUS, MAX_SEARCH_GPUS, ParallelPlan

MAX_MICRO_BATCH = MAX_BATCH  # the micro-batch search's cap per rank: one GPU's
RANK_MEMORY_VERSION = "1"  # of the rank memories kept on disk (`RankNeeds`); bump when rank_memory changes


@dataclass(frozen=True, kw_only=True)
class SetupCost:
    """The whole fine-tune on one setup: hours, and dollars at a catalog price (None without a price) for the
    GPUs billed (whole nodes where the price's row rents nodes)."""

    hours: float
    price: Price | None
    usd: float | None
    billed_gpus: int | None = None
    startup_s: float = 0.0  # the run's one start-up, included in `hours`


@dataclass(frozen=True, kw_only=True)
class Setup:
    """One (GPU, layout) answer: memory per rank, and where it fits, step time, throughput and cost."""

    gpu: GPU
    plan: ParallelPlan
    memory: RankMemory
    timing: overlap.StepTime | None = None  # one step: compute alone, and with the exposed communication
    deepspeed_estimate_bytes: int | None = None  # DeepSpeed's own estimator (zero2, zero3), see deepspeed_estimator
    comm_seconds: float | None = None  # all collectives of a step, hidden or not
    collectives: tuple[StepCollective, ...] = ()  # one step's, hidden or not
    queries_per_s: float | None = None  # every rank together
    cost: SetupCost | None = None
    micro_batch: int = 1  # per rank
    borderline_micro_batch: int = 0  # largest micro-batch within the card without the safety margin
    margin_fraction: float = 0.0
    interval_ratio: tuple[float, float] | None = None  # the rank's throughput interval / its point estimate
    extrapolation: tuple[str, ...] = ()  # why the throughput lies outside the calibrated range, if it does

    @property
    def fit(self) -> str:
        """ "yes", "borderline" (only inside the safety margin) or "no": nvidia-smi memory against the card."""
        return fit_verdict(self.memory.nvidia_smi_bytes, self.gpu.usable_memory_bytes, self.margin_fraction)

    @property
    def fits(self) -> bool:
        return self.fit == "yes"

    @property
    def exposed_comm_share(self) -> float | None:
        return self.timing.exposed_comm_share if self.timing is not None else None

    @property
    def usd(self) -> float | None:
        return self.cost.usd if self.cost is not None else None


def setup_cost(
    *,
    queries_per_s: float,
    num_gpus: int,
    price: Price | None,
    num_queries: float,
    epochs: float,
    startup_s: float = 0.0,
) -> SetupCost:
    """Hours of the fine-tune at `queries_per_s` (all ranks) plus its one start-up, and dollars: hours x billed
    GPUs x $ per GPU-hour (§V-C; the GPUs billed are `num_gpus` rounded up to the price's whole nodes)."""
    hours = training_hours(num_queries=num_queries, epochs=epochs, queries_per_s=queries_per_s) + startup_s / 3600
    if price is None:
        return SetupCost(hours=hours, price=None, usd=None, startup_s=startup_s)
    billed = billed_gpus(num_gpus, price)
    usd = usd_for_hours(hours=hours, usd_per_gpu_hour=price.usd_per_gpu_hour, num_gpus=billed)
    return SetupCost(hours=hours, price=price, usd=usd, billed_gpus=billed, startup_s=startup_s)


def valid_gpu_counts(gpus_per_node: int, max_gpus: int, expert_parallel: int = 1) -> list[int]:
    """1 .. GPUs per node, then whole nodes, up to `max_gpus`; only multiples of the expert-parallel degree."""
    return [
        n for n in range(expert_parallel, max_gpus + 1, expert_parallel) if n <= gpus_per_node or n % gpus_per_node == 0
    ]


def evaluate_setup(
    step: SingleGpuStep,
    job: FineTuneJob,
    gpu: GPU,
    plan: ParallelPlan,
    *,
    single_gpu_queries_per_s: float | None,
    links: Links,
    prices: Sequence[Price] = (),
    num_queries: float | None = None,
    epochs: float | None = None,
    param_counts: ParamCounts | None = None,
    memory: RankMemory | None = None,
    startup_s: float = 0.0,
    borderline_micro_batch: int = 0,
    margin_fraction: float | None = None,
) -> Setup:
    """Memory, step time, throughput and (given a workload) cost of one setup at the job's micro-batch; with
    `param_counts`, DeepSpeed's own estimate beside a zero2 or zero3 rank's memory."""
    deepspeed = deepspeed_estimator.gpu_bytes(plan, param_counts) if param_counts is not None else None
    base = Setup(
        gpu=gpu,
        plan=plan,
        memory=memory or rank_memory(step, job, plan),
        deepspeed_estimate_bytes=deepspeed,
        micro_batch=job.batch_size,
        borderline_micro_batch=borderline_micro_batch,
        margin_fraction=default_margin_fraction() if margin_fraction is None else margin_fraction,
    )
    if base.fit == "no" or not single_gpu_queries_per_s:
        return base
    compute = job.batch_size / single_gpu_queries_per_s
    timed, collectives = step_time(step, plan, links, compute)
    qps = plan.num_gpus * job.batch_size / timed.step_seconds
    cost = None
    if num_queries and epochs:
        cost = setup_cost(
            queries_per_s=qps,
            num_gpus=plan.num_gpus,
            price=cheapest_for(plan.num_gpus, list(prices)),
            num_queries=num_queries,
            epochs=epochs,
            startup_s=startup_s,
        )
    return dataclasses.replace(
        base,
        timing=timed,
        comm_seconds=sum(c.total_seconds for c in collectives),
        collectives=collectives,
        queries_per_s=qps,
        cost=cost,
    )


def smallest_fitting(setups: Sequence[Setup]) -> dict[tuple[str, str], Setup]:
    """(GPU name, strategy) -> the setup with the fewest GPUs that fits."""
    out: dict[tuple[str, str], Setup] = {}
    for s in sorted(setups, key=lambda s: s.plan.num_gpus):
        if s.fits and (s.gpu.name, s.plan.strategy) not in out:
            out[(s.gpu.name, s.plan.strategy)] = s
    return out


def fastest(setups: Sequence[Setup]) -> Setup | None:
    timed = [(s.cost.hours, s.plan.num_gpus, i) for i, s in enumerate(setups) if s.fits and s.cost is not None]
    return setups[min(timed)[2]] if timed else None


def cheapest(setups: Sequence[Setup]) -> Setup | None:
    priced = [(s.usd, s.plan.num_gpus, i) for i, s in enumerate(setups) if s.fits and s.usd is not None]
    return setups[min(priced)[2]] if priced else None


@dataclass(frozen=True, kw_only=True)
class MultiGpuEstimate:
    """Every setup evaluated for one job, and what the numbers rest on."""

    model: str
    method: str
    batch_size: int  # per rank (micro-batch)
    seq_len: int
    setups: tuple[Setup, ...]
    notes: tuple[str, ...] = field(default=())
    assumptions: tuple[str, ...] = field(default=())

    @property
    def smallest_fitting(self) -> dict[tuple[str, str], Setup]:
        return smallest_fitting(self.setups)

    @property
    def cheapest(self) -> Setup | None:
        return cheapest(self.setups)


def single_gpu_throughput(job: FineTuneJob, gpu: GPU, steady_state: bool = False) -> tuple[Throughput, str]:
    """A rank's compute: the single-GPU steady-state queries/s of the job's micro-batch, as `estimate` predicts it
    (eq. (2) where it was fitted for this model and GPU, else the cross-GPU throughput model), with the run's
    one start-up."""
    options = EstimatorOptions(steady_state=steady_state)
    tp = throughput_at(EstimateRequest(job=job, gpu=gpu, options=options), job.batch_size)
    return tp, f"{gpu.name}: per-rank compute: " + "; ".join(tp.notes)


class RankNeeds:
    """One rank's memory per (layout, micro-batch), each simulated step and rank replay computed once: the
    same for every GPU (a GPU only changes the budget). The rank memories are kept on disk beside the step they
    come from (`flush`), so a search that was run before replays nothing."""

    def __init__(self, job: FineTuneJob, behaviour=None) -> None:
        self.job, self.behaviour = job, behaviour
        self._steps: dict[int, SingleGpuStep] = {}
        self._memory: dict[tuple[ParallelPlan, int], RankMemory] = {}
        self._disk: dict[int, dict[str, dict]] = {}  # batch -> plan key -> RankMemory fields
        self._dirty: set[int] = set()
        self.throughputs: dict[tuple[str, bool], dict[int, tuple[Throughput, str]]] = {}  # (GPU, steady) -> batch

    def job_at(self, batch: int) -> FineTuneJob:
        return self.job.with_(batch_size=batch)

    def step(self, batch: int) -> SingleGpuStep:
        if batch not in self._steps:
            self._steps[batch] = single_gpu_step(self.job_at(batch), behaviour=self.behaviour)
        return self._steps[batch]

    def memory(self, plan: ParallelPlan, batch: int) -> RankMemory:
        if (plan, batch) not in self._memory:
            saved, key = self._saved(batch), json.dumps(dataclasses.asdict(plan), sort_keys=True)
            if key in saved:
                memory = RankMemory(**{**saved[key], "assumptions": tuple(saved[key]["assumptions"])})
            else:
                memory = rank_memory(self.step(batch), self.job_at(batch), plan)
                saved[key] = dataclasses.asdict(memory)
                self._dirty.add(batch)
            self._memory[(plan, batch)] = memory
        return self._memory[(plan, batch)]

    def _path(self, batch: int) -> Path:
        job = self.job_at(batch)
        key = cache.job_key(job, None, job.stack, DEFAULT_OVERHEAD, 512, self.behaviour)
        return cache.cache_dir() / f"rankmem-{RANK_MEMORY_VERSION}-{key}.json"

    def _saved(self, batch: int) -> dict[str, dict]:
        if batch not in self._disk:
            try:
                self._disk[batch] = json.loads(self._path(batch).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self._disk[batch] = {}
        return self._disk[batch]

    def flush(self) -> None:
        """Write the rank memories computed since the last flush (a cache that cannot be written is no error)."""
        for batch in sorted(self._dirty):
            try:
                self._path(batch).parent.mkdir(parents=True, exist_ok=True)
                atomic_write_json(self._path(batch), self._disk[batch])
            except (OSError, TunecostError):
                pass
        self._dirty.clear()

    def largest_micro_batch(self, plan: ParallelPlan, gpu: GPU, margin_fraction: float) -> tuple[int, int]:
        """(largest micro-batch that fits `gpu` with the margin, largest within it without): the search
        `memory` and `estimate` run on one GPU."""
        return search_with_margin(
            lambda b: self.memory(plan, b).nvidia_smi_bytes,
            gpu.usable_memory_bytes,
            margin_fraction,
            max_batch=MAX_MICRO_BATCH,
        )


def layout_plans(
    n: int, strategies: Sequence[str], *, gpus_per_node: int, expert_degree: int, offload: str
) -> list[ParallelPlan]:
    """The layouts of `n` GPUs: one GPU without offload or expert parallelism is just that ("single"), whatever
    the strategies asked."""
    if n == 1 and offload == "none" and expert_degree == 1:
        return [ParallelPlan()]
    return [
        ParallelPlan(
            num_gpus=n, gpus_per_node=gpus_per_node, strategy=s, expert_parallel=expert_degree, offload=offload
        )
        for s in strategies
    ]


def estimate_multi_gpu(
    job: FineTuneJob,
    *,
    gpus: Sequence[GPU],
    strategies: Sequence[str],
    num_gpus: int | Mapping[str, int] | None = None,
    gpus_per_node: int = 8,
    max_gpus: int = DEFAULT_MAX_GPUS,
    node_link: str | None = None,
    expert_degree: int = 1,
    offload: str = "none",
    provider: str | None = None,
    prices_file=None,
    num_queries: float | None = None,
    epochs: float | None = None,
    micro_batch: int | None = None,
    margin_fraction: float | None = None,
    steady_state: bool = False,
    behaviour=None,
    more_gpus: bool = False,
    needs: RankNeeds | None = None,
    require_fit: bool = True,
) -> MultiGpuEstimate:
    """Evaluate `job` on each GPU x layout: `num_gpus` GPUs (one count, or a count per GPU name), or every valid
    count up to `max_gpus` (the counts the expert-parallel degree divides). Each setup runs `micro_batch` per
    rank, or the largest that fits with the safety margin (the search of one GPU); with no `num_gpus`, only the
    fewest GPUs that fit per GPU and strategy are searched and costed (`more_gpus`: and that count doubled, up to
    `max_gpus`). Fitting nothing at all is an error then. `needs`: the job's rank memory and throughputs already
    computed (the same job with another offload or count); without `require_fit`, fitting nothing is an answer."""
    if not 1 <= max_gpus <= MAX_SEARCH_GPUS:
        raise TunecostError(f"the GPU limit must be between 1 and {MAX_SEARCH_GPUS}, got {max_gpus}")
    margin = default_margin_fraction() if margin_fraction is None else margin_fraction
    counts_by_gpu = {g.name: gpu_counts(g.name, num_gpus, gpus_per_node, max_gpus, expert_degree) for g in gpus}
    if not any(counts_by_gpu.values()):
        raise TunecostError(
            f"no GPU count up to {max_gpus} is a multiple of the expert-parallel degree {expert_degree}"
        )
    spec = resolve_model(job.model)
    for s in strategies:
        n = max(max(c) for c in counts_by_gpu.values() if c)
        expert_parallel.check_expert_parallel(
            ParallelPlan(
                num_gpus=n, gpus_per_node=gpus_per_node, strategy=s, expert_parallel=expert_degree, offload=offload
            ),
            num_experts=spec.num_experts,
            model=spec.name,
        )
    links_by_gpu = {gpu.name: default_links(gpu, gpus_per_node, node_link) for gpu in gpus}  # errors before tracing
    needs = needs or RankNeeds(job.with_(batch_size=1), behaviour)
    param_counts = count_parameters(spec, job.experts_per_token) if {"zero2", "zero3"} & set(strategies) else None
    prices = price_catalog(prices_file)
    setups: list[Setup] = []
    notes: list[str] = []
    noted: set[str] = set()
    for gpu in gpus:
        links = links_by_gpu[gpu.name]
        gpu_prices = prices_for(gpu.name, prices, provider, whole_nodes=True)
        if not gpu_prices:
            notes.append(f"no price for {gpu.name}" + (f" from {provider}" if provider else "") + " in the catalog")
        throughputs = needs.throughputs.setdefault((gpu.name, steady_state), {})

        def evaluate(
            plan: ParallelPlan,
            batch: int,
            border: int,
            gpu: GPU = gpu,
            links: Links = links,
            gpu_prices: list[Price] = gpu_prices,
            throughputs: dict[int, tuple[Throughput, str]] = throughputs,
        ) -> Setup:
            if batch not in throughputs:
                throughputs[batch] = single_gpu_throughput(needs.job_at(batch), gpu, steady_state)
            tp, note = throughputs[batch]
            if gpu.name not in noted:  # the first micro-batch's, once per GPU
                noted.add(gpu.name)
                notes.append(note)
            qps = tp.queries_per_s
            ratio = (tp.interval[0] / qps, tp.interval[1] / qps) if tp.interval and qps else None
            outside = tuple(n.removeprefix("extrapolation: ") for n in tp.notes if n.startswith("extrapolation: "))
            setup = evaluate_setup(
                needs.step(batch),
                needs.job_at(batch),
                gpu,
                plan,
                single_gpu_queries_per_s=qps,
                links=links,
                prices=gpu_prices,
                num_queries=num_queries,
                epochs=epochs,
                param_counts=param_counts,
                memory=needs.memory(plan, batch),
                startup_s=tp.startup_s,
                borderline_micro_batch=border,
                margin_fraction=margin,
            )
            return dataclasses.replace(setup, interval_ratio=ratio, extrapolation=outside)

        found: dict[str, int] = {}  # strategy -> its fewest GPUs that fit (no num_gpus)
        for n in counts_by_gpu[gpu.name]:
            for plan in layout_plans(
                n, strategies, gpus_per_node=gpus_per_node, expert_degree=expert_degree, offload=offload
            ):
                first = needs.memory(plan, 1)
                fits_one = fit_verdict(first.nvidia_smi_bytes, gpu.usable_memory_bytes, margin) == "yes"
                fewest = found.get(plan.strategy)
                wanted = fewest is None or (more_gpus and n % fewest == 0 and (n // fewest).bit_count() == 1)
                if micro_batch is not None:
                    setups.append(evaluate(plan, micro_batch, 0))
                elif num_gpus is None and (not wanted or not fits_one):
                    setups.append(Setup(gpu=gpu, plan=plan, memory=first, margin_fraction=margin))
                else:
                    lo, border = needs.largest_micro_batch(plan, gpu, margin)
                    setups.append(evaluate(plan, max(lo, 1), border))
                    if lo and fewest is None:
                        found.update(dict.fromkeys(strategies if plan.strategy == "single" else (plan.strategy,), n))
        notes.append(f"{gpu.name}: links {links.node.name} in a node, {links.nics_per_node} x {links.network.name}")
    needs.flush()
    if num_gpus is None and require_fit and not any(s.fits for s in setups):
        raise TunecostError(
            f"{spec.name} ({job.method}) fits no setup of up to {max_gpus} GPUs "
            f"({', '.join(g.name for g in gpus)}; {', '.join(strategies)}); raise the limit or change the job"
        )
    notes.append(
        "cost = hours x billed GPUs x $ per GPU-hour, at the catalog row with the lowest bill for the count: a row "
        "that rents whole nodes bills the count rounded up to whole nodes"
    )
    if param_counts is not None:
        notes.append(deepspeed_estimator.ASSUMPTION)
    return MultiGpuEstimate(
        model=spec.name,
        method=job.method,
        batch_size=micro_batch or 0,
        seq_len=job.worst_case_seq_len,
        setups=tuple(setups),
        notes=tuple(notes),
        assumptions=(*setups[0].memory.assumptions, margin_note(margin)) if setups else (),
    )


def gpu_counts(
    gpu: str, num_gpus: int | Mapping[str, int] | None, gpus_per_node: int, max_gpus: int, expert_degree: int
) -> list[int]:
    """The GPU counts evaluated for `gpu`: its own count, the one count, or every valid count up to `max_gpus`."""
    if isinstance(num_gpus, Mapping):
        return [num_gpus[gpu]]
    if num_gpus is not None:
        return [num_gpus]
    return valid_gpu_counts(gpus_per_node, max_gpus, expert_degree)
