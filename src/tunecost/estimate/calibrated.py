"""The `calibrated` estimator: the cross-GPU throughput model (`throughput.model`) at the maximum batch size.

Sources and derivations: docs/throughput-model.md, section `tunecost.estimate.calibrated`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from tunecost.catalog.gpu_terms import GpuTerms
from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.errors import TunecostError
from tunecost.estimate.estimators import (
    EstimatePoint,
    EstimateRequest,
    EstimatorOptions,
    Sizing,
    batch_to_price,
    does_not_fit,
    paper_max_batch_size,
    register_estimator,
)
from tunecost.estimate.measurements import BUNDLED_MEASUREMENTS
from tunecost.estimate.simulated import simulated_sizing
from tunecost.estimate.throughput.activation_offload import copies_seconds, with_copies_s
from tunecost.estimate.throughput.calibrate import CalibratedModel
from tunecost.estimate.throughput.intervals import combined_halfwidth
from tunecost.estimate.throughput.model import achieved_fp8_flops_per_s
from tunecost.estimate.throughput.sources import calibrate_files, calibration_files
from tunecost.estimate.throughput.stack_priors import (
    INTERVAL_KIND,
    LORA_COMPUTE_DTYPE_FAMILIES,
    TE_LAYERS_FAMILY,
    StackPrior,
    job_family,
    model_kind,
    stack_prior,
)
from tunecost.estimate.throughput.targets import (
    Prediction,
    ThroughputTarget,
    job_lengths,
    throughput_target,
    with_setup,
)
from tunecost.models.families import GATED_DELTA_FAMILIES, MAMBA2_FAMILIES
from tunecost.simulate.behaviour import LOSS_TRL_CHUNKED
from tunecost.workload.liger import liger_loss_applies, liger_note

ESTIMATOR_NAME = "calibrated"
PAPER_STACK = "hf-2024"  # the software the bundled throughput measurements ran
SIMULATOR_STACKS = (PAPER_STACK, "tunecost")  # the paper's stack first: the throughput model describes it


@lru_cache(maxsize=8)
def _calibrated(files: tuple[tuple[str, int], ...], profiles: tuple[GpuTerms, ...]) -> CalibratedModel:
    return calibrate_files([f for f, _ in files], gpu_terms={t.name: t for t in profiles})


def calibrated_model(
    paths: str | Path | Sequence[str | Path] | None = None, gpu_terms: Sequence[GpuTerms] = ()
) -> CalibratedModel:
    """The calibration of `paths` (files or folders; default: every bundled measurement), cached per file version.
    `gpu_terms`: measured GPU profiles, each used for the catalog GPU it names instead of catalog values."""
    if paths is None:
        given: list[str | Path] = list(BUNDLED_MEASUREMENTS)
    elif isinstance(paths, str | Path):
        given = [paths]
    else:
        given = list(paths) or list(BUNDLED_MEASUREMENTS)
    files = calibration_files(given)
    key = tuple((str(f.resolve()), f.stat().st_mtime_ns) for f in files)
    return _calibrated(key, tuple(_keyed_profiles(gpu_terms)))


def _keyed_profiles(gpu_terms: Sequence[GpuTerms]) -> list[GpuTerms]:
    """Profiles re-keyed by the catalog name of the GPU they were measured on (an unknown GPU is an error), with
    the FP8 rate a profile does not measure derived from its measured bf16 rate (docs/fp8.md)."""
    out = []
    for t in gpu_terms:
        try:
            gpu = resolve_gpu_name(t.name).gpu
        except TunecostError as exc:
            raise TunecostError(
                f"GPU profile for {t.name!r} ({t.source}): {exc}; say which catalog GPU it measured with "
                "--gpu-profile GPU=FILE"
            ) from None
        fp8 = t.fp8_matmul_flops_per_s or achieved_fp8_flops_per_s(gpu, t.matmul_flops_per_s, None)
        out.append(replace(t, name=gpu.name, fp8_matmul_flops_per_s=fp8))
    return out


def _simulated_sizing(req: EstimateRequest) -> Sizing:
    """The step simulator's sizing on the job's stack (falling back to the other stacks where that one cannot run
    the model)."""
    job = req.sizing_job
    errors = []
    stacks = dict.fromkeys((job.stack, *SIMULATOR_STACKS))
    for stack in stacks:
        try:
            return simulated_sizing(job.with_(stack=stack), req.gpu, req.options.behaviour)
        except TunecostError as exc:  # e.g. a stack that does not support this model
            errors.append(f"{stack}: {exc}")
    raise TunecostError("the step simulator could not size a batch: " + "; ".join(errors))


def max_batch_size_for(req: EstimateRequest) -> Sizing:
    """The simulator's sizing, else eq. (1)'s; both failing is one error."""
    try:
        return _simulated_sizing(req)
    except TunecostError as exc:
        why = str(exc)
    try:
        mbs, note = paper_max_batch_size(req)
    except TunecostError as exc:
        raise TunecostError(f"no maximum batch size for {req.spec.name}: {why}; and {exc}") from None
    return Sizing(max_batch_size=max(mbs, 0), borderline_batch_size=max(mbs, 0), note=f"{note} ({why})")


@register_estimator(
    ESTIMATOR_NAME,
    "cross-GPU throughput model (rooflines per op class + overheads) calibrated on "
    "measurements (default: the paper's A40 and A100-40GB data); max batch from the simulator or "
    "eq. (1)",
)
def calibrated_estimator(req: EstimateRequest) -> EstimatePoint:
    model = calibrated_model(req.options.calibrate)
    job_lengths(req.job.with_(batch_size=1))  # data without lengths: the error before the (slow) batch search
    sizing = max_batch_size_for(req)
    if sizing.max_batch_size < 1 and not req.fixed_batch:
        return does_not_fit(sizing, "no room for a batch")
    batch, batch_notes = batch_to_price(req, sizing)
    run_queries = req.options.run_queries
    pred, prior = for_job_software(req, model.predict(request_target(req, batch), run_queries=run_queries))
    pred, offload_notes = with_activation_offload(req, pred)
    notes = [
        sizing.note,
        *batch_notes,
        f"calibrated on {model.num_points} points of {model.source_names} "
        f"(in-sample MAPE {100 * model.in_sample_mape:.1f} %); " + run_length_note(req.options),
        *extrapolation_notes(pred),
        *software_notes(req),
        *offload_notes,
        f"95 % interval: {pred.interval_kinds}",
        *(n for n in pred.notes if n.startswith("host ")),
        *([prior.note] if prior else stack_note(req.job.stack)),
    ]
    return EstimatePoint(
        max_batch_size=sizing.max_batch_size,
        borderline_batch_size=sizing.borderline_batch_size,
        batch_size=batch,
        queries_per_s=pred.queries_per_s,
        queries_per_s_interval=(pred.queries_per_s_low, pred.queries_per_s_high),
        notes=tuple(notes),
        extrapolation=pred.extrapolation,
        startup_s=startup_seconds(req.options, pred),
    )


COMPILE_NOTE = "torch.compile: each layer's element-wise chains counted fused (Inductor)"


GATED_DELTA_TIME_NOTE = (
    "gated DeltaNet layers: counted as flash-linear-attention's chunked delta rule and causal-conv1d run them, from "
    "their code (no measured run of this family calibrates them, and without those packages transformers' PyTorch "
    "fallbacks run far slower)"
)
MAMBA2_TIME_NOTE = (
    "Mamba2 layers: counted as mamba-ssm's fused kernel runs them, from its code (no measured run of this family "
    "calibrates them, and without mamba-ssm transformers' PyTorch path runs far slower)"
)


def software_notes(req: EstimateRequest) -> list[str]:
    """What torch.compile, Liger's kernels, TRL's chunked loss and a hybrid model's linear-time kernels change in
    the counted step (or do not)."""
    job, family = req.job, req.spec.family
    out = [COMPILE_NOTE] if job.torch_compile else []
    if req.options.behaviour.loss_code == LOSS_TRL_CHUNKED:
        out.append(
            "TRL's chunked_nll: its memory is simulated, its time counted as the full-logits loss (its head GEMMs "
            "per 256 tokens on fp32 copies, recomputed in backward, are not counted, and TRL reports its wall time "
            "typically neutral)"
        )
    if job.liger_kernel:
        out.append(
            "Liger kernels: each RMSNorm and rotary counted as one kernel, the loss as the fused linear "
            "cross-entropy (the head's GEMMs per chunk of tokens, each re-reading the head's weight)"
            if liger_loss_applies(family)
            else liger_note(family)
        )
    # the linear-time layers' kernels, counted from their code, never measured here
    out += [GATED_DELTA_TIME_NOTE] if family in GATED_DELTA_FAMILIES else []
    out += [MAMBA2_TIME_NOTE] if family in MAMBA2_FAMILIES else []
    return out


def with_activation_offload(req: EstimateRequest, pred: Prediction) -> tuple[Prediction, list[str]]:
    """The prediction with activation offload's copies beside the step's compute (`activation_offload`), and
    the note that says what they cost; unchanged without activation offload."""
    if not req.options.behaviour.activation_offload:
        return pred, []
    try:
        copies_s = copies_seconds(req.spec, req.job, pred.counts.tokens_per_step, req.gpu.name)
    except TunecostError as exc:
        return pred, [f"activation offload: {exc}"]
    factor = pred.step.step_s / with_copies_s(pred.step.step_s, copies_s)
    scaled = replace(
        pred,
        queries_per_s=pred.queries_per_s * factor,
        queries_per_s_low=pred.queries_per_s_low * factor,
        queries_per_s_high=pred.queries_per_s_high * factor,
    )
    note = (
        f"activation offload: {1e3 * copies_s:.0f} ms of host copies per step beside {1e3 * pred.step.step_s:.0f} ms "
        f"of compute (its own stream): throughput x {factor:.3f}"
    )
    return scaled, [note]


def for_job_software(req: EstimateRequest, pred: Prediction) -> tuple[Prediction, StackPrior | None]:
    """The prediction for the job's software: as calibrated for the calibrated stack family (no prior); for another
    family, scaled by that family's prior and its interval widened (`stack_priors.stack_prior`), with the prior."""
    prior = stack_prior(req.job.stack, req.options.framework, kind=model_kind(req.job.model))
    if prior is None:
        return pred, None
    parts = (*pred.interval_parts, (INTERVAL_KIND, prior.log_halfwidth, prior.basis))
    qps, spread = pred.queries_per_s * prior.factor, math.exp(combined_halfwidth(parts))
    widened = replace(
        pred, queries_per_s=qps, queries_per_s_low=qps / spread, queries_per_s_high=qps * spread, interval_parts=parts
    )
    return widened, prior


def stack_note(stack: str) -> list[str]:
    """Says when the job runs another software stack than the one the throughput calibration measured."""
    if stack == PAPER_STACK:
        return []
    return [
        f"throughput: the calibration measured the paper's stack ({PAPER_STACK}: transformers' eager MoE loop, "
        f"bitsandbytes, PEFT); the job's stack {stack} was not measured, and its speed may differ "
        "(`tunecost validate` shows how far stack families differ on published runs)"
    ]


def startup_seconds(options: EstimatorOptions, pred: Prediction) -> float:
    """The job's one start-up beside its steady-state throughput; 0 with --steady-state, or with --run-queries
    (each run's start-up is then inside its throughput)."""
    return 0.0 if options.run_queries is not None or options.steady_state else pred.startup_s


def run_length_note(options: EstimatorOptions) -> str:
    if options.run_queries is not None:
        return f"throughput of {options.run_queries}-query runs, each with its start-up"
    if options.steady_state:
        return "steady-state throughput, no start-up"
    return "steady-state throughput; the run's start-up counted once"


def request_target(req: EstimateRequest, batch_size: int) -> ThroughputTarget:
    """What the cross-GPU model predicts for the request at `batch_size`: the job's packed rows, else its data's
    lengths (cut at its seq_len), else its fixed sequence length (`targets.job_lengths`)."""
    target = throughput_target(
        model=req.spec.name,
        gpu=req.gpu.name,
        batch_size=batch_size,
        experts_per_token=req.experts_per_token,
        dataset=req.lengths_dataset,
        seq_len=req.job.seq_len,
        lengths=req.job.lengths,
        method=req.job.method,
        host_cpu=req.options.host_cpu,
    )
    family = job_family(req.job.stack, req.options.framework)
    target = with_setup(target, req.job)
    return replace(
        target,
        job=target.job.with_(packing=req.job.packing),
        te_layers=family == TE_LAYERS_FAMILY,
        lora_compute_dtype=family in LORA_COMPUTE_DTYPE_FAMILIES,
    )


def extrapolation_notes(pred: Prediction) -> list[str]:
    return ["extrapolation: " + "; ".join(pred.extrapolation_reasons)] if pred.extrapolation else []
