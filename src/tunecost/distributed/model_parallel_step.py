"""The step time of one rank of a tensor-, pipeline- and context-parallel layout: its share of the single-GPU
compute, the TP, CP and pipeline communication of its micro-batches (`model_parallel_comm`), the pipeline's
bubble, and the data-parallel collectives over `dp` ranks as `timing` times them. Derivations: docs/multi-gpu.md,
"Tensor, pipeline and context parallelism"."""

from __future__ import annotations

from tunecost.distributed import model_parallel_comm as mpc
from tunecost.distributed import overlap
from tunecost.distributed.model_parallel import data_parallel_plan
from tunecost.distributed.pipeline import head_layer_equivalents, rank_layers, slowest_rank
from tunecost.distributed.single_step import SingleGpuStep
from tunecost.distributed.timing import Links, StepCollective, step_time
from tunecost.models.catalog import ModelSpec
from tunecost.models.params import count_parameters
from tunecost.workload.parallel import ParallelPlan


def attention_share(seq_len: int, hidden_size: int) -> float:
    """Causal attention's share of a decoder layer's FLOPs per token: 2 s h of 24 h^2 + 2 s h (GPT's block)."""
    return seq_len / (12 * hidden_size + seq_len)


def lm_head_layers(spec: ModelSpec, experts_per_token: int | None, seq_len: int) -> float:
    """The LM head's GEMM in decoder layers' worth at `seq_len` tokens (`pipeline.head_layer_equivalents`)."""
    counts = count_parameters(spec, experts_per_token)
    layer_params = (counts.active - counts.embedding) / spec.num_layers
    return head_layer_equivalents(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, layer_params=layer_params, seq_len=seq_len
    )


def _seconds(c: mpc.ModelParallelCollective, links: Links) -> float:
    return mpc.collective_seconds_on_links(
        c,
        node_bus_bandwidth_bytes_per_s=links.node.bus_bandwidth_bytes_per_s,
        node_latency_seconds=links.node.latency_seconds,
        nic_bus_bandwidth_bytes_per_s=links.network.bus_bandwidth_bytes_per_s,
        nic_latency_seconds=links.network.latency_seconds,
        nics_per_node=links.nics_per_node,
    )


def model_parallel_comm(
    step: SingleGpuStep, plan: ParallelPlan, links: Links, spec: ModelSpec, layer_seconds: float, stage: int = 0
) -> tuple[tuple[StepCollective, ...], float]:
    """(the TP, CP and pipeline collectives of a step on a rank of pipeline `stage`, the seconds they leave
    exposed). The pipeline's block the compute; TP's too, unless `plan.tp_comm_overlap`: then they hide under the
    step's linear GEMMs (the layers' compute beside attention), what exceeds them exposed; CP's K/V sends of each
    ring step hide under the attention of one block, the rest of the layer's compute not counted (`attention_share`)."""
    collectives = mpc.model_parallel_collectives(
        plan,
        batch=step.batch_size,
        seq_len=step.seq_len * plan.cp,
        hidden=spec.hidden_size,
        num_layers=spec.num_layers,
        num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads,
        bytes_per_element=step.activation_bytes_per_element,
        recompute=step.recompute,
        stage=stage,
    )
    share = attention_share(step.seq_len * plan.cp, spec.hidden_size)
    block = layer_seconds * share / max(1, plan.cp)
    layers = rank_layers(spec.num_layers, plan.pp, stage, plan.virtual_stages, plan.stage_weights(spec.num_layers))
    gemm_seconds = plan.num_micro_batches * layers * layer_seconds * (1.0 - share)
    out, exposed, tp_seconds = [], 0.0, 0.0
    for c in collectives:
        seconds = _seconds(c, links)
        out.append(
            StepCollective(
                op=c.op,
                phase=c.phase,
                what=f"{c.group.upper()} {c.what}",
                ranks=c.ranks,
                nbytes=c.nbytes,
                count=c.count,
                seconds=seconds,
            )
        )
        if c.group == "cp" and c.op == "send":
            exposed += c.count * max(0.0, seconds - block)
        elif c.group == "tp" and plan.tp_comm_overlap:
            tp_seconds += c.count * seconds
        else:
            exposed += c.count * seconds
    return tuple(out), exposed + max(0.0, tp_seconds - gemm_seconds)


def model_parallel_step_time(
    step: SingleGpuStep,
    plan: ParallelPlan,
    links: Links,
    whole_model_seconds: float,
    *,
    spec: ModelSpec,
    fused_adamw: bool = False,
    optimizer_fraction: float | None = None,
    head_layers: float = 0.0,
) -> tuple[overlap.StepTime, tuple[StepCollective, ...]]:
    """(StepTime with its bubble, every collective of a step) of a rank of `plan` whose first-stage step is `step`
    (`model_parallel.stage_step`), given the single-GPU seconds of one micro-batch through the whole model, a 1/m
    share of the step's optimizer in it (`optimizer_fraction`). The pipeline moves at its slowest rank's pace
    (`pipeline.slowest_rank`, the LM head as `head_layers` layers): 1/(tp cp) of the whole model's compute per
    micro-batch times that rank's share, and that rank's model-parallel communication exposed as
    `model_parallel_comm` has it; the bubble stretches the stage's forward and backward by (pp - 1) / (v m + pp - 1);
    the data-parallel collectives (the first stage's) overlap the step's compute as in `timing.step_time`."""
    m = plan.num_micro_batches
    rank, share = slowest_rank(
        spec.num_layers, plan.pp, plan.virtual_stages, plan.stage_weights(spec.num_layers), head_layers
    )
    per_micro_batch = whole_model_seconds / (plan.tp * plan.cp) * share
    layer_seconds = whole_model_seconds / (plan.tp * plan.cp) / (spec.num_layers + head_layers)
    collectives, exposed = model_parallel_comm(step, plan, links, spec, layer_seconds, stage=rank)
    compute = m * per_micro_batch  # the stage's step, its optimizer's share (`optimizer_fraction`) once
    optimizer = None if optimizer_fraction is None else optimizer_fraction * compute
    dp_timed, dp_collectives = step_time(
        step, data_parallel_plan(plan), links, compute, fused_adamw=fused_adamw, optimizer_seconds=optimizer
    )
    stage_micro_batch = per_micro_batch * (1 - (optimizer_fraction or 0.0)) + exposed / m  # the optimizer: no bubble
    bubble = mpc.pipeline_bubble_seconds(stage_micro_batch, plan.pipeline_schedule, plan.pp, m, plan.virtual_stages)
    timed = overlap.StepTime(
        compute_seconds=dp_timed.compute_seconds,
        step_seconds=dp_timed.step_seconds + exposed + bubble,
        bubble_seconds=bubble,
    )
    return timed, (*dp_collectives, *collectives)
