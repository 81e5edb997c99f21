"""One data-parallel step on several GPUs: the links it uses, the collectives it issues and its time.

Per step of a strategy, the collectives (sizes from the single-GPU step, `rank_memory.SingleGpuStep`) are timed
with nccl-tests' bus-bandwidth definitions (`comm`) over the interconnect catalog and hidden under compute per
`overlap`; expert parallelism adds its all-to-alls (`expert_parallel`). Compute per rank is given (the
single-GPU step at the same micro-batch); the rank steps the optimizer over its shard of the states, and the rest
splits into forward and backward by the simulated FLOPs, evenly over the decoder layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunecost.catalog.gpus import GPU
from tunecost.catalog.host_cpus import gpu_host
from tunecost.catalog.interconnects import Interconnect, resolve_interconnect
from tunecost.distributed import comm, expert_parallel, overlap
from tunecost.distributed.rank_memory import PARAM_SHARDED, ZERO_STRATEGIES, SingleGpuStep, shard_group_size
from tunecost.errors import TunecostError
from tunecost.workload import offload
from tunecost.workload.parallel import ParallelPlan

DDP_BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb default
# Strategies whose gradient reduction a micro-batch can skip under gradient accumulation: DDP's and FSDP1's
# `no_sync()`, FSDP2's `set_requires_gradient_sync(False)` (what accelerate's `no_sync` calls); DeepSpeed's ZeRO
# reduces every micro-batch.
NO_SYNC_STRATEGIES = ("ddp", "fsdp1", "fsdp2", "hsdp", "fsdp2-shard-grad-op")
# Links assumed when none is named: the node's GPU link (by GPU family) and, between nodes, one NIC per GPU.
DEFAULT_NODE_LINK = {
    "H100-80GB-SXM": "NVLink4",
    "H200-141GB": "NVLink4",
    "A100-80GB-SXM": "NVLink3",
    "B200-180GB": "NVLink5",
    "B300-288GB": "NVLink5",
    "GB200-186GB": "NVLink5",
    "RTX5090-32GB": "PCIe5",  # the PCIe5 row is 8 x RTX 5090
    "RTX5080-16GB": "PCIe5",
    "RTXPRO6000-96GB": "PCIe5",
    "H20-96GB": "NVLink4",  # HGX H20: NVLink 900 GB/s, as the H100 SXM
}
DEFAULT_NODE_LINK_OTHER = "PCIe4"
DEFAULT_NETWORK = {
    "H100-80GB-SXM": "InfiniBand-NDR",
    "H200-141GB": "InfiniBand-NDR",
    "B200-180GB": "InfiniBand-NDR",
    "B300-288GB": "InfiniBand-NDR",
    "GB200-186GB": "InfiniBand-NDR",
}
DEFAULT_NETWORK_OTHER = "InfiniBand-HDR"


@dataclass(frozen=True, kw_only=True)
class Links:
    node: Interconnect  # between the GPUs of one node
    network: Interconnect  # one NIC between nodes
    nics_per_node: int
    host: Interconnect | None = None  # GPU to CPU memory (PCIe), for DeepSpeed's CPU offload
    host_memory_bytes_per_s: float = 0.0  # the node's CPU memory bandwidth, for an offloaded optimizer step

    def bus_bandwidth_bytes_per_s(self, num_ranks: int, gpus_per_node: int) -> tuple[float, float]:
        """(bus bandwidth, latency) of a collective over `num_ranks` ranks: the node link within one node; across
        nodes the slower of the node link and the node's NICs (a ring crosses the network)."""
        if num_ranks <= gpus_per_node:
            return self.node.bus_bandwidth_bytes_per_s, self.node.latency_seconds
        network = comm.inter_node_bus_bandwidth_bytes_per_s(self.network.bus_bandwidth_bytes_per_s, self.nics_per_node)
        latency = max(self.node.latency_seconds, self.network.latency_seconds)
        return min(self.node.bus_bandwidth_bytes_per_s, network), latency


def default_links(gpu: GPU, gpus_per_node: int, node_link: str | None = None, host_cpu: str | None = None) -> Links:
    """The GPU's node link, network and PCIe by its family, and the memory of its host (`host_cpu`, else the
    GPU's default host)."""
    node = resolve_interconnect(node_link or DEFAULT_NODE_LINK.get(gpu.name, DEFAULT_NODE_LINK_OTHER))
    if node.scope != "node":
        raise TunecostError(f"{node.name} links nodes, not the GPUs of one node; name a node link (NVLink, PCIe)")
    network = resolve_interconnect(DEFAULT_NETWORK.get(gpu.name, DEFAULT_NETWORK_OTHER))
    host = resolve_interconnect(offload.host_link_name(gpu.name))
    memory = gpu_host(gpu.name, host_cpu).cpu.memory_bytes_per_s
    return Links(node=node, network=network, nics_per_node=gpus_per_node, host=host, host_memory_bytes_per_s=memory)


def phase_seconds(
    step: SingleGpuStep, step_seconds: float, optimizer_seconds: float | None = None
) -> tuple[float, float, float]:
    """(forward, backward + recompute, optimizer) seconds of a step: the optimizer's as given (the throughput
    model's, memory-bound) or its share of the simulated FLOPs, the rest split by the simulated FLOPs."""
    flops = step.flops_by_phase
    total = sum(flops.values()) or 1.0
    if optimizer_seconds is None:
        optimizer_seconds = flops.get("optimizer", 0.0) / total * step_seconds
    rest = step_seconds - optimizer_seconds
    forward = flops.get("forward", 0.0) / ((total - flops.get("optimizer", 0.0)) or 1.0) * rest
    return forward, rest - forward, optimizer_seconds


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


class _StepComm:
    """The collectives and host copies of one step, recorded as they are timed."""

    def __init__(self, step: SingleGpuStep, plan: ParallelPlan, links: Links, sync_gradients: bool = True) -> None:
        self.step, self.plan, self.links, self.sync = step, plan, links, sync_gradients
        self.ep = plan.expert_parallel
        self.group = shard_group_size(plan) if plan.strategy == "hsdp" else plan.num_gpus  # data-parallel ranks
        self.out: list[StepCollective] = []

    def add(self, op: str, phase: str, what: str, nbytes: float, count: int, ranks: int = 0, span: int = 0) -> float:
        """Record `count` calls over `ranks` (default: the data-parallel group); the seconds of one. `span`: the
        ranks whose links carry it (default `ranks`)."""
        ranks = ranks or self.group
        if ranks <= 1 or nbytes <= 0 or count <= 0:
            return 0.0
        bus, latency = self.links.bus_bandwidth_bytes_per_s(span or ranks, self.plan.node_size)
        seconds = comm.collective_seconds(op, nbytes, ranks, bus, latency)
        self.out.append(
            StepCollective(op=op, phase=phase, what=what, ranks=ranks, nbytes=nbytes, count=count, seconds=seconds)
        )
        return seconds

    def data_parallel(self, op: str, phase: str, what: str, nbytes: int, experts: int, count: int) -> float:
        """One call's seconds; the routed experts' bytes (1/ep per rank) go over the group // ep ranks that
        hold the same experts, on the links of the whole group."""
        ep, group = self.ep, self.group
        if ep == 1:
            return self.add(op, phase, what, nbytes, count)
        dense = self.add(op, phase, what, nbytes - experts, count)
        return dense + self.add(op, phase, f"{what} (experts)", experts // ep, count, ranks=group // ep, span=group)

    def host_copy(self, direction: str, phase: str, what: str, whole_bytes: float, count: int, ranks: int = 0) -> float:
        """Record `count` copies of this rank's partition of `whole_bytes` (shared by `ranks`, default the
        data-parallel group) over its PCIe link (DeepSpeed offload); the seconds of one."""
        if self.links.host is None:
            raise TunecostError("CPU offload needs a host link (PCIe) in the links")
        nbytes = whole_bytes / (ranks or self.group)
        seconds = offload.copy_seconds(nbytes, self.links.host.bus_bandwidth_bytes_per_s)
        if count > 0 and nbytes > 0:
            self.out.append(
                StepCollective(
                    op=direction, phase=phase, what=what, ranks=1, nbytes=nbytes, count=count, seconds=seconds
                )
            )
        return seconds


def cpu_optimizer_seconds(step: SingleGpuStep, plan: ParallelPlan, links: Links, *, fused_adamw: bool) -> float:
    """An offloaded rank's optimizer step on its host: its partition of the trainable parameters through
    DeepSpeedCPUAdam (ZeRO) or torch's AdamW (FSDP; fused or single-tensor), the node's memory shared by its ranks."""
    if links.host_memory_bytes_per_s <= 0:
        raise TunecostError("CPU offload needs the host's memory bandwidth in the links")
    params = step.trainable_bytes / step.trainable_bytes_per_param / shard_group_size(plan)
    if plan.strategy in ZERO_STRATEGIES:
        per_param = offload.CPU_ADAM_ELEMENTS_FUSED * offload.DEEPSPEED_CPU_ADAM_BYTES
    else:
        elements = offload.CPU_ADAM_ELEMENTS_FUSED if fused_adamw else offload.CPU_ADAM_ELEMENTS_SINGLE_TENSOR
        per_param = elements * step.trainable_bytes_per_param
    bandwidth = links.host_memory_bytes_per_s / min(plan.num_gpus, plan.node_size)
    return offload.cpu_optimizer_seconds(params, per_param, bandwidth)


def rank_optimizer_seconds(
    step: SingleGpuStep, plan: ParallelPlan, links: Links, single_gpu_seconds: float, *, fused_adamw: bool = False
) -> float:
    """A rank's optimizer step: on its host when offloaded (`cpu_optimizer_seconds`), else the single GPU's
    `single_gpu_seconds` over the ranks that shard the optimizer states (ZeRO, FSDP: each updates its shard)."""
    if offload.offloads_states(plan.offload):
        return cpu_optimizer_seconds(step, plan, links, fused_adamw=fused_adamw)
    return single_gpu_seconds / shard_group_size(plan)


def cpu_optimizer_note(gpu: GPU, links: Links, host_cpu: str | None = None) -> str:
    """What an offloaded optimizer step's time rests on, for `gpu`'s host (`host_cpu`, else its default)."""
    cpu = gpu_host(gpu.name, host_cpu).cpu
    named = "named" if host_cpu else "assumed; name yours with --host-cpu: a workstation's two channels give far less"
    return (
        f"{gpu.name}: the offloaded optimizer step runs on the host CPU, bound by its memory: "
        f"{links.host_memory_bytes_per_s / 1e9:.0f} GB/s, the datasheet bandwidth of {cpu.sockets} x {cpu.name} "
        f"({named}), shared by the node's ranks; DeepSpeedCPUAdam moves 28 bytes per parameter (torch's AdamW on "
        "CPU, for FSDP: 7 elements fused, 20 not); a floor: memory achieves less than its datasheet, and one thread "
        "per rank (torchrun's OMP_NUM_THREADS=1) makes it slower"
    )


def step_time(
    step: SingleGpuStep,
    plan: ParallelPlan,
    links: Links,
    compute_seconds: float,
    *,
    sync_gradients: bool = True,
    fused_adamw: bool = False,
    optimizer_seconds: float | None = None,
    accumulation: int = 1,
) -> tuple[overlap.StepTime, tuple[StepCollective, ...]]:
    """(overlap.StepTime, the collectives and host copies of a step) of `plan` whose single-GPU compute is
    given. Expert parallelism's all-to-alls block the layer that issues them: they lengthen its forward and
    backward. `sync_gradients=False`: a micro-batch under `no_sync` (`NO_SYNC_STRATEGIES` only), gradients kept
    unreduced: no gradient collective, its host copies or optimizer step; the all-gathers stay.
    `optimizer_seconds`: the single GPU's optimizer time in `compute_seconds` (`phase_seconds`), one
    `accumulation`-th of a step's; the rank runs its own (`rank_optimizer_seconds`, `fused_adamw`: torch's fused
    AdamW on an offloading host)."""
    if not sync_gradients and plan.strategy not in NO_SYNC_STRATEGIES:
        raise TunecostError(f"{plan.strategy} reduces gradients every micro-batch: no no_sync micro-batch")
    fwd, bwd, opt = phase_seconds(step, compute_seconds, optimizer_seconds)
    if sync_gradients:  # the step's own optimizer, a micro-step's share of it
        opt = rank_optimizer_seconds(step, plan, links, opt * accumulation, fused_adamw=fused_adamw) / accumulation
    else:
        opt = 0.0
    c = _StepComm(step, plan, links, sync_gradients)
    a2a = {"forward": 0.0, "backward": 0.0}
    if c.ep > 1:
        for phase, calls in expert_parallel.all_to_all_per_layer(recompute=step.recompute).items():
            each = c.add(
                "all_to_all", phase, "expert dispatch and combine", step.dispatch_bytes, calls * step.num_layers, c.ep
            )
            a2a[phase] = calls * each
    if plan.strategy in (*PARAM_SHARDED, "fsdp2-shard-grad-op"):
        step_seconds = _sharded_step_seconds(c, fwd, bwd, opt, a2a)
    else:
        step_seconds = _bucketed_step_seconds(c, fwd, bwd, opt, a2a)
    return overlap.StepTime(compute_seconds=fwd + bwd + opt, step_seconds=step_seconds), tuple(c.out)


def _sharded_step_seconds(c: _StepComm, fwd: float, bwd: float, opt: float, a2a: dict[str, float]) -> float:
    """FSDP2, ZeRO-3, HSDP: per layer an all-gather in forward (and in backward when resharded) and (gradients
    synced) a reduce-scatter, the root with the first layer, overlapped per `overlap.fsdp_step_seconds`. With CPU
    offload each gradient shard follows its reduce-scatter to the host and (parameter offload) each layer's shard
    comes from the host before its all-gather."""
    step, plan, layers = c.step, c.plan, c.step.num_layers
    units = max(layers, 1)  # a pipeline stage of the embedding or the head alone: its root is the one unit
    reshard = plan.strategy != "fsdp2-shard-grad-op"
    weights, experts = step.layer_weight_bytes, step.layer_expert_bytes(trainable=False)
    layer_trainable, layer_expert_trainable = step.layer_trainable_bytes, step.layer_expert_bytes(trainable=True)
    ag = [c.data_parallel("all_gather", "forward", "layer weights", weights, experts, layers)] * units
    rs = [0.0] * units
    if c.sync:
        rs = [
            c.data_parallel(
                "reduce_scatter", "backward", "layer gradients", layer_trainable, layer_expert_trainable, layers
            )
        ] * units
        rs[0] += c.add("reduce_scatter", "backward", "root gradients", step.root_trainable_bytes, 1)
    ag[0] += c.add("all_gather", "forward", "root weights", step.root_weight_bytes, 1)
    if reshard:  # the same all-gathers again in backward
        c.data_parallel("all_gather", "backward", "layer weights", weights, experts, layers)
        c.add("all_gather", "backward", "root weights", step.root_weight_bytes, 1)
    exposed = 0.0
    if offload.offloads_states(plan.offload) and c.sync:
        to_host = c.host_copy("device_to_host", "backward", "gradient shard", layer_trainable, layers)
        rs = [t + to_host for t in rs]
        rs[0] += c.host_copy("device_to_host", "backward", "root gradient shard", step.root_trainable_bytes, 1)
    if offload.offloads_params(plan.offload):  # each all-gather's shard first comes from the host
        for phase in ("forward", "backward") if reshard else ("forward",):
            from_host = c.host_copy("host_to_device", phase, "layer weight shard", weights, layers)
            root = c.host_copy("host_to_device", phase, "root weight shard", step.root_weight_bytes, 1)
        ag = [t + from_host for t in ag]
        ag[0] += root
    elif offload.offloads_states(plan.offload) and c.sync:  # the updated 16-bit shard back to the GPU
        exposed += c.host_copy("host_to_device", "optimizer", "updated trainable shard", step.trainable_bytes, 1)
    layer_fwd, layer_bwd = fwd / units + a2a["forward"], bwd / units + a2a["backward"]
    timed = overlap.fsdp_step_seconds(
        [layer_fwd] * units, [layer_bwd] * units, ag, rs, opt, reshard_after_forward=reshard
    )
    if plan.strategy == "hsdp" and plan.num_nodes > 1 and c.sync:  # sharded gradients all-reduced between nodes
        shards = step.trainable_bytes / c.group
        exposed += c.add(
            "all_reduce", "backward", "gradient shards between nodes", shards, 1, plan.num_nodes, plan.num_gpus
        )
    return timed.step_seconds + exposed


def _bucketed_step_seconds(c: _StepComm, fwd: float, bwd: float, opt: float, a2a: dict[str, float]) -> float:
    """DDP, ZeRO-1/2: gradients all-reduced (DDP) or reduce-scattered (ZeRO) in 25 MiB buckets under backward,
    per `overlap.ddp_step_seconds`; ZeRO then all-gathers the updated trainable weights. With CPU offload each
    bucket's gradient partition goes to the host after its reduce-scatter and the updated partition comes back
    after the optimizer step."""
    step, plan, ep, group = c.step, c.plan, c.ep, c.group
    op = "all_reduce" if plan.strategy == "ddp" else "reduce_scatter"
    experts = step.expert_trainable_bytes if ep > 1 else 0
    offloaded = offload.offloads_states(plan.offload)
    buckets: list[float] = []
    reduced = ((" (experts)", experts // ep, group // ep), ("", step.trainable_bytes - experts, group))
    for label, total, ranks in reduced if c.sync else ():
        full, rest = divmod(total, DDP_BUCKET_BYTES)
        for size, count, what in (
            (DDP_BUCKET_BYTES, full, "gradient buckets"),
            (rest, 1 if rest else 0, "last gradient bucket"),
        ):
            if not count:
                continue
            seconds = c.add(op, "backward", what + label, size, count, ranks)
            if offloaded:
                seconds += c.host_copy("device_to_host", "backward", f"{what} partition{label}", size, count, ranks)
            buckets += [seconds] * count
    layers = step.num_layers
    step_seconds = overlap.ddp_step_seconds(
        fwd + layers * a2a["forward"], bwd + layers * a2a["backward"], buckets, opt
    ).step_seconds
    if offloaded:
        step_seconds += c.host_copy(
            "host_to_device", "optimizer", "updated trainable partition", step.trainable_bytes, 1
        )
    if plan.strategy in ("zero1", "zero2"):  # updated trainable weights all-gathered after the optimizer step
        step_seconds += c.data_parallel(
            "all_gather", "optimizer", "updated trainable weights", step.trainable_bytes, experts, 1
        )
    return step_seconds
