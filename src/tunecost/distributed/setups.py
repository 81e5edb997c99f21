"""Step time, cost and the GPU-count search for a fine-tune on several GPUs.

Per setup (GPU, strategy, number of GPUs):
- memory per rank from `rank_memory` (derived from the single-GPU simulated step; GPU-independent, traced once);
- compute per rank: the single-GPU step at the same micro-batch from the cross-GPU throughput model
  (`estimate.calibrated`);
- the step: that compute with the strategy's collectives, timed and overlapped by `timing`;
- throughput = N x micro-batch / step time (data parallel); cost = hours x billed GPUs x $ per GPU-hour at the
  catalog row with the lowest bill for N GPUs: N for a per-GPU row, N rounded up to whole nodes for a row that
  rents whole nodes (`catalog.prices.billed_gpus`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from tunecost.catalog.gpus import GPU
from tunecost.catalog.prices import Price, billed_gpus, cheapest_for
from tunecost.distributed import deepspeed_estimator, expert_parallel, overlap
from tunecost.distributed.plan import ParallelPlan
from tunecost.distributed.rank_memory import RankMemory, SingleGpuStep, rank_memory
from tunecost.distributed.timing import Links, StepCollective, default_links, step_time
from tunecost.errors import TunecostError
from tunecost.models.params import ParamCounts
from tunecost.workload.job import FineTuneJob

DEFAULT_MAX_GPUS = 64
MAX_SEARCH_GPUS = 100_000  # every count up to the limit is evaluated (arithmetic only)


@dataclass(frozen=True, kw_only=True)
class SetupCost:
    """The whole fine-tune on one setup: hours, and dollars at a catalog price (None without a price) for the
    GPUs billed (whole nodes where the price's row rents nodes)."""

    hours: float
    price: Price | None
    usd: float | None
    billed_gpus: int | None = None


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

    @property
    def fits(self) -> bool:
        return self.memory.need_bytes <= self.gpu.usable_memory_bytes

    @property
    def exposed_comm_share(self) -> float | None:
        return self.timing.exposed_comm_share if self.timing is not None else None

    @property
    def usd(self) -> float | None:
        return self.cost.usd if self.cost is not None else None


def setup_cost(
    *, queries_per_s: float, num_gpus: int, price: Price | None, num_queries: float, epochs: float
) -> SetupCost:
    """Hours of the fine-tune at `queries_per_s` (all ranks), and dollars: hours x billed GPUs x $ per GPU-hour
    (§V-C; the GPUs billed are `num_gpus` rounded up to the price's whole nodes)."""
    from tunecost.estimate.paper import training_hours, usd_for_hours

    hours = training_hours(num_queries=num_queries, epochs=epochs, queries_per_s=queries_per_s)
    if price is None:
        return SetupCost(hours=hours, price=None, usd=None)
    billed = billed_gpus(num_gpus, price)
    usd = usd_for_hours(hours=hours, usd_per_gpu_hour=price.usd_per_gpu_hour, num_gpus=billed)
    return SetupCost(hours=hours, price=price, usd=usd, billed_gpus=billed)


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
) -> Setup:
    """Memory, step time, throughput and (given a workload) cost of one setup; with `param_counts`, DeepSpeed's
    own estimate beside a zero2 or zero3 rank's memory."""
    deepspeed = deepspeed_estimator.gpu_bytes(plan, param_counts) if param_counts is not None else None
    base = Setup(gpu=gpu, plan=plan, memory=rank_memory(step, job, plan), deepspeed_estimate_bytes=deepspeed)
    if not base.fits or not single_gpu_queries_per_s:
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


def single_gpu_queries_per_s(job: FineTuneJob, gpu: GPU) -> tuple[float | None, str]:
    """A rank's compute: the single-GPU queries/s of the job's micro-batch, as `estimate --estimator simulate`
    predicts it (eq. (2) where it was fitted for this model and GPU, else the cross-GPU throughput model)."""
    from tunecost.estimate.estimators import EstimateRequest
    from tunecost.estimate.simulated import _throughput

    qps, _interval, notes = _throughput(EstimateRequest(job=job, gpu=gpu), job.batch_size)
    return qps, f"{gpu.name}: per-rank compute: " + "; ".join(notes)


def estimate_multi_gpu(
    job: FineTuneJob,
    *,
    gpus: Sequence[GPU],
    strategies: Sequence[str],
    num_gpus: int | None = None,
    gpus_per_node: int = 8,
    max_gpus: int = DEFAULT_MAX_GPUS,
    node_link: str | None = None,
    expert_degree: int = 1,
    offload: str = "none",
    provider: str | None = None,
    prices_file=None,
    num_queries: float | None = None,
    epochs: float | None = None,
) -> MultiGpuEstimate:
    """Evaluate `job` on each GPU x strategy x number of GPUs (`num_gpus`, or every valid count up to `max_gpus`).
    With no `num_gpus`, a job that fits no count up to `max_gpus` is an error; the search then takes the counts
    that the expert-parallel degree `expert_degree` divides."""
    from tunecost.catalog.models import resolve_model
    from tunecost.catalog.prices import price_catalog, prices_for
    from tunecost.distributed.rank_memory import single_gpu_step
    from tunecost.models.params import count_parameters

    if not 1 <= max_gpus <= MAX_SEARCH_GPUS:
        raise TunecostError(f"the GPU limit must be between 1 and {MAX_SEARCH_GPUS}, got {max_gpus}")
    counts = [num_gpus] if num_gpus is not None else valid_gpu_counts(gpus_per_node, max_gpus, expert_degree)
    if not counts:
        raise TunecostError(
            f"no GPU count up to {max_gpus} is a multiple of the expert-parallel degree {expert_degree}"
        )
    plans = [
        ParallelPlan(
            num_gpus=n, gpus_per_node=gpus_per_node, strategy=s, expert_parallel=expert_degree, offload=offload
        )
        for s in strategies
        for n in counts
    ]
    spec = resolve_model(job.model)
    for plan in plans[:: len(counts)]:  # one plan per strategy
        expert_parallel.check_expert_parallel(plan, num_experts=spec.num_experts, model=spec.name)
    links_by_gpu = {gpu.name: default_links(gpu, gpus_per_node, node_link) for gpu in gpus}  # errors before tracing
    step = single_gpu_step(job)
    param_counts = count_parameters(spec, job.experts_per_token) if {"zero2", "zero3"} & set(strategies) else None
    prices = price_catalog(prices_file)
    setups: list[Setup] = []
    notes: list[str] = []
    for gpu in gpus:
        qps, note = single_gpu_queries_per_s(job, gpu)
        notes.append(note)
        links = links_by_gpu[gpu.name]
        gpu_prices = prices_for(gpu.name, prices, provider, whole_nodes=True)
        if not gpu_prices:
            notes.append(f"no price for {gpu.name}" + (f" from {provider}" if provider else "") + " in the catalog")
        notes.append(f"{gpu.name}: links {links.node.name} in a node, {links.nics_per_node} x {links.network.name}")
        for plan in plans:
            setups.append(
                evaluate_setup(
                    step,
                    job,
                    gpu,
                    plan,
                    single_gpu_queries_per_s=qps,
                    links=links,
                    prices=gpu_prices,
                    num_queries=num_queries,
                    epochs=epochs,
                    param_counts=param_counts,
                )
            )
    if num_gpus is None and not any(s.fits for s in setups):
        raise TunecostError(
            f"{step.model} ({job.method}) fits no setup of up to {max_gpus} GPUs "
            f"({', '.join(g.name for g in gpus)}; {', '.join(strategies)}); raise the limit or change the job"
        )
    notes.append(
        "cost = hours x billed GPUs x $ per GPU-hour, at the catalog row with the lowest bill for the count: a row "
        "that rents whole nodes bills the count rounded up to whole nodes"
    )
    if param_counts is not None:
        notes.append(deepspeed_estimator.ASSUMPTION)
    return MultiGpuEstimate(
        model=step.model,
        method=job.method,
        batch_size=job.batch_size,
        seq_len=step.seq_len,
        setups=tuple(setups),
        notes=tuple(notes),
        assumptions=setups[0].memory.assumptions if setups else (),
    )
