"""What one rank of a tensor-, pipeline- and context-parallel job sends per training step, and the pipeline bubble.

Collectives are listed in `timing.StepCollective`'s terms (op, phase, ranks, bytes, count) plus whether they
stay within a node, with ranks placed in Megatron's order (TP innermost, then CP, DP, PP). Sources, counts and
placement: docs/multi-gpu.md, section `tunecost.distributed.model_parallel_comm`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunecost.distributed import comm
from tunecost.distributed.pipeline import bubble_fraction, rank_layers
from tunecost.errors import TunecostError
from tunecost.workload.parallel import ParallelPlan

TP_ALL_REDUCES_FORWARD = 2  # per decoder layer: after attention's output projection and the MLP's down projection
TP_ALL_REDUCES_BACKWARD = 2  # the gradients of the column-parallel projections' inputs (QKV, gate/up)
LOSS_PARALLEL_ALL_REDUCES = 3  # torch.distributed.tensor.parallel.loss_parallel: max, sum of exp, target logits
ADAMW_GRADIENT_READS = 3  # torch AdamW (foreach) reads a gradient 3 times: lerp, mul/addcmul of the second moment
ROTATE_METHODS = ("allgather", "alltoall")  # torch.distributed.tensor.experimental's set_rotate_method


@dataclass(frozen=True, kw_only=True)
class ModelParallelCollective:
    """`count` calls per step of `op` over `ranks` ranks of the `group` ("tp", "cp", "pp"), each moving `nbytes`
    (nccl-tests' buffer: the gathered output, the unreduced input, the sent tensor); `intra_node`: all on one
    node's link (else the collective crosses the network)."""

    op: str  # all_reduce, all_gather, reduce_scatter, send, recv
    phase: str  # forward or backward
    what: str
    group: str
    ranks: int
    intra_node: bool
    nbytes: float
    count: int


def stage_stride(plan: ParallelPlan) -> int:
    """Global ranks between a rank and its peer on the next pipeline stage: tp x cp x dp (PP outermost)."""
    return plan.tp * plan.cp * plan.dp


def group_intra_node(plan: ParallelPlan, group: str) -> bool:
    """Whether a TP group (tp consecutive ranks) or a CP group (stride tp, tp x cp consecutive ranks) fits a node."""
    if group not in ("tp", "cp"):
        raise TunecostError(f"unknown model-parallel group {group!r}; known: tp, cp")
    return (plan.tp if group == "tp" else plan.tp * plan.cp) <= plan.node_size


def stages_share_node(plan: ParallelPlan, stage: int, other: int) -> bool:
    """Whether the ranks of two pipeline stages that talk (same TP, CP and DP rank) sit on one node."""
    n, d = plan.node_size, stage_stride(plan)
    return (stage * d) // n == (other * d) // n


def activation_bytes(*, batch: int, tokens: int, hidden: int, bytes_per_element: int) -> int:
    """One layer's input or output on a rank: b x s x h x dtype bytes (s: this rank's tokens)."""
    return batch * tokens * hidden * bytes_per_element


def kv_block_bytes(*, batch: int, tokens: int, kv_heads: int, head_dim: int, bytes_per_element: int) -> int:
    """A rank's K and V block of one attention layer: b x s/cp x kv heads x head dim x 2 x dtype bytes."""
    return batch * tokens * kv_heads * head_dim * 2 * bytes_per_element


def tp_layer_collectives(
    plan: ParallelPlan, *, recompute: bool, early_stop: bool = True, megatron_regather: bool = False
) -> list[tuple[str, str, str, int]]:
    """(op, phase, what, calls) of one decoder layer per micro-batch on a TP rank: 2 all-reduces forward, 2
    backward (Megatron's f and g); with sequence parallelism each becomes an all-gather and a reduce-scatter.
    Full recomputation repeats the forward's in backward; with PyTorch's non-reentrant checkpoint (`early_stop`,
    its default) all but the last row-parallel one, whose output no saved tensor needs. `megatron_regather`:
    Megatron-SP's all-gather of each saved sharded input again in backward (DTensor keeps the gathered input)."""
    if plan.tp == 1:
        return []
    fwd, bwd = TP_ALL_REDUCES_FORWARD, TP_ALL_REDUCES_BACKWARD
    again = fwd - (1 if early_stop else 0)  # row-parallel collectives the recompute re-runs
    if not plan.sequence_parallel:
        out = [("all_reduce", "forward", "layer outputs (row-parallel)", fwd)]
        out.append(("all_reduce", "backward", "input gradients (column-parallel)", bwd))
        if recompute:
            out.append(("all_reduce", "backward", "layer outputs, recomputed", again))
        return out
    out = [
        ("all_gather", "forward", "sequence shards into column-parallel inputs", fwd),
        ("reduce_scatter", "forward", "row-parallel outputs into sequence shards", fwd),
        ("all_gather", "backward", "output gradients (reduce-scatter's backward)", bwd),
        ("reduce_scatter", "backward", "input gradients into sequence shards", bwd),
    ]
    if recompute:
        out.append(("all_gather", "backward", "sequence shards into column-parallel inputs, recomputed", fwd))
        out.append(("reduce_scatter", "backward", "row-parallel outputs into sequence shards, recomputed", again))
    if megatron_regather:
        out.append(("all_gather", "backward", "saved input shards again, for weight gradients", bwd))
    return out


def tp_root_collectives(
    plan: ParallelPlan, *, first_stage: bool, last_stage: bool, logits_bytes: float = 0, loss_bytes: float = 0
) -> list[tuple]:
    """torchtitan's plan for the vocabulary-parallel embedding (row-wise: forward all-reduce, or reduce-scatter
    into sequence shards with SP, whose backward is an all-gather) and LM head (column-wise: the input gathered
    with SP, its gradient all-reduced or reduce-scattered). `logits_bytes` > 0: the vocabulary-sharded logits are
    all-gathered for a loss on whole logits (no loss_parallel; its backward takes a local slice); else
    loss_parallel's reductions of `loss_bytes` (one fp32 value per token) each."""
    if plan.tp == 1:
        return []
    sp = plan.sequence_parallel
    out: list[tuple] = []
    if first_stage:
        out.append(("reduce_scatter" if sp else "all_reduce", "forward", "embedding output", 1))
        if sp:
            out.append(("all_gather", "backward", "embedding output gradient", 1))
    if last_stage:
        if sp:
            out.append(("all_gather", "forward", "LM head input", 1))
        out.append(("reduce_scatter" if sp else "all_reduce", "backward", "LM head input gradient", 1))
        if logits_bytes:
            out.append(("all_gather", "forward", "logits (no loss parallel)", 1, logits_bytes))
        else:  # DTensor's loss_parallel: the logits' max, the sum of exponentials and the target logits, fp32
            out.append(("all_reduce", "forward", "loss parallel reductions", LOSS_PARALLEL_ALL_REDUCES, loss_bytes))
    return out


def sp_norm_collectives(plan: ParallelPlan, *, norms: int, norm_bytes: int) -> list[tuple]:
    """With sequence parallelism the norms' replicated weights get Partial gradients, all-reduced each time torch's
    AdamW reads one (`ADAMW_GRADIENT_READS` per step): once per step, not per micro-batch."""
    if plan.tp == 1 or not plan.sequence_parallel:
        return []
    return [("all_reduce", "optimizer", "norm weight gradients", ADAMW_GRADIENT_READS * norms, norm_bytes)]


def cp_layer_collectives(plan: ParallelPlan, block_bytes: float, *, rotate_method: str) -> list[tuple]:
    """(op, phase, what, calls, bytes) of one attention layer per micro-batch on a CP rank (PyTorch's
    `context_parallel`; Megatron's CP passes the same ring as `alltoall`): forward, K and V of the other cp - 1
    ranks (cp - 1 ring steps, or one all-gather, PyTorch's default); backward, K and V again the same way and
    the K, V gradients around the whole ring (cp steps)."""
    cp = plan.cp
    if rotate_method not in ROTATE_METHODS:
        raise TunecostError(f"rotate method {rotate_method!r}: one of {', '.join(ROTATE_METHODS)}")
    if cp == 1:
        return []
    out = []
    for phase in ("forward", "backward"):
        if rotate_method == "allgather":
            out.append(("all_gather", phase, "K and V blocks", 1, block_bytes * cp))
        else:
            out.append(("send", phase, "K and V block to the next rank", cp - 1, block_bytes))
    out.append(("send", "backward", "K and V gradients to the next rank", cp, block_bytes))
    return out


def pp_sends(plan: ParallelPlan, stage: int) -> list[tuple[str, str, str, int, bool]]:
    """(op, phase, what, calls, within a node) per micro-batch of a rank on `stage`: forward, the activation to
    the next stage and from the previous; backward, its gradient the other way. Interleaved: v model chunks per
    rank, so v boundaries each way, one fewer where the pipeline starts (stage 0) or ends (the last stage)."""
    v, pp = plan.virtual_stages, plan.pp
    if pp == 1:
        return []
    to_next = v - (1 if stage == pp - 1 else 0)
    from_previous = v - (1 if stage == 0 else 0)
    next_local = stages_share_node(plan, stage, (stage + 1) % pp)
    previous_local = stages_share_node(plan, stage, (stage - 1) % pp)
    out = [
        ("send", "forward", "activation to the next stage", to_next, next_local),
        ("recv", "forward", "activation from the previous stage", from_previous, previous_local),
        ("send", "backward", "activation gradient to the previous stage", from_previous, previous_local),
        ("recv", "backward", "activation gradient from the next stage", to_next, next_local),
    ]
    return [row for row in out if row[3]]


def model_parallel_collectives(
    plan: ParallelPlan,
    *,
    batch: int,
    seq_len: int,
    hidden: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    bytes_per_element: int,
    recompute: bool = False,
    recompute_early_stop: bool = True,
    stage: int = 0,
    rotate_method: str = "allgather",
    gathered_logits_vocab: int = 0,
) -> tuple[ModelParallelCollective, ...]:
    """Every TP, CP and PP collective pipeline rank `stage` issues per step (all micro-batches): its decoder
    layers as the plan's split deals them (`pipeline.rank_layers`) per micro-batch, the embedding on the first
    stage, the LM head on the last.
    `batch`: the micro-batch in sequences; `seq_len`: the whole sequence (split cp ways); `gathered_logits_vocab`:
    the vocabulary size when the LM head's logits are all-gathered (no loss parallel; 0: loss parallel);
    `recompute_early_stop`: full recomputation by PyTorch's non-reentrant checkpoint (False: Megatron's, which
    re-runs the whole layer). With `plan.tp_impl` "megatron", SP's saved input shards are gathered again in
    backward (`tp_layer_collectives`' `megatron_regather`)."""
    plan.check_model(
        num_heads=num_heads, num_kv_heads=num_kv_heads, num_layers=num_layers, seq_len=seq_len, even_layers=False
    )
    if not 0 <= stage < plan.pp:
        raise TunecostError(f"pipeline stage {stage} out of range for --pp {plan.pp}")
    m, tokens = plan.num_micro_batches, seq_len // plan.cp
    layers = rank_layers(num_layers, plan.pp, stage, plan.virtual_stages, plan.stage_weights(num_layers))
    full = activation_bytes(batch=batch, tokens=tokens, hidden=hidden, bytes_per_element=bytes_per_element)
    rows = tp_layer_collectives(
        plan, recompute=recompute, early_stop=recompute_early_stop, megatron_regather=plan.tp_impl == "megatron"
    )
    out = _collectives(plan, "tp", rows, full, layers * m)
    logits = activation_bytes(
        batch=batch, tokens=tokens, hidden=gathered_logits_vocab, bytes_per_element=bytes_per_element
    )
    last = stage == plan.pp - 1
    root = tp_root_collectives(
        plan, first_stage=stage == 0, last_stage=last, logits_bytes=logits, loss_bytes=batch * tokens * 4
    )
    out += _collectives(plan, "tp", root, full, m)
    norms = 2 * layers + (1 if last else 0)  # two per decoder layer, the final norm on the last stage
    out += _collectives(plan, "tp", sp_norm_collectives(plan, norms=norms, norm_bytes=hidden * bytes_per_element), 0, 1)
    head_dim = hidden // num_heads
    block = kv_block_bytes(
        batch=batch,
        tokens=tokens,
        kv_heads=num_kv_heads // plan.tp,
        head_dim=head_dim,
        bytes_per_element=bytes_per_element,
    )
    out += _collectives(plan, "cp", cp_layer_collectives(plan, block, rotate_method=rotate_method), block, layers * m)
    sent = full / (plan.tp if plan.sequence_parallel else 1)  # with SP each TP rank sends its sequence shard
    out += _collectives(plan, "pp", pp_sends(plan, stage), sent, m)
    return tuple(out)


def _collectives(plan: ParallelPlan, group: str, rows, nbytes: float, times: int) -> list[ModelParallelCollective]:
    """`rows` (op, phase, what, calls, and a row's own bytes or, for "pp", whether it stays within a node) of
    `group` as collectives called `times` x calls per step, each moving `nbytes` unless the row gives its own."""
    ranks = {"tp": plan.tp, "cp": plan.cp, "pp": 2}[group]
    out = []
    for op, phase, what, calls, *rest in rows:
        n = rest[0] if rest and group != "pp" else nbytes
        intra = rest[0] if group == "pp" else group_intra_node(plan, group)
        out.append(
            ModelParallelCollective(
                op=op, phase=phase, what=what, group=group, ranks=ranks, intra_node=intra, nbytes=n, count=calls * times
            )
        )
    return out


def collective_seconds_on_links(
    c: ModelParallelCollective,
    *,
    node_bus_bandwidth_bytes_per_s: float,
    node_latency_seconds: float,
    nic_bus_bandwidth_bytes_per_s: float,
    nic_latency_seconds: float,
    nics_per_node: int,
) -> float:
    """Seconds of one call of `c`: on the node's link within a node; across nodes a send on the rank's own NIC,
    a collective on the node's NICs together (as `timing.Links`), each capped by the node link. A `recv` is the
    peer's send: 0."""
    if c.op == "recv":
        return 0.0
    bus, latency = node_bus_bandwidth_bytes_per_s, node_latency_seconds
    if not c.intra_node:
        nics = 1 if c.op == "send" else nics_per_node
        bus = min(bus, comm.inter_node_bus_bandwidth_bytes_per_s(nic_bus_bandwidth_bytes_per_s, nics))
        latency = max(latency, nic_latency_seconds)
    return comm.collective_seconds(c.op, c.nbytes, c.ranks, bus, latency)


def point_to_point_seconds(nbytes: float, bandwidth_bytes_per_s: float, latency_seconds: float = 0.0) -> float:
    """One send between two ranks (nccl-tests' sendrecv: bus bandwidth = algorithm bandwidth)."""
    if bandwidth_bytes_per_s <= 0 or nbytes < 0:
        raise TunecostError("a send needs a positive bandwidth and non-negative bytes")
    return nbytes / bandwidth_bytes_per_s + latency_seconds


def ring_exposed_seconds(step_comm_seconds: float, block_compute_seconds: float, num_steps: int) -> float:
    """Exposed time of a ring pass whose every step's transfer overlaps one block's attention compute: what
    each transfer exceeds its block's compute by."""
    return num_steps * max(0.0, step_comm_seconds - block_compute_seconds)


def pipeline_bubble_seconds(
    micro_batch_seconds: float, schedule: str, pp: int, micro_batches: int, virtual_stages: int = 1
) -> float:
    """Idle seconds per step of a stage whose forward + backward of one micro-batch takes `micro_batch_seconds`:
    the ideal m x t_mb stretched by the bubble, t_mb x m x f / (1 - f) = (pp - 1) x t_mb / v."""
    f = bubble_fraction(schedule, pp, micro_batches, virtual_stages)
    return micro_batch_seconds * micro_batches * f / (1 - f)
