"""Step time and cost of a fine-tune on one multi-GPU setup (the search over setups: `gpu_search`).

Sources and derivations: docs/multi-gpu.md, section `tunecost.estimate.setups`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from tunecost.catalog.gpus import GPU
from tunecost.catalog.prices import Price, billed_gpus, cheapest_for
from tunecost.distributed import deepspeed_estimator, model_parallel, overlap
from tunecost.distributed.model_parallel_step import lm_head_layers, model_parallel_step_time
from tunecost.distributed.rank_memory import RankMemory, SingleGpuStep, rank_memory
from tunecost.distributed.timing import Links, StepCollective, step_time
from tunecost.estimate.paper import training_hours, usd_for_hours
from tunecost.models.catalog import resolve_model
from tunecost.models.params import ParamCounts
from tunecost.simulate.batch import default_margin_fraction, fit_verdict
from tunecost.workload.job import FineTuneJob
from tunecost.workload.parallel import ParallelPlan

COST_NOTE = (
    "cost = hours x billed GPUs x $ per GPU-hour, at the catalog row with the lowest bill for the count: a row "
    "that rents whole nodes bills the count rounded up to whole nodes"
)


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
    not_timed: str = ""  # why a search left a setup that fits untimed (a count it does not price)

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
    queries_per_row: float = 1.0,
    fused_adamw: bool = False,
    optimizer_fraction: float | None = None,
) -> Setup:
    """Memory, step time, throughput and (given a workload) cost of one setup at the job's micro-batch; with
    `param_counts`, DeepSpeed's own estimate beside a zero2 or zero3 rank's memory; `queries_per_row`: the queries a
    packed row holds (the micro-batch counts rows); `fused_adamw`: the job runs torch's fused AdamW (an offloaded
    FSDP optimizer's host step); `optimizer_fraction`: the optimizer's share of the single-GPU step, which each rank
    runs over its shard of the states (`timing.rank_optimizer_seconds`)."""
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
    compute = job.batch_size * queries_per_row / single_gpu_queries_per_s  # one micro-step, in seconds
    optimizer = None if optimizer_fraction is None else optimizer_fraction * compute
    if plan.degree == 1:
        timed, collectives = step_time(
            step,
            plan,
            links,
            compute,
            fused_adamw=fused_adamw,
            optimizer_seconds=optimizer,
            accumulation=job.grad_accum,
        )
    else:
        timed, collectives = model_parallel_time(
            step, job, plan, links, compute, fused_adamw=fused_adamw, optimizer_fraction=optimizer_fraction
        )
    micro_steps = plan.num_micro_batches if plan.degree > 1 else 1  # data-parallel: the time of one micro-step
    qps = plan.dp * micro_steps * job.batch_size * queries_per_row / timed.step_seconds
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


def model_parallel_time(
    step: SingleGpuStep,
    job: FineTuneJob,
    plan: ParallelPlan,
    links: Links,
    whole_model_seconds: float,
    *,
    fused_adamw: bool = False,
    optimizer_fraction: float | None = None,
) -> tuple[overlap.StepTime, tuple[StepCollective, ...]]:
    """A TP/PP/CP rank's step from its whole-model TP/CP step `step`: the first stage (most in flight), at the
    pace of the pipeline's slowest rank (the LM head's GEMM counted in layers' worth)."""
    stage = model_parallel.first_stage(step, plan)
    spec = resolve_model(job.model)
    head = lm_head_layers(spec, job.experts_per_token, step.seq_len * plan.cp) if plan.pp > 1 else 0.0
    return model_parallel_step_time(
        stage,
        plan,
        links,
        whole_model_seconds,
        spec=spec,
        fused_adamw=fused_adamw,
        optimizer_fraction=optimizer_fraction,
        head_layers=head,
    )


def smallest_fitting(setups: Sequence[Setup]) -> dict[tuple[str, str], Setup]:
    """(GPU name, strategy) -> the setup with the fewest GPUs that fits."""
    out: dict[tuple[str, str], Setup] = {}
    for s in sorted(setups, key=lambda s: s.plan.num_gpus):
        if s.fits and (s.gpu.name, s.plan.layout_name) not in out:
            out[(s.gpu.name, s.plan.layout_name)] = s
    return out


def cost_order(s: Setup) -> tuple[bool, float, int, int]:
    """Sort key of setups: least cost, unpriced last; of equal cost, the fewest GPUs, then least memory per rank."""
    return (s.usd is None, s.usd or 0.0, s.plan.num_gpus, s.memory.nvidia_smi_bytes)


def cheapest(setups: Sequence[Setup]) -> Setup | None:
    """The fitting setup of least cost (`cost_order`)."""
    return min((s for s in setups if s.fits and s.usd is not None), key=cost_order, default=None)


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
