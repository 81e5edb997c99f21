"""What the throughput model predicts: a target workload on a GPU, a measured point, a prediction with its interval.

Sources and derivations: docs/throughput-model.md, section `tunecost.estimate.throughput.calibrate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import cast

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.catalog.host_cpus import resolve_host_cpu
from tunecost.errors import TunecostError
from tunecost.estimate.paper import PAPER_METHOD
from tunecost.estimate.throughput.counts import AnalyticStepCounts, accumulated, analytic_step_counts
from tunecost.estimate.throughput.coverage import SETUP_FIELDS
from tunecost.estimate.throughput.lengths import (
    PAPER_CUTOFF_TOKENS,
    SeqLengths,
    dataset_lengths,
    empirical_lengths,
    fixed_lengths,
    has_length_statistic,
)
from tunecost.estimate.throughput.model import StepTime
from tunecost.estimate.throughput.packing import job_packed_lengths
from tunecost.models.catalog import resolve_model
from tunecost.workload.job import FineTuneJob, LoraConfig, Method, default_lora_targets

PAPER_RUN_QUERIES = 1000  # the paper's throughput = 1000 queries / train_runtime


@dataclass(frozen=True, kw_only=True)
class ThroughputTarget:
    """One workload to predict: the job (model, method, top-k, batch, a dataset or a fixed seq_len) on a GPU."""

    job: FineTuneJob
    gpu: str
    host_cpu: str | None = None  # the host CPU that runs the GPU, when known (catalog.host_cpus)
    te_layers: bool = False  # Megatron Core's Transformer Engine layers (`counts.analytic_step_counts`)
    lora_compute_dtype: bool = False  # LoRA adapters in the compute dtype (`counts.analytic_step_counts`)


def throughput_target(
    *,
    model: str,
    gpu: str,
    batch_size: int,
    experts_per_token: int | None = None,
    dataset: str | None = None,
    seq_len: int | None = None,
    method: str | None = None,
    host_cpu: str | None = None,
    lengths: tuple[int, ...] | None = None,
) -> ThroughputTarget:
    """The target of a TARGETS.csv or measurement row, with the paper's setup as the default: its method for its
    models (else qlora), the model's own top-k, gradient checkpointing except for a full fine-tune, LoRA on the
    model's default targets. The job checks
    the batch size and sequence length. `lengths`: the data's tokens per query (`seq_len` then is the cutoff)."""
    if experts_per_token is not None and experts_per_token < 1:  # None (not 0) means the default
        raise TunecostError(f"experts per token must be >= 1, got {experts_per_token}")
    if dataset is None and seq_len is None and not lengths:
        raise TunecostError(f"{model} on {gpu}: give a dataset or a seq_len (or the data's lengths)")
    spec = resolve_model(model)
    chosen = cast("Method", method or PAPER_METHOD.get(spec.name, "qlora"))  # FineTuneJob validates it
    job = FineTuneJob(
        model=spec.name,
        method=chosen,
        experts_per_token=spec.top_k(experts_per_token),
        batch_size=batch_size,
        seq_len=seq_len,
        lengths=lengths,
        dataset=dataset,
        gradient_checkpointing=chosen != "full",
        lora=LoraConfig(targets=default_lora_targets(is_moe=spec.is_moe)),
    )  # the paper: checkpointing for Mixtral QLoRA only
    if host_cpu:
        host_cpu = resolve_host_cpu(host_cpu).name
    return ThroughputTarget(job=job, gpu=gpu, host_cpu=host_cpu or None)


def with_setup(target: ThroughputTarget, job: FineTuneJob) -> ThroughputTarget:
    """`target` trained as `job` trains (its `SETUP_FIELDS`: recomputation, attention, LoRA, precision, storage and
    FP8)."""
    return replace(target, job=target.job.with_(**{name: getattr(job, name) for name in SETUP_FIELDS}))


@dataclass(frozen=True, kw_only=True)
class CalibrationPoint:
    target: ThroughputTarget
    queries_per_s: float
    run_queries: int | None = PAPER_RUN_QUERIES  # queries in the measured run; None: steady state
    source: str = ""  # where it came from, for error messages ("file: row N")


@dataclass(frozen=True, kw_only=True)
class Prediction:
    target: ThroughputTarget
    gpu: str  # canonical catalog name
    experts_per_token: int  # as resolved (the model's default when the target left it out)
    method: str  # as resolved (the paper's setup for its models)
    queries_per_s: float
    queries_per_s_low: float
    queries_per_s_high: float
    step: StepTime
    counts: AnalyticStepCounts
    run_queries: int | None
    extrapolation: bool
    extrapolation_reasons: tuple[str, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    host_cpu: str = ""  # the host CPU the prediction assumes ("" when a GPU profile measured the host times)
    startup_s: float = 0.0  # one run's start-up (the calibrated time per run on this host), outside steady state
    interval_parts: tuple[tuple[str, float, str], ...] = ()  # (kind, log half-width, basis), intervals.py

    @property
    def interval_kinds(self) -> str:
        """The kinds of extrapolation behind the interval, with their share of it: "other GPU ±9 %; ..."."""
        return "; ".join(f"{kind} ±{100 * math.expm1(h):.0f} %" for kind, h, _ in self.interval_parts)


def job_for(target: ThroughputTarget) -> tuple[FineTuneJob, AnalyticStepCounts]:
    """The target's job sized for the step counts (a dataset's job at its cutoff length) and its analytic step
    counts over the job's own lengths (`job_lengths`)."""
    job, lengths = job_lengths(target.job)
    spec = resolve_model(job.model)
    counts = analytic_step_counts(
        spec, job, lengths, te_layers=target.te_layers, lora_compute_dtype=target.lora_compute_dtype
    )
    return job, accumulated(counts, job.grad_accum) if job.grad_accum > 1 else counts


def job_lengths(job: FineTuneJob) -> tuple[FineTuneJob, SeqLengths]:
    """The job sized for its lengths and the lengths of its batches: its real lengths (each batch padded to its
    longest, cut at seq_len if given, else at the longest), else its catalog dataset's length distribution (cut at
    seq_len if given), else its fixed seq_len (every query padded to it; an error without one)."""
    if job.packing != "none":
        lengths = job_packed_lengths(job)
    elif job.lengths:
        cutoff = job.seq_len if job.seq_len is not None else max(job.lengths)
        source = f"{job.dataset}: measured lengths" if job.dataset else "measured lengths"
        lengths = empirical_lengths(
            job.lengths, job.batch_size, source=f"{source}, padded to the longest in the batch", cutoff_tokens=cutoff
        )
        job = replace(job, seq_len=cutoff)
    elif job.seq_len is not None and not has_length_statistic(job.dataset):
        lengths = fixed_lengths(job.seq_len, job.batch_size)
    else:  # cut at the job's seq_len, else at the paper's cutoff
        lengths = dataset_lengths(str(job.dataset), job.batch_size, cutoff_tokens=job.seq_len)
        job = replace(job, seq_len=job.seq_len or PAPER_CUTOFF_TOKENS)
    return job, lengths


def run_queries_per_s(step_s: float, queries_per_step: float, run_overhead_s: float, run_queries: int | None) -> float:
    """Throughput of a run of `run_queries` queries with a fixed overhead; steady state when None."""
    if run_queries is None:
        return queries_per_step / step_s
    return run_queries / (run_overhead_s + run_queries / queries_per_step * step_s)


def group_of(point: CalibrationPoint) -> tuple[str, str, str]:
    """(model, dataset or seqN, catalog GPU): the unit that leave-one-group-out holds out."""
    t = point.target.job
    return (t.model, t.dataset or f"seq{t.seq_len}", resolve_gpu_name(point.target.gpu).gpu.name)
