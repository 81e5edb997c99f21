"""Step time, cost and the GPU-count search for a fine-tune on several GPUs.

Per setup (GPU, strategy, number of GPUs):
- memory per rank from `rank_memory` (derived from the single-GPU simulated step; GPU-independent, traced once);
- compute per rank: the single-GPU step at the same micro-batch from the cross-GPU throughput model
  (`estimate.calibrated`), split into forward, backward (with recompute) and optimizer by the simulated FLOPs,
  and evenly over the decoder layers;
- communication per step: the collectives the strategy issues (sizes from the same step), timed with nccl-tests'
  bus-bandwidth definitions (`comm`) over the interconnect catalog, hidden under compute per `overlap`;
- throughput = N x micro-batch / step time (data parallel); cost = hours x N x the provider's $ per GPU-hour.
  The price catalog has per-GPU prices only, so a node costs its GPUs' price.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from tunecost.catalog.gpus import GPU
from tunecost.catalog.interconnects import Interconnect, resolve_interconnect
from tunecost.catalog.prices import Price
from tunecost.distributed import comm, overlap
from tunecost.distributed.plan import ParallelPlan
from tunecost.distributed.rank_memory import (
    PARAM_SHARDED,
    RankMemory,
    SingleGpuStep,
    rank_memory,
    shard_group_size,
)
from tunecost.errors import TunecostError
from tunecost.workload.job import FineTuneJob

DEFAULT_MAX_GPUS = 64
MAX_SEARCH_GPUS = 100_000  # every count up to the limit is evaluated (arithmetic only)
DDP_BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb default
# Links assumed when none is named: the node's GPU link (by GPU family) and, between nodes, one NIC per GPU.
DEFAULT_NODE_LINK = {"H100-80GB-SXM": "NVLink4", "H200-141GB": "NVLink4", "A100-80GB-SXM": "NVLink3"}
DEFAULT_NODE_LINK_OTHER = "PCIe4"
DEFAULT_NETWORK = {"H100-80GB-SXM": "InfiniBand-NDR", "H200-141GB": "InfiniBand-NDR"}
DEFAULT_NETWORK_OTHER = "InfiniBand-HDR"


@dataclass(frozen=True, kw_only=True)
class Links:
    node: Interconnect  # between the GPUs of one node
    network: Interconnect  # one NIC between nodes
    nics_per_node: int

    def bus_bandwidth_bytes_per_s(self, num_ranks: int, gpus_per_node: int) -> tuple[float, float]:
        """(bus bandwidth, latency) of a collective over `num_ranks` ranks: the node link within one node; across
        nodes the slower of the node link and the node's NICs (a ring crosses the network)."""
        if num_ranks <= gpus_per_node:
            return self.node.bus_bandwidth_bytes_per_s, self.node.latency_seconds
        network = comm.inter_node_bus_bandwidth_bytes_per_s(self.network.bus_bandwidth_bytes_per_s, self.nics_per_node)
        latency = max(self.node.latency_seconds, self.network.latency_seconds)
        return min(self.node.bus_bandwidth_bytes_per_s, network), latency


def default_links(gpu: GPU, gpus_per_node: int, node_link: str | None = None) -> Links:
    node = resolve_interconnect(node_link or DEFAULT_NODE_LINK.get(gpu.name, DEFAULT_NODE_LINK_OTHER))
    if node.scope != "node":
        raise TunecostError(f"{node.name} links nodes, not the GPUs of one node; name a node link (NVLink, PCIe)")
    network = resolve_interconnect(DEFAULT_NETWORK.get(gpu.name, DEFAULT_NETWORK_OTHER))
    return Links(node=node, network=network, nics_per_node=gpus_per_node)


@dataclass(frozen=True, kw_only=True)
class SetupCost:
    """The whole fine-tune on one setup: hours, and dollars at the GPU's catalog price (None without a price)."""

    hours: float
    price: Price | None
    usd: float | None


@dataclass(frozen=True, kw_only=True)
class Setup:
    """One (GPU, layout) answer: memory per rank, and where it fits, step time, throughput and cost."""

    gpu: GPU
    plan: ParallelPlan
    memory: RankMemory
    timing: overlap.StepTime | None = None  # one step: compute alone, and with the exposed communication
    comm_seconds: float | None = None  # all collectives of a step, hidden or not
    queries_per_s: float | None = None  # every rank together
    cost: SetupCost | None = None

    @property
    def fits(self) -> bool:
        return self.memory.need_bytes <= self.gpu.memory_bytes

    @property
    def exposed_comm_share(self) -> float | None:
        return self.timing.exposed_comm_share if self.timing is not None else None

    @property
    def usd(self) -> float | None:
        return self.cost.usd if self.cost is not None else None


def setup_cost(
    *, queries_per_s: float, num_gpus: int, price: Price | None, num_queries: float, epochs: float
) -> SetupCost:
    """Hours of the fine-tune at `queries_per_s` (all ranks), and dollars: hours x GPUs x $ per GPU-hour (§V-C)."""
    from tunecost.estimate.paper import training_hours, usd_for_hours

    hours = training_hours(num_queries=num_queries, epochs=epochs, queries_per_s=queries_per_s)
    usd = (
        usd_for_hours(hours=hours, usd_per_gpu_hour=price.usd_per_gpu_hour, num_gpus=num_gpus)
        if price is not None
        else None
    )
    return SetupCost(hours=hours, price=price, usd=usd)


def phase_seconds(step: SingleGpuStep, step_seconds: float) -> tuple[float, float, float]:
    """(forward, backward + recompute, optimizer) seconds of a step, split by the simulated FLOPs."""
    flops = step.flops_by_phase
    total = sum(flops.values()) or 1.0
    forward = flops.get("forward", 0.0) / total
    optimizer = flops.get("optimizer", 0.0) / total
    return forward * step_seconds, (1.0 - forward - optimizer) * step_seconds, optimizer * step_seconds


def step_time(step: SingleGpuStep, plan: ParallelPlan, links: Links, compute_seconds: float) -> tuple:
    """(overlap.StepTime, seconds of all collectives) of one step of `plan` whose single-GPU compute is given."""
    fwd, bwd, opt = phase_seconds(step, compute_seconds)
    n, layers = plan.num_gpus, step.num_layers
    group = shard_group_size(plan) if plan.strategy == "hsdp" else n  # ranks in each data-parallel collective
    bw, lat = links.bus_bandwidth_bytes_per_s(group, plan.node_size)

    def seconds(op: str, nbytes: float, ranks: int = group, bus=bw, latency=lat) -> float:
        return comm.collective_seconds(op, nbytes, ranks, bus, latency)

    if plan.strategy in (*PARAM_SHARDED, "fsdp2-shard-grad-op"):
        ag = [seconds("all_gather", step.layer_weight_bytes)] * layers
        rs = [seconds("reduce_scatter", step.layer_trainable_bytes)] * layers
        ag[0] += seconds("all_gather", step.root_weight_bytes)
        rs[0] += seconds("reduce_scatter", step.root_trainable_bytes)
        reshard = plan.strategy != "fsdp2-shard-grad-op"
        timed = overlap.fsdp_step_seconds(
            [fwd / layers] * layers, [bwd / layers] * layers, ag, rs, opt, reshard_after_forward=reshard
        )
        total = sum(ag) * (2 if reshard else 1) + sum(rs)
        if plan.strategy == "hsdp" and plan.num_nodes > 1:  # sharded gradients all-reduced between nodes
            bus, latency = links.bus_bandwidth_bytes_per_s(n, plan.node_size)
            extra = seconds("all_reduce", step.trainable_bytes / group, plan.num_nodes, bus, latency)
            timed = overlap.StepTime(compute_seconds=timed.compute_seconds, step_seconds=timed.step_seconds + extra)
            total += extra
        return timed, total
    buckets = _bucket_sizes(step.trainable_bytes)
    op = "all_reduce" if plan.strategy == "ddp" else "reduce_scatter"
    bucket_seconds = [seconds(op, b) for b in buckets]
    timed = overlap.ddp_step_seconds(fwd, bwd, bucket_seconds, opt)
    total = sum(bucket_seconds)
    if plan.strategy in ("zero1", "zero2"):  # updated trainable weights all-gathered after the optimizer step
        gather = seconds("all_gather", step.trainable_bytes)
        timed = overlap.StepTime(compute_seconds=timed.compute_seconds, step_seconds=timed.step_seconds + gather)
        total += gather
    return timed, total


def _bucket_sizes(trainable_bytes: int, cap_bytes: int = DDP_BUCKET_BYTES) -> list[int]:
    full, rest = divmod(trainable_bytes, cap_bytes)
    return [cap_bytes] * full + ([rest] if rest else [])


def valid_gpu_counts(gpus_per_node: int, max_gpus: int) -> list[int]:
    """1 .. GPUs per node, then whole nodes, up to `max_gpus`."""
    return [n for n in range(1, max_gpus + 1) if n <= gpus_per_node or n % gpus_per_node == 0]


def evaluate_setup(
    step: SingleGpuStep,
    job: FineTuneJob,
    gpu: GPU,
    plan: ParallelPlan,
    *,
    single_gpu_queries_per_s: float | None,
    links: Links,
    price: Price | None = None,
    num_queries: float | None = None,
    epochs: float | None = None,
) -> Setup:
    """Memory, step time, throughput and (given a workload) cost of one setup."""
    base = Setup(gpu=gpu, plan=plan, memory=rank_memory(step, job, plan))
    if not base.fits or not single_gpu_queries_per_s:
        return base
    compute = job.batch_size / single_gpu_queries_per_s
    timed, comm_total = step_time(step, plan, links, compute)
    qps = plan.num_gpus * job.batch_size / timed.step_seconds
    cost = None
    if num_queries and epochs:
        cost = setup_cost(
            queries_per_s=qps, num_gpus=plan.num_gpus, price=price, num_queries=num_queries, epochs=epochs
        )
    return dataclasses.replace(base, timing=timed, comm_seconds=comm_total, queries_per_s=qps, cost=cost)


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
    provider: str | None = None,
    prices_file=None,
    num_queries: float | None = None,
    epochs: float | None = None,
) -> MultiGpuEstimate:
    """Evaluate `job` on each GPU x strategy x number of GPUs (`num_gpus`, or every valid count up to `max_gpus`).
    With no `num_gpus`, a job that fits no count up to `max_gpus` is an error."""
    from tunecost.catalog.prices import price_catalog, prices_for
    from tunecost.distributed.rank_memory import single_gpu_step

    if not 1 <= max_gpus <= MAX_SEARCH_GPUS:
        raise TunecostError(f"the GPU limit must be between 1 and {MAX_SEARCH_GPUS}, got {max_gpus}")
    counts = [num_gpus] if num_gpus is not None else valid_gpu_counts(gpus_per_node, max_gpus)
    plans = [ParallelPlan(num_gpus=n, gpus_per_node=gpus_per_node, strategy=s) for s in strategies for n in counts]
    links_by_gpu = {gpu.name: default_links(gpu, gpus_per_node, node_link) for gpu in gpus}  # errors before tracing
    step = single_gpu_step(job)
    prices = price_catalog(prices_file)
    setups: list[Setup] = []
    notes: list[str] = []
    for gpu in gpus:
        qps, note = single_gpu_queries_per_s(job, gpu)
        notes.append(note)
        links = links_by_gpu[gpu.name]
        gpu_prices = prices_for(gpu.name, prices, provider)
        if not gpu_prices:
            notes.append(f"no price for {gpu.name}" + (f" from {provider}" if provider else "") + " in the catalog")
        price = gpu_prices[0] if gpu_prices else None
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
                    price=price,
                    num_queries=num_queries,
                    epochs=epochs,
                )
            )
    if num_gpus is None and not any(s.fits for s in setups):
        raise TunecostError(
            f"{step.model} ({job.method}) fits no setup of up to {max_gpus} GPUs "
            f"({', '.join(g.name for g in gpus)}; {', '.join(strategies)}); raise the limit or change the job"
        )
    notes.append("cost = hours x number of GPUs x the cheapest catalog $ per GPU-hour (the catalog has no node prices)")
    return MultiGpuEstimate(
        model=step.model,
        method=job.method,
        batch_size=job.batch_size,
        seq_len=step.seq_len,
        setups=tuple(setups),
        notes=tuple(notes),
        assumptions=setups[0].memory.assumptions if setups else (),
    )
