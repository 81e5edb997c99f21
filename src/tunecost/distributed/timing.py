"""One data-parallel step on several GPUs: the links it uses, the collectives it issues and its time.

Per step of a strategy, the collectives (sizes from the single-GPU step, `rank_memory.SingleGpuStep`) are timed
with nccl-tests' bus-bandwidth definitions (`comm`) over the interconnect catalog and hidden under compute per
`overlap`; expert parallelism adds its all-to-alls (`expert_parallel`). Compute per rank is given (the
single-GPU step at the same micro-batch), split into forward, backward (with recompute) and optimizer by the
simulated FLOPs, and evenly over the decoder layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunecost.catalog.gpus import GPU
from tunecost.catalog.interconnects import Interconnect, resolve_interconnect
from tunecost.distributed import comm, expert_parallel, overlap
from tunecost.distributed.plan import ParallelPlan
from tunecost.distributed.rank_memory import PARAM_SHARDED, SingleGpuStep, shard_group_size
from tunecost.errors import TunecostError

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


def phase_seconds(step: SingleGpuStep, step_seconds: float) -> tuple[float, float, float]:
    """(forward, backward + recompute, optimizer) seconds of a step, split by the simulated FLOPs."""
    flops = step.flops_by_phase
    total = sum(flops.values()) or 1.0
    forward = flops.get("forward", 0.0) / total
    optimizer = flops.get("optimizer", 0.0) / total
    return forward * step_seconds, (1.0 - forward - optimizer) * step_seconds, optimizer * step_seconds


@dataclass(frozen=True, kw_only=True)
class StepCollective:
    """`count` calls per step of one collective: `op` over `ranks` ranks, each moving a buffer of `nbytes`
    (nccl-tests' buffer size) in `seconds`."""

    op: str
    phase: str  # forward, backward or optimizer
    what: str
    ranks: int
    nbytes: float
    count: int
    seconds: float

    @property
    def total_seconds(self) -> float:
        return self.count * self.seconds


def step_time(
    step: SingleGpuStep, plan: ParallelPlan, links: Links, compute_seconds: float
) -> tuple[overlap.StepTime, tuple[StepCollective, ...]]:
    """(overlap.StepTime, the collectives of a step) of `plan` whose single-GPU compute is given. Expert
    parallelism's all-to-alls block the layer that issues them: they lengthen its forward and backward."""
    fwd, bwd, opt = phase_seconds(step, compute_seconds)
    n, layers, ep = plan.num_gpus, step.num_layers, plan.expert_parallel
    group = shard_group_size(plan) if plan.strategy == "hsdp" else n  # ranks in each data-parallel collective
    out: list[StepCollective] = []

    def add(op: str, phase: str, what: str, nbytes: float, count: int, ranks: int = group, span: int = 0) -> float:
        """Record `count` calls; the seconds of one. `span`: the ranks whose links carry it (default `ranks`)."""
        if ranks <= 1 or nbytes <= 0 or count <= 0:
            return 0.0
        bus, latency = links.bus_bandwidth_bytes_per_s(span or ranks, plan.node_size)
        seconds = comm.collective_seconds(op, nbytes, ranks, bus, latency)
        out.append(
            StepCollective(op=op, phase=phase, what=what, ranks=ranks, nbytes=nbytes, count=count, seconds=seconds)
        )
        return seconds

    def data_parallel(op: str, phase: str, what: str, nbytes: int, experts: int, count: int) -> float:
        """One call's seconds; the routed experts' bytes (1/ep per rank) go over the group // ep ranks that
        hold the same experts, on the links of the whole group."""
        if ep == 1:
            return add(op, phase, what, nbytes, count)
        dense = add(op, phase, what, nbytes - experts, count)
        return dense + add(op, phase, f"{what} (experts)", experts // ep, count, ranks=group // ep, span=group)

    a2a = {"forward": 0.0, "backward": 0.0}
    if ep > 1:
        for phase, calls in expert_parallel.all_to_all_per_layer(recompute=step.recompute).items():
            each = add("all_to_all", phase, "expert dispatch and combine", step.dispatch_bytes, calls * layers, ep)
            a2a[phase] = calls * each
    layer_fwd, layer_bwd = fwd / layers + a2a["forward"], bwd / layers + a2a["backward"]
    if plan.strategy in (*PARAM_SHARDED, "fsdp2-shard-grad-op"):
        reshard = plan.strategy != "fsdp2-shard-grad-op"
        weights, experts = step.layer_weight_bytes, step.layer_expert_bytes(trainable=False)
        ag = [data_parallel("all_gather", "forward", "layer weights", weights, experts, layers)] * layers
        rs = [
            data_parallel(
                "reduce_scatter",
                "backward",
                "layer gradients",
                step.layer_trainable_bytes,
                step.layer_expert_bytes(trainable=True),
                layers,
            )
        ] * layers
        ag[0] += add("all_gather", "forward", "root weights", step.root_weight_bytes, 1)
        rs[0] += add("reduce_scatter", "backward", "root gradients", step.root_trainable_bytes, 1)
        if reshard:  # the same all-gathers again in backward
            data_parallel("all_gather", "backward", "layer weights", weights, experts, layers)
            add("all_gather", "backward", "root weights", step.root_weight_bytes, 1)
        timed = overlap.fsdp_step_seconds(
            [layer_fwd] * layers, [layer_bwd] * layers, ag, rs, opt, reshard_after_forward=reshard
        )
        step_seconds = timed.step_seconds
        if plan.strategy == "hsdp" and plan.num_nodes > 1:  # sharded gradients all-reduced between nodes
            shards = step.trainable_bytes / group
            step_seconds += add("all_reduce", "backward", "gradient shards between nodes", shards, 1, plan.num_nodes, n)
    else:
        op = "all_reduce" if plan.strategy == "ddp" else "reduce_scatter"
        experts = step.expert_trainable_bytes if ep > 1 else 0
        buckets: list[float] = []
        for label, total, ranks in (
            (" (experts)", experts // ep, group // ep),
            ("", step.trainable_bytes - experts, group),
        ):  # DDP's 25 MiB buckets (the last one smaller)
            full, rest = divmod(total, DDP_BUCKET_BYTES)
            buckets += [add(op, "backward", f"gradient buckets{label}", DDP_BUCKET_BYTES, full, ranks)] * full
            buckets += [add(op, "backward", f"last gradient bucket{label}", rest, 1, ranks)] if rest else []
        timed = overlap.ddp_step_seconds(fwd + layers * a2a["forward"], bwd + layers * a2a["backward"], buckets, opt)
        step_seconds = timed.step_seconds
        if plan.strategy in ("zero1", "zero2"):  # updated trainable weights all-gathered after the optimizer step
            step_seconds += data_parallel(
                "all_gather", "optimizer", "updated trainable weights", step.trainable_bytes, experts, 1
            )
    return overlap.StepTime(compute_seconds=fwd + bwd + opt, step_seconds=step_seconds), tuple(out)
