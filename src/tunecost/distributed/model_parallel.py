"""One rank of a tensor-, pipeline- and context-parallel layout as a single-GPU step: the step a TP rank traces
(`tensor_parallel`), at the sequence a CP rank holds, cut to one pipeline stage; the data-parallel strategy then
applies to it over the `dp` ranks as on one GPU. Derivations: docs/multi-gpu.md, "Tensor, pipeline and context
parallelism"."""

from __future__ import annotations

import dataclasses
import math

from tunecost.distributed import megatron_sp
from tunecost.distributed.pipeline import StageParts, stage_parts
from tunecost.distributed.rank_memory import RankMemory, rank_memory
from tunecost.distributed.single_step import ROOT_GROUPS, SingleGpuStep, single_gpu_step
from tunecost.simulate.step_types import WEIGHT_CATEGORIES
from tunecost.workload.job import FineTuneJob
from tunecost.workload.parallel import ModelParallel, ParallelPlan

FIRST_STAGE_GROUPS = ("embedding",)  # torchtitan's split: the embedding on the first stage
LAST_STAGE_GROUPS = ("lm_head/loss", "other")  # the final norm and the LM head (and its loss) on the last


def data_parallel_plan(plan: ParallelPlan) -> ParallelPlan:
    """The data-parallel part of `plan`: the dp x cp ranks that hold the same weights (CP ranks replicate them and
    reduce their gradients together, as torchtitan's dp_shard_cp mesh and Megatron's data-parallel group with CP
    do), with the GPUs per node left to them once TP (innermost, Megatron's rank order) takes its own."""
    ranks = plan.dp * plan.cp
    # ranks of the group per node; a group that fills no whole nodes (pp splits them) counted in equal parts
    per_node = math.gcd(ranks, max(1, plan.node_size // plan.tp)) if plan.gpus_per_node is not None else None
    alone = ranks == 1 and not plan.strategy.startswith("zero") and plan.offload == "none"  # nothing to shard
    return dataclasses.replace(
        plan,
        num_gpus=ranks,
        gpus_per_node=per_node,
        strategy="single" if alone else plan.strategy,
        **dataclasses.asdict(ModelParallel()),
    )


def _held_groups(step: SingleGpuStep, parts: StageParts) -> tuple[str, ...]:
    """The root groups a stage holds. A head tied to the embedding (no bytes of its own in the traced step) is a
    copy of the embedding on a last stage that is not also the first: each stage holds its own modules."""
    head = sum(v for k, v in step.weight_bytes_by_key.items() if k.rsplit("/", 1)[0] == "lm_head/loss")
    tied_copy = parts.last and not parts.first and head == 0
    return (FIRST_STAGE_GROUPS if parts.first or tied_copy else ()) + (LAST_STAGE_GROUPS if parts.last else ())


def _weights(step: SingleGpuStep, category: str, parts: StageParts, held: tuple[str, ...]) -> int:
    """The stage's bytes of a stored-weight category: its layers' share and the root groups it holds (`held`)."""
    on_stage = root = 0
    for key, nbytes in step.weight_bytes_by_key.items():
        group, cat = key.rsplit("/", 1)
        if cat == category and group in ROOT_GROUPS:
            root += nbytes
            on_stage += nbytes if group in held else 0
    whole = sum(v for k, v in step.weight_bytes_by_key.items() if k.rsplit("/", 1)[1] == category)
    return round(on_stage + (whole - root) * parts.num_layers / step.num_layers)


def stage_step(step: SingleGpuStep, plan: ParallelPlan, stage: int) -> SingleGpuStep:
    """`step` (one micro-batch) cut to pipeline rank `stage` of `plan`: its layers and root groups with their
    gradients and optimizer states, and two segments, the passes (the activations of the micro-batches in flight,
    one micro-batch's largest temporaries, the batch's inputs: `pipeline.stage_parts`) and the optimizer step."""
    parts = stage_parts(
        step,
        pp=plan.pp,
        stage=stage,
        schedule=plan.pipeline_schedule,
        micro_batches=plan.num_micro_batches,
        virtual_stages=plan.virtual_stages,
        weights=plan.stage_weights(step.num_layers),
    )
    groups = _held_groups(step, parts)
    weights = {c: _weights(step, c, parts, groups) for c in WEIGHT_CATEGORIES if c != "buffers"}
    trainable = weights.get("trainable_params", 0)
    share = trainable / step.trainable_bytes if step.trainable_bytes else 0.0
    opt = step.segments["optimizer:opt"]
    states = {**weights, "gradients": round(opt.get("gradients", 0) * share)}
    states["optimizer_states"] = round(opt.get("optimizer_states", 0) * share)
    passes = {**states, "activations": parts.activations, "temporaries": parts.transient, "inputs": parts.inputs}
    # torch's receive buffers (a sequence shard under sequence parallelism) and the batch stay allocated through
    # the optimizer step
    p2p = parts.p2p_buffers // plan.tp if plan.sequence_parallel and plan.tp > 1 else parts.p2p_buffers
    passes["p2p_buffers"] = p2p
    optimizer = {**states, "temporaries": round(opt.get("temporaries", 0) * share), "inputs": parts.inputs}
    optimizer["p2p_buffers"] = p2p
    by_key = {}
    for key, nbytes in step.weight_bytes_by_key.items():
        group = key.rsplit("/", 1)[0]
        by_key[key] = (
            (nbytes if group in groups else 0)
            if group in ROOT_GROUPS
            else round(nbytes * parts.num_layers / step.num_layers)
        )
    layer_share = parts.num_layers / step.num_layers
    flops = {p: v * (share if p == "optimizer" else layer_share) for p, v in step.flops_by_phase.items()}
    # FP8's weight copies with the stage's layers; its saved inputs for each micro-batch (chunk) in flight
    chunk_share = layer_share / plan.virtual_stages * parts.in_flight
    scale = {"activations": chunk_share, "temporaries": 1.0}
    fp8 = {c: round(v * scale.get(c, layer_share)) for c, v in step.fp8_bytes.items()}
    return dataclasses.replace(
        step,
        num_layers=parts.num_layers,
        segments={"backward:stage": passes, "optimizer:opt": optimizer},
        root_weight_bytes=sum(v for k, v in by_key.items() if k.rsplit("/", 1)[0] in ROOT_GROUPS),
        trainable_bytes=trainable,
        flops_by_phase=flops,
        weight_bytes_by_key=by_key,
        allocations={},  # the traced allocations are the whole model's: the stage's reserve is its peak
        fp8_bytes=fp8,
    )


def model_parallel_job(job: FineTuneJob, plan: ParallelPlan) -> FineTuneJob:
    """The job one rank runs: its micro-batch over the 1/cp of the sequence it holds."""
    return job if plan.cp == 1 else job.with_(seq_len=job.worst_case_seq_len // plan.cp)


def rank_step(job: FineTuneJob, plan: ParallelPlan, *, behaviour=None) -> SingleGpuStep:
    """The whole-model step of one TP/CP rank of `plan` (before the pipeline cut): the tensor-parallel rank's
    traced step, at the rank's share of the sequence (with Megatron's SP, `megatron_sp.megatron_sp_step`)."""
    rank_job = model_parallel_job(job, plan)
    if plan.tp == 1:
        return single_gpu_step(rank_job, behaviour=behaviour)
    from tunecost.distributed.tp_single_step import tp_single_gpu_step

    step = tp_single_gpu_step(rank_job, tp=plan.tp, sequence_parallel=plan.sequence_parallel)
    return megatron_sp.megatron_sp_step(step, rank_job, plan)


def first_stage(step: SingleGpuStep, plan: ParallelPlan) -> SingleGpuStep:
    """The step of pipeline rank 0 (the most micro-batches in flight; `step` itself without a pipeline): the
    stage the step time is priced on."""
    return step if plan.pp == 1 else stage_step(step, plan, 0)


def stage_steps(step: SingleGpuStep, plan: ParallelPlan) -> dict[int, SingleGpuStep]:
    """pipeline rank -> the step of that rank (`step` itself, rank 0, without a pipeline)."""
    return {0: step} if plan.pp == 1 else {s: stage_step(step, plan, s) for s in range(plan.pp)}


def model_parallel_rank_memory(step: SingleGpuStep, job: FineTuneJob, plan: ParallelPlan) -> RankMemory:
    """The peak of the most loaded rank of `plan`: each pipeline rank's step (`stage_steps` of the TP/CP rank's
    `step`) under the data-parallel strategy over the dp x cp ranks that hold the same weights."""
    dp = data_parallel_plan(plan)
    best: RankMemory | None = None
    for stage, stage_of in stage_steps(step, plan).items():
        memory = rank_memory(stage_of, job, dp)
        where = f"pipeline rank {stage}: {memory.peak_segment}" if plan.pp > 1 else memory.peak_segment
        memory = dataclasses.replace(
            memory,
            num_gpus=plan.num_gpus,
            peak_segment=where,
            assumptions=(*memory.assumptions, *model_parallel_assumptions(plan, step.num_layers, job)),
        )
        if best is None or memory.need_bytes > best.need_bytes:
            best = memory
    assert best is not None
    return best


def model_parallel_assumptions(plan: ParallelPlan, num_layers: int, job: FineTuneJob | None = None) -> tuple[str, ...]:
    out = []
    if plan.tp > 1:
        sp = " with sequence parallelism" if plan.sequence_parallel else ""
        out.append(
            f"tensor parallelism over {plan.tp} ranks{sp}: the rank's step traced under PyTorch's parallelize_module "
            "(torchtitan's plan) on a fake process group"
        )
    if job is not None and megatron_sp.applies(plan, job) and megatron_sp.kept_gathered_inputs(job):
        out.append(megatron_sp.MEGATRON_SP_ASSUMPTION)
    if plan.cp > 1:
        out.append(f"context parallelism over {plan.cp} ranks: each rank traced at 1/{plan.cp} of the sequence")
    if plan.pp > 1:
        out.append(
            f"pipeline of {plan.pp} stages ({plan.pipeline_schedule}, {plan.num_micro_batches} micro-batches): "
            f"{plan.split_text(num_layers)}; the activations of the micro-batches in flight, one micro-batch's "
            "largest temporaries and a receive buffer per micro-batch and boundary (torch.distributed.pipelining); "
            "the reserve is the peak"
        )
    if plan.degree > 1:
        out.append(
            f"the data-parallel strategy over the {plan.dp * plan.cp} rank(s) holding the same weights (dp x cp)"
        )
    return tuple(out)
