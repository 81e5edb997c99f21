"""One rank of a tensor-, pipeline- and context-parallel layout as a single-GPU step: the step a TP rank traces
(`tensor_parallel`), at the sequence a CP rank holds, cut to one pipeline stage; the data-parallel strategy then
applies to it over the `dp` ranks as on one GPU. Derivations: docs/multi-gpu.md, "Tensor, pipeline and context
parallelism"."""

from __future__ import annotations

import dataclasses

from tunecost.distributed.rank_memory import RankMemory, rank_memory
from tunecost.distributed.single_step import ROOT_GROUPS, SingleGpuStep, single_gpu_step
from tunecost.simulate.records import WEIGHT_CATEGORIES
from tunecost.workload.job import FineTuneJob
from tunecost.workload.parallel import ParallelPlan

FIRST_STAGE_GROUPS = ("embedding",)  # torchtitan's split: the embedding on the first stage
LAST_STAGE_GROUPS = ("lm_head/loss", "other")  # the final norm and the LM head (and its loss) on the last


def data_parallel_plan(plan: ParallelPlan) -> ParallelPlan:
    """The data-parallel part of `plan`: the dp x cp ranks that hold the same weights (CP ranks replicate them and
    reduce their gradients together, as torchtitan's dp_shard_cp mesh and Megatron's data-parallel group with CP
    do), with the GPUs per node left to them once TP (innermost, Megatron's rank order) takes its own."""
    ranks = plan.dp * plan.cp
    per_node = max(1, plan.node_size // plan.tp) if plan.gpus_per_node is not None else None
    alone = ranks == 1 and not plan.strategy.startswith("zero") and plan.offload == "none"  # nothing to shard
    return dataclasses.replace(
        plan,
        num_gpus=ranks,
        gpus_per_node=per_node,
        strategy="single" if alone else plan.strategy,
        tp=1,
        pp=1,
        cp=1,
        sequence_parallel=False,
        micro_batches=None,
        pipeline_schedule="1f1b",
        virtual_stages=1,
    )


def stage_names(pp: int) -> tuple[str, ...]:
    """The stages whose memory differs: the first and the last, and a middle one with 3 or more stages."""
    return ("all",) if pp == 1 else ("first", "last") if pp == 2 else ("first", "middle", "last")


def in_flight_micro_batches(plan: ParallelPlan, stage: str) -> int:
    """Micro-batches whose activations a stage holds at once: all of them under GPipe; under 1F1B the first stage
    min(m, pp), the last one; interleaved 1F1B's first stage (v-1) x pp more chunks of 1/v of a stage's layers,
    counted here in stage-sized micro-batches."""
    m, pp, v = plan.num_micro_batches, plan.pp, plan.virtual_stages
    if pp == 1:
        return 1
    if plan.pipeline_schedule == "gpipe":
        return m
    index = {"first": 0, "middle": pp // 2, "last": pp - 1}[stage]
    if plan.pipeline_schedule == "interleaved-1f1b":
        chunks = min(m * v, (pp - index) + (v - 1) * pp)
        return -(-chunks // v)
    return min(m, pp - index)


def _root_share(step: SingleGpuStep, category: str, stage: str) -> tuple[int, int]:
    """(bytes of `category` in the root groups the stage holds, in every root group) of the stored weights."""
    held = _held(stage)
    on_stage = total = 0
    for key, nbytes in step.weight_bytes_by_key.items():
        group, cat = key.rsplit("/", 1)
        if cat == category and group in ROOT_GROUPS:
            total += nbytes
            on_stage += nbytes if group in held else 0
    return on_stage, total


def stage_step(step: SingleGpuStep, *, pp: int, stage: str, in_flight: int) -> SingleGpuStep:
    """`step` cut to one of `pp` stages: its 1/pp of the decoder layers and its root groups (states, gradients and
    optimizer states with them), the activations of `in_flight` micro-batches through its layers, and a micro-
    batch's temporaries through its layers."""
    if pp == 1:
        return step
    layers = step.num_layers // pp
    share = layers / step.num_layers
    trainable_root, _ = _root_share(step, "trainable_params", stage)
    stage_trainable = trainable_root + layers * step.layer_trainable_bytes
    trainable_share = stage_trainable / step.trainable_bytes if step.trainable_bytes else 0.0

    def weights(category: str, nbytes: int) -> int:
        on_stage, root = _root_share(step, category, stage)
        return round(on_stage + (nbytes - root) * share)

    segments: dict[str, dict[str, int]] = {}
    for key, categories in step.segments.items():
        optimizer = key.startswith("optimizer")
        out: dict[str, int] = {}
        for category, nbytes in categories.items():
            if category in WEIGHT_CATEGORIES and category != "buffers":
                out[category] = weights(category, nbytes)
            elif category in ("gradients", "optimizer_states") or (optimizer and category == "temporaries"):
                out[category] = round(nbytes * trainable_share)
            elif category == "activations":
                out[category] = round(nbytes * share * in_flight)
            else:
                out[category] = round(nbytes * share)
        segments[key] = out
    by_key = {}
    for key, nbytes in step.weight_bytes_by_key.items():
        group, category = key.rsplit("/", 1)
        if group in ROOT_GROUPS:
            by_key[key] = nbytes if group in _held(stage) else 0
        else:
            by_key[key] = round(nbytes * share)
    flops = {p: v * (trainable_share if p == "optimizer" else share) for p, v in step.flops_by_phase.items()}
    root = sum(v for k, v in by_key.items() if k.rsplit("/", 1)[0] in ROOT_GROUPS)
    return dataclasses.replace(
        step,
        num_layers=layers,
        segments=segments,
        root_weight_bytes=root,
        trainable_bytes=stage_trainable,
        flops_by_phase=flops,
        weight_bytes_by_key=by_key,
        allocations={},  # the traced allocations are the whole model's: the stage's reserve is its peak
    )


def _held(stage: str) -> tuple[str, ...]:
    if stage == "all":
        return ROOT_GROUPS
    return FIRST_STAGE_GROUPS if stage == "first" else LAST_STAGE_GROUPS if stage == "last" else ()


def model_parallel_job(job: FineTuneJob, plan: ParallelPlan) -> FineTuneJob:
    """The job one rank runs: its micro-batch over the 1/cp of the sequence it holds."""
    return job if plan.cp == 1 else job.with_(seq_len=job.worst_case_seq_len // plan.cp)


def rank_step(job: FineTuneJob, plan: ParallelPlan, *, behaviour=None) -> SingleGpuStep:
    """The whole-model step of one TP/CP rank of `plan` (before the pipeline cut): the tensor-parallel rank's
    traced step, at the rank's share of the sequence."""
    rank_job = model_parallel_job(job, plan)
    if plan.tp == 1:
        return single_gpu_step(rank_job, behaviour=behaviour)
    from tunecost.distributed.tensor_parallel import tp_single_gpu_step

    return tp_single_gpu_step(rank_job, tp=plan.tp, sequence_parallel=plan.sequence_parallel)


def stage_steps(step: SingleGpuStep, plan: ParallelPlan) -> dict[str, SingleGpuStep]:
    """stage name -> the step of a rank on that stage (one entry, "all", without a pipeline)."""
    return {
        s: stage_step(step, pp=plan.pp, stage=s, in_flight=in_flight_micro_batches(plan, s))
        for s in stage_names(plan.pp)
    }


def boundary_bytes(step: SingleGpuStep, plan: ParallelPlan) -> int:
    """One micro-batch's activation between two stages (b x s x h, the compute dtype; with sequence parallelism
    a TP rank sends its 1/tp of the sequence)."""
    tokens = step.batch_size * step.seq_len // (plan.tp if plan.sequence_parallel else 1)
    return tokens * step.hidden_size * step.activation_bytes_per_element


def model_parallel_rank_memory(step: SingleGpuStep, job: FineTuneJob, plan: ParallelPlan) -> RankMemory:
    """The peak of the most loaded rank of `plan`: each stage's step (`stage_steps` of the TP/CP rank's `step`)
    under the data-parallel strategy over `dp` ranks, plus the pipeline's send and receive buffers."""
    dp = data_parallel_plan(plan)
    best: RankMemory | None = None
    for name, stage in stage_steps(step, plan).items():
        memory = rank_memory(stage, job, dp)
        extra = {}
        if plan.pp > 1:  # a send and a receive buffer per direction on a middle stage, one each at the ends
            extra["p2p_buffers"] = (4 if name == "middle" else 2) * boundary_bytes(step, plan)
        memory = dataclasses.replace(
            memory,
            num_gpus=plan.num_gpus,
            peak_bytes=memory.peak_bytes + sum(extra.values()),
            peak_reserved_bytes=memory.peak_reserved_bytes + sum(extra.values()),
            peak_segment=f"{name} stage: {memory.peak_segment}" if plan.pp > 1 else memory.peak_segment,
            breakdown_bytes={**memory.breakdown_bytes, **extra},
            assumptions=(*memory.assumptions, *model_parallel_assumptions(plan)),
        )
        if best is None or memory.need_bytes > best.need_bytes:
            best = memory
    assert best is not None
    return best


def model_parallel_assumptions(plan: ParallelPlan) -> tuple[str, ...]:
    out = []
    if plan.tp > 1:
        sp = " with sequence parallelism" if plan.sequence_parallel else ""
        out.append(
            f"tensor parallelism over {plan.tp} ranks{sp}: the rank's step traced under PyTorch's parallelize_module "
            "(torchtitan's plan) on a fake process group"
        )
    if plan.cp > 1:
        out.append(f"context parallelism over {plan.cp} ranks: each rank traced at 1/{plan.cp} of the sequence")
    if plan.pp > 1:
        out.append(
            f"pipeline of {plan.pp} stages ({plan.pipeline_schedule}, {plan.num_micro_batches} micro-batches): each "
            "stage 1/pp of the decoder layers, the embedding on the first and the final norm and LM head on the last; "
            "activations of the micro-batches in flight on the stage; the stage's reserve is its peak"
        )
    if plan.model_parallel > 1:
        out.append(
            f"the data-parallel strategy over the {plan.dp * plan.cp} rank(s) holding the same weights (dp x cp)"
        )
    return tuple(out)
