"""The `simulate` estimator: the maximum batch size from the step simulator, for any model from its config.

`tunecost estimate --estimator simulate`. The batch size column comes from `tunecost.simulate` run on today's
stack (tunecost's own MoE layers over transformers 5 / peft / bitsandbytes: what a user of this tool runs), at
--seq-len or the paper's 512 tokens per query. The throughput at that batch comes from eq. (2) where it was fitted
on measurements of this model on this GPU (the paper's A40 data, or --calibrate FILE), else from the cross-GPU
throughput model (`calibrated`); each row's notes say which.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tunecost.errors import TunecostError
from tunecost.estimate.estimators import (
    EstimatePoint,
    EstimateRequest,
    Sizing,
    batch_to_price,
    does_not_fit,
    paper_throughput,
    register_estimator,
)
from tunecost.simulate.batch import default_margin_fraction, gpu_max_batch
from tunecost.simulate.behaviour import DEFAULT_BEHAVIOUR, StackBehaviour
from tunecost.workload.job import FineTuneJob

if TYPE_CHECKING:
    from tunecost.catalog.gpus import GPU

ESTIMATOR_NAME = "simulate"


def simulated_sizing(job: FineTuneJob, gpu: GPU, behaviour: StackBehaviour = DEFAULT_BEHAVIOUR) -> Sizing:
    """The step simulator's largest batch of `job` (on its stack) for `gpu`, with and without the margin."""
    best = gpu_max_batch(job, gpu, behaviour=behaviour)
    note = sizing_note(job, gpu, behaviour, best)
    if best is None:
        return Sizing(max_batch_size=0, borderline_batch_size=0, note=note)
    return Sizing(max_batch_size=best.batch_size, borderline_batch_size=best.borderline_batch_size, note=note)


COMPILE_MEMORY_NOTE = "torch.compile: the eager step's memory (what Inductor's partitioner keeps is not traced)"


def sizing_note(job: FineTuneJob, gpu: GPU, behaviour: StackBehaviour = DEFAULT_BEHAVIOUR, best=None) -> str:
    """How the step simulator sized the batch: the stack and its options, tokens per query, checkpointing, the
    GPU memory and the safety margin."""
    checkpointing = "on" if job.gradient_checkpointing else "off"
    options = "".join(f"; {line}" for line in behaviour.describe())
    options += f"; {COMPILE_MEMORY_NOTE}" if job.torch_compile else ""
    margin = best.margin_fraction if best is not None else default_margin_fraction()
    return (
        f"max batch size from the step simulator ({job.stack} stack, {job.seq_len} tokens per query, "
        f"gradient checkpointing {checkpointing}{options}; reserved memory + CUDA context x {1 + margin:.2f} "
        f"safety margin against {gpu.usable_memory_note()})"
    )


@dataclass(frozen=True, kw_only=True)
class Throughput:
    """Queries/s at a batch, with its interval, the run's one start-up beside it, and where it came from."""

    queries_per_s: float | None
    interval: tuple[float, float] | None = None
    startup_s: float = 0.0
    notes: tuple[str, ...] = ()
    queries_per_row: float = 1.0  # queries a row of the batch holds (packing: several)
    optimizer_fraction: float | None = None  # the optimizer step's share of the time (None: eq. (2), not split)
    eq2_dataset: str | None = None  # the dataset of the eq. (2) fit it came from (None: the cross-GPU model)


def throughput_at(req: EstimateRequest, batch_size: int) -> Throughput:
    """Eq. (2) where it was fitted for this model, dataset and GPU (its 1000-query runs include their start-up),
    else the cross-GPU model."""
    qps, notes = paper_throughput(req, batch_size)
    if qps is not None:
        return Throughput(queries_per_s=qps, notes=tuple(notes), eq2_dataset=req.dataset)
    from tunecost.estimate.calibrated import (
        calibrated_model,
        extrapolation_notes,
        for_job_software,
        request_target,
        run_length_note,
        software_notes,
        startup_seconds,
        with_activation_offload,
    )

    model = calibrated_model(req.options.calibrate)
    try:
        pred = model.predict(request_target(req, batch_size), run_queries=req.options.run_queries)
    except TunecostError as exc:
        return Throughput(queries_per_s=None, notes=(f"no throughput: {exc}",))
    pred, prior = for_job_software(req, pred)
    pred, offload_notes = with_activation_offload(req, pred)
    out = (
        f"throughput from the cross-GPU model calibrated on {model.num_points} points of {model.source_names} "
        f"(no eq. (2) fit for this model, dataset and GPU); {run_length_note(req.options)}",
        *extrapolation_notes(pred),
        *([prior.note] if prior else []),
        *software_notes(req),
        *offload_notes,
    )
    return Throughput(
        queries_per_s=pred.queries_per_s,
        interval=(pred.queries_per_s_low, pred.queries_per_s_high),
        startup_s=startup_seconds(req.options, pred),
        notes=out,
        queries_per_row=pred.counts.lengths.queries_per_row,
        optimizer_fraction=pred.step.optimizer_fraction,
    )


@register_estimator(
    ESTIMATOR_NAME,
    "step simulator (fake tensors, any model config) for the max batch size; "
    "eq. (2) or the cross-GPU model for the throughput at it",
)
def simulate_estimator(req: EstimateRequest) -> EstimatePoint:
    sizing = simulated_sizing(req.sizing_job, req.gpu, req.options.behaviour)
    if sizing.max_batch_size < 1 and not req.fixed_batch:
        return does_not_fit(sizing, "one query at this length needs more than the GPU has with the margin")
    batch, batch_notes = batch_to_price(req, sizing)
    tp = throughput_at(req, batch)
    return EstimatePoint(
        max_batch_size=sizing.max_batch_size,
        borderline_batch_size=sizing.borderline_batch_size,
        batch_size=batch,
        queries_per_s=tp.queries_per_s,
        queries_per_s_interval=tp.interval,
        notes=(sizing.note, *batch_notes, *tp.notes),
        startup_s=tp.startup_s,
        eq2_dataset=tp.eq2_dataset,
    )
