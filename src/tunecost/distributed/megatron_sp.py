"""Megatron-LM's sequence parallelism on a TP rank's traced (DTensor) step: the column-parallel projections'
inputs kept as sequence shards and gathered again in backward, where DTensor's ColwiseParallel keeps them gathered.
Derivation: docs/multi-gpu.md, "Activation memory per layer vs Korthikanti et al. 2022"."""

from __future__ import annotations

import dataclasses

from tunecost.distributed.activation_formulas import sp_gathered_excess_bytes, traced_layer_activation_bytes
from tunecost.distributed.single_step import SingleGpuStep
from tunecost.models.catalog import resolve_model
from tunecost.workload.job import FineTuneJob
from tunecost.workload.parallel import ModelParallel

MEGATRON_SP_ASSUMPTION = (
    "Megatron sequence parallelism: column-parallel inputs kept as sequence shards, gathered again in backward "
    "(one gathered input at a time counted among the temporaries)"
)
_LORA_INPUTS = {"attention": "qkv_input", "mlp": "mlp_input"}  # LoRA target -> the gathered input its factor keeps


def kept_gathered_inputs(job: FineTuneJob) -> tuple[str, ...]:
    """The gathered inputs the traced step keeps for backward: a projection's input is saved for its weight's
    gradient or its LoRA factor A's (full fine-tuning: both; LoRA: those of its targets). An MoE block's gathered
    tokens are kept by Megatron too (its token dispatcher permutes them for the experts): not an excess."""
    groups = ("attention",) if resolve_model(job.model).is_moe else tuple(_LORA_INPUTS)
    if job.method == "full":
        return tuple(_LORA_INPUTS[g] for g in groups)
    return tuple(_LORA_INPUTS[g] for g in groups if g in job.lora.targets)


def applies(plan: ModelParallel, job: FineTuneJob) -> bool:
    """Whether `plan` runs Megatron's SP on layers that are not recomputed (full recomputation keeps only the
    layer input either way)."""
    return plan.tp_impl == "megatron" and plan.sequence_parallel and plan.tp > 1 and not job.gradient_checkpointing


def _layers_held(segment: str, categories: dict[str, int], num_layers: int, per_layer: float) -> float:
    """Decoder layers whose saved activations a segment's peak holds (the running layer's included): none before
    the first layer's forward, one in the first layer, all from the last layer's forward through the head's
    backward; elsewhere (the backward after the layers', a middle unit) its activations read as whole layers'."""
    if segment in ("forward:pre", "optimizer:opt") or segment.endswith(":prefix"):
        return 0
    if segment.endswith(":unit_first"):
        return 1
    if segment in ("forward:unit_last", "forward:post", "backward:post", "backward:unit_last"):
        return num_layers
    return min(num_layers, categories.get("activations", 0) / per_layer) if per_layer > 0 else 0


def megatron_sp_step(step: SingleGpuStep, job: FineTuneJob, plan: ModelParallel) -> SingleGpuStep:
    """`step` (a TP rank's traced step under DTensor's SP) as Megatron's SP runs it: each layer's saved
    activations less the gathered inputs' excess over their shards (`sp_gathered_excess_bytes`); inside a layer's
    forward or backward one input gathered again (a temporary: at most one at a time). Unchanged unless `applies`."""
    inputs = kept_gathered_inputs(job)
    if not applies(plan, job) or not inputs:
        return step
    s, b, h, d = step.seq_len, step.batch_size, step.hidden_size, step.activation_bytes_per_element
    excess = sum(sp_gathered_excess_bytes(s, b, h, d=d, tp=plan.tp, inputs=inputs).values())
    per_layer = traced_layer_activation_bytes(step.segments, step.num_layers) if step.num_layers > 1 else 0.0
    segments = {}
    for key, categories in step.segments.items():
        held, out = _layers_held(key, categories, step.num_layers, per_layer), dict(categories)
        if held:
            out["activations"] = out.get("activations", 0) - round(held * excess)
        if "unit_" in key and not key.startswith("optimizer"):
            out["temporaries"] = out.get("temporaries", 0) + d * s * b * h
        segments[key] = out
    return dataclasses.replace(step, segments=segments)
