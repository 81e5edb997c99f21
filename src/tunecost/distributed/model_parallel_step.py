"""The step time of one rank of a tensor-, pipeline- and context-parallel layout: its share of the single-GPU
compute, the TP and CP collectives of each micro-batch, the pipeline's sends and bubble, and the data-parallel
collectives over `dp` ranks as `timing` times them. Derivations: docs/multi-gpu.md, "Tensor, pipeline and
context parallelism"."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tunecost.distributed import comm, overlap
from tunecost.distributed.model_parallel import boundary_bytes, data_parallel_plan
from tunecost.distributed.single_step import SingleGpuStep
from tunecost.distributed.timing import Links, StepCollective, step_time
from tunecost.workload.parallel import ParallelPlan

TP_ALL_REDUCES_PER_LAYER = {"forward": 2, "backward": 2}  # Megatron: after attention's and the MLP's row-parallel


@dataclass(frozen=True, kw_only=True)
class MicroBatchComm:
    """One micro-batch's model-parallel communication on one rank: the collectives, and the seconds exposed."""

    collectives: tuple[StepCollective, ...]
    exposed_seconds: float


def attention_share(seq_len: int, hidden_size: int) -> float:
    """Causal attention's share of a decoder layer's FLOPs per token: 2 s h of 24 h^2 + 2 s h (GPT's block)."""
    return seq_len / (12 * hidden_size + seq_len)


def _collective(op: str, phase: str, what: str, nbytes: float, count: int, ranks: int, span: int, links: Links):
    bus, latency = links.bus_bandwidth_bytes_per_s(span, links.nics_per_node)  # nics_per_node: GPUs per node
    seconds = comm.collective_seconds(op, nbytes, ranks, bus, latency)
    return StepCollective(op=op, phase=phase, what=what, ranks=ranks, nbytes=nbytes, count=count, seconds=seconds)


def micro_batch_comm(
    step: SingleGpuStep, plan: ParallelPlan, links: Links, layer_seconds: float, *, kv_bytes_per_token: int
) -> MicroBatchComm:
    """The TP collectives (Megatron's two all-reduces per layer in forward and two in backward, again in forward
    with recomputation; with sequence parallelism an all-gather and a reduce-scatter each, the same bytes on the
    wire), CP's ring (cp-1 K/V block passes per layer forward, twice that backward, each hidden under the layer's
    attention) and the pipeline's sends (the activation forward, its gradient back) of one micro-batch on a rank
    whose stage has `step.num_layers` layers of `layer_seconds` each."""
    out: list[StepCollective] = []
    exposed = 0.0
    layers = step.num_layers
    activation = step.batch_size * step.seq_len * step.hidden_size * step.activation_bytes_per_element
    if plan.tp > 1:
        calls = dict(TP_ALL_REDUCES_PER_LAYER)
        calls["backward"] += calls["forward"] if step.recompute else 0
        for phase, count in calls.items():
            ops: tuple[tuple[str, str], ...] = (("all_reduce", "row-parallel output"),)
            if plan.sequence_parallel:
                ops = (("all_gather", "layer input (sequence parallel)"), ("reduce_scatter", "layer output"))
            for op, what in ops:
                c = _collective(op, phase, f"TP {what}", activation, count * layers, plan.tp, plan.tp, links)
                out.append(c)
                exposed += c.total_seconds
    if plan.cp > 1:
        block = step.batch_size * step.seq_len * kv_bytes_per_token
        span = plan.tp * plan.cp
        for phase, passes in (("forward", 1), ("backward", 2 + (1 if step.recompute else 0))):
            c = _collective(
                "send_recv", phase, "CP ring K/V block", block, passes * (plan.cp - 1) * layers, 2, span, links
            )
            out.append(c)
            attention = passes * layer_seconds * attention_share(step.seq_len * plan.cp, step.hidden_size)
            exposed += layers * max(0.0, passes * (plan.cp - 1) * c.seconds - attention)
    if plan.pp > 1:
        span = plan.model_parallel // plan.pp * 2  # neighbouring stages are tp x cp x dp ranks apart
        nbytes = boundary_bytes(step, plan)
        for phase, what in (("forward", "activation to the next stage"), ("backward", "gradient to the previous")):
            c = _collective("send_recv", phase, f"PP {what}", nbytes, 1, 2, span * plan.dp, links)
            out.append(c)
            exposed += c.total_seconds
    return MicroBatchComm(collectives=tuple(out), exposed_seconds=exposed)


def model_parallel_step_time(
    step: SingleGpuStep,
    plan: ParallelPlan,
    links: Links,
    whole_model_seconds: float,
    *,
    kv_bytes_per_token: int,
) -> tuple[overlap.StepTime, tuple[StepCollective, ...]]:
    """(StepTime with its bubble, every collective of a step) of a rank of `plan` on a stage whose step is `step`
    (`model_parallel.stage_step`), given the single-GPU seconds of one micro-batch through the whole model. The
    rank computes 1/(tp pp cp) of it per micro-batch (the split assumed even); the data-parallel collectives
    overlap the step's compute as `timing.step_time` has them."""
    m = plan.num_micro_batches
    per_micro_batch = whole_model_seconds / plan.model_parallel
    layer_seconds = per_micro_batch / max(1, step.num_layers)
    mp = micro_batch_comm(step, plan, links, layer_seconds, kv_bytes_per_token=kv_bytes_per_token)
    dp_timed, dp_collectives = step_time(step, data_parallel_plan(plan), links, m * per_micro_batch)
    stage_seconds = per_micro_batch + mp.exposed_seconds
    bubble = (plan.pp - 1) / plan.virtual_stages * stage_seconds
    timed = overlap.StepTime(
        compute_seconds=dp_timed.compute_seconds,
        step_seconds=dp_timed.step_seconds + m * mp.exposed_seconds + bubble,
        bubble_seconds=bubble,
    )
    scaled = tuple(dataclasses.replace(c, count=c.count * m) for c in mp.collectives)
    return timed, (*dp_collectives, *scaled)
