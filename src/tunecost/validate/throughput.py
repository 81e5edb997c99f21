"""Throughput rows: the throughput model's step time per row, one stack parameter calibrated per (stack, GPU).

The counts, GPU terms and stack parameters of `tunecost.estimate.throughput`; the one fitted parameter is
`gemm_efficiency`, solved per (stack, GPU) on its calibration row (the most FLOPs per optimizer step) and used for
the group's other rows. A multi-GPU row adds the communication compute does not hide.
Sources and derivations: docs/validation.md, section `tunecost.validate.throughput`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from tunecost.catalog.gpu_terms import GpuTerms
from tunecost.catalog.gpus import GPU
from tunecost.estimate.throughput.activation_offload import copies_seconds, with_copies_s
from tunecost.estimate.throughput.counts import AnalyticStepCounts, accumulated, analytic_step_counts
from tunecost.estimate.throughput.model import StackParams, catalog_gpu_terms, step_time
from tunecost.estimate.throughput.priors import PRIORS
from tunecost.estimate.throughput.stack_priors import (
    FITTED_PARAMETER,
    LORA_COMPUTE_DTYPE_FAMILIES,
    TE_LAYERS_FAMILY,
    stack_family,
)
from tunecost.models.catalog import resolve_model
from tunecost.simulate.behaviour import runs_fused_adamw
from tunecost.validate.corpus import CorpusRow
from tunecost.validate.mapping import MappedRow
from tunecost.validate.stacks import torchtune_options

if TYPE_CHECKING:
    from tunecost.distributed.single_step import SingleGpuStep

CALIBRATION_REASON = "calibration row"
AT_BOUND_REASON = f"{FITTED_PARAMETER} at its bound"  # a group no efficiency reproduces (`efficiency_bound`)
_BISECTION_STEPS = 80
_LOWEST_EFFICIENCY = PRIORS[FITTED_PARAMETER].lower


def stack_params(gemm_efficiency: float) -> StackParams:
    """A stack's parameters: the fitted GEMM efficiency, every other one at its prior's centre."""
    return StackParams(
        gemm_efficiency=gemm_efficiency,
        gemm_half_rows=PRIORS["gemm_half_rows"].centre,
        memory_efficiency=PRIORS["memory_efficiency"].centre,
        kernel_overhead_s=PRIORS["kernel_overhead_s"].centre,
        step_overhead_s=PRIORS["step_overhead_s"].centre,
    )


def gpu_terms(gpu: GPU) -> GpuTerms:
    return catalog_gpu_terms(gpu)


def micro_batch_counts(mapped: MappedRow) -> AnalyticStepCounts:
    """One micro-batch of the row's job, with its optimizer step (the throughput model's analytic counts)."""
    family = stack_family(mapped.stack.name)
    return analytic_step_counts(
        resolve_model(mapped.job.model),
        mapped.job,
        mapped.lengths,
        te_layers=family == TE_LAYERS_FAMILY,
        lora_compute_dtype=family in LORA_COMPUTE_DTYPE_FAMILIES,
    )


CountsFn = Callable[[MappedRow], AnalyticStepCounts]


def step_counts(mapped: MappedRow, counts_fn: CountsFn = micro_batch_counts) -> AnalyticStepCounts:
    """One optimizer step of the row: its micro-batch counts accumulated over grad_accum micro-batches."""
    return accumulated(counts_fn(mapped), mapped.grad_accum)


def rank_step(mapped: MappedRow) -> SingleGpuStep:
    """The simulated single-GPU step a rank of the row's layout derives from (cached on disk per job)."""
    from tunecost.distributed.rank_memory import single_gpu_step

    if mapped.model_parallel is not None:  # the TP/CP rank's whole-model step
        from tunecost.distributed.model_parallel import rank_step as model_parallel_rank_step

        return model_parallel_rank_step(mapped.simulator_job, mapped.plan(), behaviour=mapped.behaviour)
    return single_gpu_step(mapped.simulator_job, behaviour=mapped.behaviour)


RankStepFn = Callable[[MappedRow], "SingleGpuStep"]
RankExtraFn = Callable[[float, float], float]  # (micro-batch compute s, single-GPU optimizer s) -> a rank's extra s


def exposed_comm_fn(mapped: MappedRow, gpu: GPU, rank_step_fn: RankStepFn = rank_step) -> RankExtraFn:
    """Seconds per optimizer step that one rank of the row's layout spends beyond a single GPU's step, as a
    function of one micro-batch's compute seconds and the single GPU's optimizer seconds
    (`distributed.timing.step_time` over the GPU's default node link and, beyond one node, its default network):
    the communication its compute does not hide, summed over the row's micro-batches (every one all-gathers the
    sharded weights; under a stack's `no_sync` accumulation only the last reduces the gradients), and its own
    optimizer step against the single GPU's (`rank_optimizer_seconds`: a shard of it, or the host's). The rank's
    simulated step is traced once, here, and may raise."""
    from tunecost.distributed.timing import NO_SYNC_STRATEGIES, default_links, rank_optimizer_seconds, step_time

    plan = mapped.plan()
    if plan.num_gpus == 1:
        return lambda _micro_step_s, _optimizer_s: 0.0
    traced, links = rank_step_fn(mapped), default_links(gpu, plan.node_size)
    accumulate = mapped.grad_accum
    unsynced = accumulate - 1 if mapped.stack.no_sync_accumulation and plan.strategy in NO_SYNC_STRATEGIES else 0

    fused = runs_fused_adamw(mapped.job.stack, mapped.behaviour)

    def exposed(micro_step_s: float, sync: bool) -> float:
        return step_time(traced, plan, links, micro_step_s, sync_gradients=sync)[0].exposed_comm_seconds

    def per_step(micro_step_s: float, optimizer_s: float = 0.0) -> float:
        synced = (accumulate - unsynced) * exposed(micro_step_s, True)
        own = rank_optimizer_seconds(traced, plan, links, optimizer_s, fused_adamw=fused) - optimizer_s
        return synced + (unsynced * exposed(micro_step_s, False) if unsynced else 0.0) + own

    return per_step


def exposed_comm_s(mapped: MappedRow, gpu: GPU, micro_step_s: float, rank_step_fn: RankStepFn = rank_step) -> float:
    """`exposed_comm_fn` at one micro-batch's compute seconds."""
    return exposed_comm_fn(mapped, gpu, rank_step_fn)(micro_step_s, 0.0)


def step_seconds(counts: AnalyticStepCounts, terms: GpuTerms, gemm_efficiency: float) -> float:
    return step_time(counts, terms, stack_params(gemm_efficiency)).step_s


StepFn = Callable[[float], float]  # a row's predicted seconds per optimizer step at a GEMM efficiency


def row_step_fn(
    mapped: MappedRow,
    counts: AnalyticStepCounts,
    terms: GpuTerms,
    gpu: GPU,
    counts_fn: CountsFn = micro_batch_counts,
    rank_step_fn: RankStepFn = rank_step,
) -> StepFn:
    """The row's seconds per optimizer step as a function of the GEMM efficiency: the single-GPU step of its
    `counts`, plus on several GPUs the communication its micro-batches do not hide (`exposed_comm_fn`, which may
    raise), with the rank's own share of the optimizer step."""
    if mapped.num_gpus == 1 and mapped.behaviour.activation_offload:
        spec = resolve_model(mapped.job.model)
        copies_s = copies_seconds(spec, mapped.job, counts.tokens_per_step, gpu.name)  # every micro-batch's
        return lambda eff: with_copies_s(step_seconds(counts, terms, eff), copies_s)
    if mapped.num_gpus == 1:
        return lambda eff: step_seconds(counts, terms, eff)
    if mapped.model_parallel is not None:
        return model_parallel_step_fn(mapped, terms, gpu, counts_fn, rank_step_fn)
    extra = exposed_comm_fn(mapped, gpu, rank_step_fn)
    micro = counts_fn(mapped)

    def step_of(eff: float) -> float:
        whole = step_time(counts, terms, stack_params(eff))
        return whole.step_s + extra(step_seconds(micro, terms, eff), whole.class_s.get("optimizer", 0.0))

    return step_of


def model_parallel_step_fn(
    mapped: MappedRow, terms: GpuTerms, gpu: GPU, counts_fn: CountsFn, rank_step_fn: RankStepFn
) -> StepFn:
    """A TP/PP/CP row's seconds per optimizer step: its rank's share of each micro-batch's single-GPU compute, with
    the model-parallel collectives, the pipeline's bubble and the data-parallel collectives
    (`distributed.model_parallel_step`); the row's gradient accumulation is the pipeline's micro-batches, and
    the optimizer's step is spread over them."""
    from tunecost.distributed.model_parallel import first_stage
    from tunecost.distributed.model_parallel_step import lm_head_layers, model_parallel_step_time
    from tunecost.distributed.timing import default_links
    from tunecost.models.catalog import resolve_model

    plan = mapped.plan()
    if plan.pp == 1 and mapped.grad_accum > 1:
        plan = dataclasses.replace(plan, micro_batches=mapped.grad_accum)
    rank = rank_step_fn(mapped)
    stage = first_stage(rank, plan)
    links, spec = default_links(gpu, plan.node_size), resolve_model(mapped.job.model)
    head = lm_head_layers(spec, mapped.job.experts_per_token, rank.seq_len * plan.cp) if plan.pp > 1 else 0.0
    fused = runs_fused_adamw(mapped.job.stack, mapped.behaviour)
    m = plan.num_micro_batches  # the optimizer runs once per step: a micro-batch's share of it, 1/m
    step = accumulated(counts_fn(mapped), m)

    def step_of(eff: float) -> float:
        whole = step_time(step, terms, stack_params(eff))
        timed = model_parallel_step_time(
            stage,
            plan,
            links,
            whole.step_s / m,
            spec=spec,
            fused_adamw=fused,
            optimizer_fraction=whole.optimizer_fraction,
            head_layers=head,
        )
        return timed[0].step_seconds

    return step_of


def gemm_efficiency_from(step_of: StepFn, measured_step_s: float) -> float | None:
    """The GEMM efficiency at which `step_of` (a row's step, `row_step_fn`) equals `measured_step_s` (None when
    no efficiency in (lowest prior bound, 1] reaches it: the step is faster than the model at full efficiency, or
    slower than at the lowest). The step falls monotonically with the efficiency (compute, and the communication
    it leaves exposed): bisection on its logarithm."""
    if not reproducible(step_of, measured_step_s):
        return None
    lo, hi = _LOWEST_EFFICIENCY, 1.0
    for _ in range(_BISECTION_STEPS):
        mid = math.sqrt(lo * hi)
        if step_of(mid) > measured_step_s:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def reproducible(step_of: StepFn, measured_step_s: float) -> bool:
    """Whether some GEMM efficiency in (lowest prior bound, 1] gives `measured_step_s`: it lies between the steps
    at the two ends."""
    return step_of(1.0) <= measured_step_s <= step_of(_LOWEST_EFFICIENCY)


def efficiency_bound(step_of: StepFn, measured_step_s: float) -> float:
    """The end of the GEMM efficiency's range nearest to a step no efficiency reproduces: 1 for a step faster than
    the model at full efficiency, the lowest prior bound for one slower than at the lowest."""
    return 1.0 if measured_step_s < step_of(1.0) else _LOWEST_EFFICIENCY


def calibration_failure(
    step_of: StepFn, counts: AnalyticStepCounts, terms: GpuTerms, measured_step_s: float, *, one_gpu: bool
) -> str:
    """Why no GEMM efficiency reproduces a measured step: the row's step at the end of the range it lies beyond,
    and for a single-GPU row what in it no efficiency shortens (a rank's step also holds communication, and under
    TP/PP/CP a share of `counts`)."""
    end = efficiency_bound(step_of, measured_step_s)
    faster = end == 1.0
    parts = ": one rank's step, communication included"
    if one_gpu:
        at_end = step_time(counts, terms, stack_params(end))
        memory_s = sum(s for c, s in at_end.class_s.items() if at_end.bound_by_class[c] == "memory")
        parts = (
            f", of which {memory_s:.3g} s memory-bound work and {at_end.exposed_host_s:.3g} s host time not hidden "
            f"under GPU work; host syncs {at_end.host_sync}"
        )
    return (
        f"measured {measured_step_s:.3g} s per step, {'faster' if faster else 'slower'} than the counts at "
        f"{FITTED_PARAMETER} {end:g} ({step_of(end):.3g} s{parts})"
    )


def group_key(row: CorpusRow, mapped: MappedRow) -> tuple[str, str, str]:
    """The (stack, GPU) a row calibrates with: the named stack and the row's own stack cell (a plugin named there,
    such as fms-acceleration's accelerated-peft-bnb, is another software stack), and the catalog GPU."""
    assert mapped.gpu_name is not None
    return mapped.stack.name, row.get("stack").strip(), mapped.gpu_name


def unmodelled_settings(row: CorpusRow, mapped: MappedRow) -> str | None:
    """Why the throughput counts cannot represent this row's settings (None: they can)."""
    stated = f"{row.get('stack')} ; {row.get('stack_versions')} ; {row.get('notes')}"
    stack = mapped.stack
    if mapped.job.method == "full" and not stack.full_finetune_modelled:
        return f"full fine-tune under stack {stack.name} not modelled ({stack.full_skip_reason}: not torch AdamW)"
    if "activation offload" in torchtune_options(stated):
        if not stack.simulator_spec.torchtune_recipes:
            return f"activation offload under stack {stack.name} not modelled (torchtune's OffloadActivations is)"
        if not mapped.behaviour.activation_offload:
            return "activation offload named in the notes only (validate reads it in the stack or stack_versions cell)"
        if mapped.num_gpus > 1:
            return "activation offload on several GPUs not modelled (host copies beside the collectives)"
        if not mapped.job.gradient_checkpointing:
            return "activation offload without gradient checkpointing not modelled (every activation copied)"
    if mapped.job.attention == "eager":
        return "eager attention not modelled for throughput (the counts are FlashAttention-2's)"
    return None


def beyond_peak(row: CorpusRow, mapped: MappedRow, gpu: GPU, measured: float) -> str | None:
    """Why a measurement cannot be what the row says (None: it can): it implies more FLOP/s per GPU than the GPU's
    datasheet tensor peak for the least work the step must do (no recomputation), as a total over the GPUs read per
    GPU does. A tensor- or pipeline-parallel row is not checked (its rank does a share of the counts)."""
    if mapped.model_parallel is not None:
        return None
    least = dataclasses.replace(mapped, job=mapped.job.with_(gradient_checkpointing=False, selective_recompute=False))
    flops = step_counts(least).total_flops
    step_s = to_step_seconds(row.get("quantity"), measured, shape_of(mapped))
    fp8 = mapped.job.fp8 != "none" and gpu.fp8_tensor_flops_per_s is not None
    peak = gpu.fp8_tensor_flops_per_s if fp8 else gpu.bf16_tensor_flops_per_s
    assert peak is not None
    if flops / step_s <= peak:
        return None
    return (
        f"implausible: {row.get('value')} {row.get('unit')} is {flops / step_s / 1e12:.0f} TFLOP/s per GPU for the "
        f"step's least work (no recomputation), above the {gpu.name}'s {peak / 1e12:.0f} TFLOP/s "
        f"{'FP8' if fp8 else 'bf16'} tensor peak (a total over the {mapped.num_gpus} GPUs read per GPU?)"
    )


class StepShape(NamedTuple):
    """What converts a step time into a row's quantity: the micro-batch, its sequence length, the micro-batches per
    step, the data-parallel ranks that split the batch and the GPUs of one rank (TP x PP x CP)."""

    batch: int
    seq_len: int
    grad_accum: int = 1
    num_gpus: int = 1
    model_parallel: int = 1


def shape_of(m: MappedRow) -> StepShape:
    plan = m.plan() if m.model_parallel is not None else None
    return StepShape(
        batch=m.job.batch_size,
        seq_len=int(m.job.seq_len or 0),
        grad_accum=m.grad_accum,
        num_gpus=m.num_gpus if plan is None else plan.dp,
        model_parallel=1 if plan is None else plan.tp * plan.pp * plan.cp,
    )


def tokens_per_step(batch: int, seq_len: int, grad_accum: int) -> int:
    return batch * seq_len * grad_accum


def to_step_seconds(quantity: str, value: float, shape: StepShape) -> float:
    """A measured throughput figure as seconds per optimizer step: tokens per second per GPU (a data-parallel
    rank's tokens shared by its GPUs), tokens or samples per second of the whole job (every data-parallel rank's
    micro-batches), or seconds per step."""
    if quantity == "s_per_step":
        return value
    if quantity == "tokens_per_s_per_gpu":
        return tokens_per_step(shape.batch, shape.seq_len, shape.grad_accum) / shape.model_parallel / value
    if quantity == "tokens_per_s":
        return tokens_per_step(shape.batch, shape.seq_len, shape.grad_accum) * shape.num_gpus / value
    if quantity == "samples_per_s":
        return shape.batch * shape.grad_accum * shape.num_gpus / value
    raise ValueError(quantity)


def from_step_seconds(quantity: str, step_s: float, shape: StepShape) -> float:
    """Seconds per optimizer step as the row's quantity (`to_step_seconds` is its own inverse: X / value)."""
    return to_step_seconds(quantity, step_s, shape)
