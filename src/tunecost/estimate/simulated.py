"""The `simulate` estimator: the maximum batch size from the step simulator, for any model from its config.

`tunecost estimate --estimator simulate`. The batch size column comes from `tunecost.simulate` run on today's
stack (tunecost's own MoE layers over transformers 5 / peft / bitsandbytes: what a user of this tool runs), at
--seq-len or the paper's 512 tokens per query. The throughput at that batch comes from eq. (2) where it was fitted
on measurements of this model on this GPU (the paper's A40 data, or --calibrate FILE), else from the cross-GPU
throughput model (`calibrated`); each row's notes say which.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunecost.errors import TunecostError
from tunecost.estimate.estimators import (
    EstimatePoint,
    EstimateRequest,
    batch_to_price,
    does_not_fit,
    paper_throughput,
    register_estimator,
)
from tunecost.simulate.behaviour import DEFAULT_BEHAVIOUR, StackBehaviour
from tunecost.workload.job import FineTuneJob

if TYPE_CHECKING:
    from tunecost.catalog.gpus import GPU

ESTIMATOR_NAME = "simulate"
SIMULATOR_STACK = "tunecost"


def simulated_max_batch(req: EstimateRequest) -> tuple[int, str]:
    """(largest batch that fits req.gpu per the step simulator, a note saying how it was sized)."""
    from tunecost.simulate import simulated_max_batch_size

    job, stack = req.sizing_job, req.options.stack or SIMULATOR_STACK
    mbs = int(simulated_max_batch_size(job, req.gpu, stack=stack, behaviour=req.options.behaviour))
    return mbs, sizing_note(job, stack, req.gpu, req.options.behaviour)


def sizing_note(job: FineTuneJob, stack: str, gpu: GPU, behaviour: StackBehaviour = DEFAULT_BEHAVIOUR) -> str:
    """How the step simulator sized the batch: the stack and its options, tokens per query, checkpointing and the
    GPU memory."""
    checkpointing = "on" if job.gradient_checkpointing else "off"
    options = "".join(f"; {line}" for line in behaviour.describe())
    return (
        f"max batch size from the step simulator ({stack} stack, {job.seq_len} tokens per query, "
        f"gradient checkpointing {checkpointing}{options}; against {gpu.usable_memory_note()})"
    )


def _throughput(req: EstimateRequest, batch_size: int) -> tuple[float | None, tuple[float, float] | None, list[str]]:
    qps, notes = paper_throughput(req, batch_size)
    if qps is not None:
        return qps, None, notes
    from tunecost.estimate.calibrated import (
        calibrated_model,
        extrapolation_notes,
        request_target,
        run_length,
        run_length_note,
    )

    model = calibrated_model(req.options.calibrate)
    run_queries = run_length(req.options, model)
    try:
        pred = model.predict(request_target(req, batch_size), run_queries=run_queries)
    except TunecostError as exc:
        return None, None, [f"no throughput: {exc}"]
    out = [
        f"throughput from the cross-GPU model calibrated on {model.num_points} points of {model.source} "
        f"(no eq. (2) fit for this model, dataset and GPU); {run_length_note(req.options, run_queries)}",
        *extrapolation_notes(pred),
    ]
    return pred.queries_per_s, (pred.queries_per_s_low, pred.queries_per_s_high), out


@register_estimator(
    ESTIMATOR_NAME,
    "step simulator (fake tensors, any model config) for the max batch size; "
    "eq. (2) or the cross-GPU model for the throughput at it",
)
def simulate_estimator(req: EstimateRequest) -> EstimatePoint:
    mbs, note = simulated_max_batch(req)
    if mbs < 1:
        return does_not_fit(note, "one query at this length needs more than the GPU has")
    batch, batch_notes = batch_to_price(req, mbs)
    qps, interval, notes = _throughput(req, batch)
    return EstimatePoint(
        max_batch_size=mbs,
        batch_size=batch,
        queries_per_s=qps,
        queries_per_s_interval=interval,
        notes=(note, *batch_notes, *notes),
    )
