"""Pipeline parallelism as formulas: the bubble, the micro-batches a stage holds at once, the point-to-point bytes,
the schedules' own action order (torch.distributed.pipelining) and a stage's memory from the single-GPU step.

Sources and derivations: docs/multi-gpu.md, section "Pipeline parallelism".
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from tunecost.distributed.single_step import SingleGpuStep
from tunecost.errors import TunecostError
from tunecost.workload.parallel import (
    PIPELINE_SCHEDULES,
    ModelParallel,
    effective_layers_per_stage,
    empty_stage_message,
)


def stage_layer_ids(num_layers: int, num_stages: int, stage: int, weights: tuple[int, int] = (1, 1)) -> range:
    """The decoder layers of `stage`, as torchtitan's `generate_llm_fqn_per_model_part` deals them: the embedding
    counts as `weights[0]` layers on the first stage and the final norm + head as `weights[1]` on the last
    (torchtitan's defaults: 1 each), the effective layers spread evenly, the earlier stages taking one more."""
    if num_stages == 1:
        return range(num_layers)
    input_weight, output_weight = weights
    per_stage = effective_layers_per_stage(num_layers, num_stages, input_weight, output_weight)
    if not per_stage:
        raise TunecostError(empty_stage_message(num_layers, num_stages, weights))
    extra = (num_layers + input_weight + output_weight) % num_stages
    start = 0
    for s in range(stage + 1):
        count = per_stage + (1 if s < extra else 0) - (input_weight if s == 0 else 0)
        count -= output_weight if s == num_stages - 1 else 0
        begin, start = start, min(start + count, num_layers)
    return range(begin, start)


def uneven_split_note(num_layers: int, mp: ModelParallel) -> str | None:
    """The decoder layers per pipeline stage of `mp` where the stages hold different counts (None: the same)."""
    num_stages, weights = mp.pp * mp.virtual_stages, mp.stage_weights(num_layers)
    counts = [len(stage_layer_ids(num_layers, num_stages, s, weights)) for s in range(num_stages)]
    if len(set(counts)) == 1:
        return None
    shown = ", ".join(map(str, counts)) if num_stages <= 8 else f"{min(counts)} to {max(counts)}"
    return f"{num_layers} layers over {num_stages} pipeline stages as {shown}: {mp.split_text(num_layers)}"


def rank_stage_ids(rank: int, pp: int, virtual_stages: int = 1) -> list[int]:
    """The stages rank `rank` runs: `rank`, `rank + pp`, ... (torch's looped placement for interleaved 1F1B)."""
    return [rank + k * pp for k in range(virtual_stages)]


def rank_layers(num_layers: int, pp: int, rank: int, virtual_stages: int = 1, weights: tuple[int, int] = (1, 1)) -> int:
    """The decoder layers pipeline rank `rank` holds over its `virtual_stages` stages."""
    num_stages = pp * virtual_stages
    chunks = rank_stage_ids(rank, pp, virtual_stages)
    return sum(len(stage_layer_ids(num_layers, num_stages, c, weights)) for c in chunks)


def slowest_rank(
    num_layers: int, pp: int, virtual_stages: int = 1, weights: tuple[int, int] = (1, 1), head_layers: float = 0.0
) -> tuple[int, float]:
    """(the pipeline rank that runs the most of one micro-batch's compute, its share of the whole model's): its
    stages' decoder layers and, on the last rank, the LM head as `head_layers` layers' worth (the embedding's
    lookup counted as nothing). The pipeline moves at this rank's pace."""
    work = [float(rank_layers(num_layers, pp, r, virtual_stages, weights)) for r in range(pp)]
    work[-1] += head_layers
    rank = max(range(pp), key=work.__getitem__)
    return rank, work[rank] / (num_layers + head_layers)


def head_layer_equivalents(*, vocab_size: int, hidden_size: int, layer_params: float, seq_len: int) -> float:
    """The LM head's FLOPs per token in decoder layers' worth: 2 V h against a layer's 2 P (its weights as used
    per token) + 2 s h (causal attention, `model_parallel_step.attention_share`'s convention)."""
    return vocab_size * hidden_size / (layer_params + seq_len * hidden_size)


def check_schedule(schedule: str, pp: int, micro_batches: int, virtual_stages: int = 1) -> None:
    if schedule not in PIPELINE_SCHEDULES:
        raise TunecostError(f"unknown pipeline schedule {schedule!r}; known: {', '.join(PIPELINE_SCHEDULES)}")
    if pp < 1 or micro_batches < 1 or virtual_stages < 1:
        raise TunecostError(f"pipeline: pp {pp}, micro-batches {micro_batches}, virtual stages must be at least 1")
    if schedule == "1f1b" and micro_batches < pp:  # torch's Schedule1F1B refuses it
        raise TunecostError(f"pipeline schedule {schedule} needs at least as many micro-batches as stages ({pp})")
    if virtual_stages != 1 and schedule != "interleaved-1f1b":
        raise TunecostError(f"virtual stages apply to interleaved-1f1b only, not {schedule}")


def bubble_fraction(schedule: str, pp: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """Idle share of a step: (pp-1)/(m+pp-1) for GPipe and 1F1B, (pp-1)/(v*m+pp-1) interleaved (Narayanan et al.
    2021, sections 2.2.1-2.2.2: bubble time (p-1)(tf+tb), divided by v when interleaved, over m(tf+tb) of work).
    Interleaved assumes m >= pp: below it torch's schedule idles more (`bubble_from_order`, docs/multi-gpu.md)."""
    check_schedule(schedule, pp, micro_batches, virtual_stages)
    v = virtual_stages if schedule == "interleaved-1f1b" else 1
    return (pp - 1) / (v * micro_batches + pp - 1)


def in_flight_micro_batches(schedule: str, pp: int, micro_batches: int, stage: int, virtual_stages: int = 1) -> int:
    """Micro-batches whose activations rank `stage` holds at once: GPipe all m; 1F1B min(m, pp - stage); interleaved
    counted on torch's `ScheduleInterleaved1F1B` action order (model chunks x micro-batches, each 1/v of the rank's
    layers)."""
    check_schedule(schedule, pp, micro_batches, virtual_stages)
    if not 0 <= stage < pp:
        raise TunecostError(f"pipeline stage {stage} is outside 0..{pp - 1}")
    if schedule == "gpipe":
        return micro_batches
    if schedule == "1f1b":
        return min(micro_batches, pp - stage)
    return in_flight_from_order(schedule_order(schedule, pp, micro_batches, virtual_stages), stage)


def p2p_bytes_per_micro_batch(*, micro_batch_size: int, seq_len: int, hidden_size: int, bytes_per_element: int) -> int:
    """Bytes of the activation (micro_batch, seq, hidden) a stage sends forward; its gradient coming back is the
    same size."""
    return micro_batch_size * seq_len * hidden_size * bytes_per_element


def schedule_order(schedule: str, pp: int, micro_batches: int, virtual_stages: int = 1) -> dict[int, list[str]]:
    """torch's own action order per rank (`pipeline_order`, e.g. "0F1", "1B0"; "" an idle slot), from the schedule
    built over stand-in stages in a fake process group of `pp` ranks (so not inside an initialized group)."""
    check_schedule(schedule, pp, micro_batches, virtual_stages)
    v = virtual_stages if schedule == "interleaved-1f1b" else 1
    return {rank: list(actions) for rank, actions in enumerate(_torch_order(schedule, pp, micro_batches, v))}


@functools.lru_cache(maxsize=256)
def _torch_order(schedule: str, pp: int, micro_batches: int, v: int) -> tuple[tuple[str, ...], ...]:
    import torch
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    from tunecost.distributed.sharded_step import fake_process_group

    with fake_process_group(pp, 0):
        x = torch.empty(1, 1, device="meta")

        def stand_in(index: int):
            return PipelineStage(nn.Identity(), index, pp * v, torch.device("cpu"), input_args=x, output_args=x)

        sched: Any
        try:
            if schedule == "interleaved-1f1b":
                sched = ScheduleInterleaved1F1B([stand_in(k * pp) for k in range(v)], micro_batches)
            else:
                sched = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}[schedule](stand_in(0), micro_batches)
        except ValueError as exc:  # torch's own refusal, e.g. micro-batches that do not fill its rounds
            raise TunecostError(f"pipeline schedule {schedule}: {exc}") from None
        order = sched.pipeline_order or {}
    return tuple(tuple("" if a is None else str(a) for a in order[rank]) for rank in sorted(order))


def _compute(action: str) -> tuple[int, str] | None:
    """(stage, "F" | "B") of a forward or full-backward action, None for anything else."""
    for kind in ("F", "B"):
        head, sep, tail = action.partition(kind)
        if sep and head.isdigit() and tail.isdigit():
            return int(head), kind
    return None


def in_flight_from_order(order: dict[int, list[str]], rank: int) -> int:
    """Most forwards of `rank` not yet matched by their backward, walking its actions in order."""
    alive = most = 0
    for action in order[rank]:
        parsed = _compute(action)
        if parsed is not None:
            alive += 1 if parsed[1] == "F" else -1
            most = max(most, alive)
    return most


def bubble_from_order(order: dict[int, list[str]], *, forward_s: float = 1.0, backward_s: float = 2.0) -> float:
    """Idle share of the makespan when each rank runs its actions in torch's order as soon as their inputs exist:
    forward k of stage s after forward k of stage s-1, backward k after backward k of stage s+1 (the k-th forward or
    backward of a stage is micro-batch k, as the schedules run them). Communication is free."""
    queues = {rank: [a for a in (_compute(x) for x in acts) if a is not None] for rank, acts in order.items()}
    num_stages = 1 + max(s for q in queues.values() for s, _ in q)
    done: dict[tuple[int, str, int], float] = {}
    seen: dict[tuple[int, str], int] = {}
    free = dict.fromkeys(queues, 0.0)
    pos = dict.fromkeys(queues, 0)
    busy = dict.fromkeys(queues, 0.0)
    while any(pos[r] < len(q) for r, q in queues.items()):
        progressed = False
        for rank, queue in queues.items():
            while pos[rank] < len(queue):
                stage, kind = queue[pos[rank]]
                k = seen.get((stage, kind), 0)
                deps = [(stage - 1, "F", k)] if kind == "F" and stage > 0 else []
                if kind == "B":
                    deps = [(stage, "F", k)] + ([(stage + 1, "B", k)] if stage < num_stages - 1 else [])
                if any(d not in done for d in deps):
                    break
                cost = forward_s if kind == "F" else backward_s
                start = max([free[rank], *(done[d] for d in deps)])
                free[rank] = done[(stage, kind, k)] = start + cost
                busy[rank] += cost
                seen[(stage, kind)] = k + 1
                pos[rank] += 1
                progressed = True
        if not progressed:
            raise TunecostError("pipeline schedule order deadlocks")
    makespan = max(free.values())
    return 1.0 - max(busy.values()) / makespan


@dataclass(frozen=True, kw_only=True)
class StageParts:
    """What one pipeline rank holds beside its share of the states, from the single-GPU step at the micro-batch."""

    num_layers: int  # decoder layers of the rank's stages
    first: bool  # holds the embedding
    last: bool  # holds the final norm and the head
    in_flight: int  # micro-batches (chunk micro-batches when interleaved) whose activations it holds at once
    weight_share: float  # the rank's part of the stored weights (and, by bytes, of the trainable parameters)
    activations: int  # saved activations of the micro-batches in flight
    transient: int  # the largest temporaries of one micro-batch's forward or backward (+ gradient accumulation)
    inputs: int  # every micro-batch's token ids and labels
    p2p_buffers: int  # torch's receive buffers: one per micro-batch and boundary, activations in, gradients back


def stage_parts(
    step: SingleGpuStep,
    *,
    pp: int,
    stage: int,
    schedule: str = "1f1b",
    micro_batches: int | None = None,
    virtual_stages: int = 1,
    weights: tuple[int, int] = (1, 1),
) -> StageParts:
    """Pipeline rank `stage` of `pp` (its `virtual_stages` chunks when interleaved, the layers dealt with the
    embedding and the head counted as `weights` layers) from `step`, the single-GPU step traced at the MICRO-batch
    size: its layers, one micro-batch's saved activations of its parts x the micro-batches in flight, the largest
    transient of one micro-batch's forward or backward, the batch, and the receive buffers torch allocates per
    micro-batch. Agreement: docs/multi-gpu.md."""
    m = micro_batches or pp
    in_flight = in_flight_micro_batches(schedule, pp, m, stage, virtual_stages)
    v = virtual_stages if schedule == "interleaved-1f1b" else 1
    num_stages, chunks = pp * v, rank_stage_ids(stage, pp, v)
    first, last = 0 in chunks, num_stages - 1 in chunks
    n = sum(len(stage_layer_ids(step.num_layers, num_stages, c, weights)) for c in chunks)
    fwd = {k.split(":", 1)[1]: c for k, c in step.segments.items() if k.startswith("forward:")}
    act_first, act_last = fwd["unit_first"].get("activations", 0), fwd["unit_last"].get("activations", 0)
    pre = fwd["pre"].get("activations", 0)
    per_layer = (act_last - act_first) / max(step.num_layers - 1, 1) if step.num_layers > 1 else act_first - pre
    embed = step.weight_bytes_by_key.get("embedding/trainable_params", 0) + step.weight_bytes_by_key.get(
        "embedding/frozen_weights", 0
    )
    head = step.root_weight_bytes - embed
    held = n * step.layer_weight_bytes + (embed if first else 0) + (head if last else 0)
    head_saved = fwd["post"].get("activations", 0) - act_last if last else 0  # logits etc. kept for backward
    # in_flight counts chunk micro-batches when interleaved: each holds 1/v of the rank's layers
    activations = round(in_flight / v * (n * per_layer + (pre if first else 0) + head_saved))
    parts = ["unit_first", "unit_last", "unit_mid"] + (["pre"] if first else []) + (["post"] if last else [])
    transient = 0
    for key, cats in step.segments.items():
        phase, _, region = key.partition(":")
        if phase in ("forward", "backward") and region in parts:
            transient = max(transient, cats.get("temporaries", 0))
    if m > 1:  # from the 2nd micro-batch on, a fresh gradient is added into `.grad`: the largest, embedding or head
        keys = (["embedding/trainable_params"] if first else []) + (["lm_head/loss/trainable_params"] if last else [])
        transient += max((step.weight_bytes_by_key.get(k, 0) for k in keys), default=0)
    p2p = p2p_bytes_per_micro_batch(
        micro_batch_size=step.batch_size,
        seq_len=step.seq_len,
        hidden_size=step.hidden_size,
        bytes_per_element=step.activation_bytes_per_element,
    )
    return StageParts(
        num_layers=n,
        first=first,
        last=last,
        in_flight=in_flight,
        weight_share=held / step.weight_bytes,
        activations=activations,
        transient=transient,
        inputs=fwd["pre"].get("inputs", 0) * m,  # every rank loads the batch (token ids and labels)
        p2p_buffers=m * p2p * sum((c > 0) + (c < num_stages - 1) for c in chunks),
    )
