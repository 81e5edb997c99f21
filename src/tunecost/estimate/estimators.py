"""Estimators: for one (job, GPU), the maximum batch size and the throughput at it.

Each estimator is a function registered by name; `tunecost estimate --estimator NAME` picks one and every
output row names the estimator that answered. The paper's estimator is here; the simulator-based and the
calibrated cross-GPU estimators register themselves from their own modules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path

from tunecost.catalog.datasets import get_dataset_facts
from tunecost.catalog.gpus import GPU
from tunecost.catalog.host_cpus import resolve_host_cpu
from tunecost.errors import TunecostError, unknown_name_error
from tunecost.estimate import DEFAULT_ESTIMATOR
from tunecost.estimate.fit import ThroughputFit, fit_all
from tunecost.estimate.measurements import PAPER_A40_MEASUREMENTS, load_measurements
from tunecost.estimate.paper import (
    EQ1_ARTIFACT_SEQ_LEN,
    EQ1_COEFFICIENTS,
    PAPER_METHOD,
    max_batch_size_eq1,
    sparsity_fraction,
)
from tunecost.estimate.throughput.coverage import setup_label
from tunecost.estimate.throughput.lengths import PAPER_CUTOFF_TOKENS, catalog_longest_tokens, has_length_statistic
from tunecost.estimate.throughput.packing import job_packed_lengths
from tunecost.estimate.throughput.sources import calibration_files
from tunecost.estimate.throughput.stack_priors import framework_family
from tunecost.estimate.throughput.targets import job_lengths, throughput_target
from tunecost.models.catalog import ModelSpec, resolve_model
from tunecost.simulate.behaviour import DEFAULT_BEHAVIOUR, StackBehaviour
from tunecost.workload.job import FineTuneJob
from tunecost.workload.lengths import padded_length

DEFAULT_THROUGHPUT_DATASET = "math_14k"  # Table IV's workload, when the job names no dataset


@dataclass(frozen=True, kw_only=True)
class EstimatorOptions:
    """How to estimate, beside what (the job): which estimator, and its own options.

    calibrate: measurement files or folders to fit eq. (2) on (added to the paper's A40 data) or to calibrate the
        cross-GPU model on (instead of the bundled measurements); empty: the defaults.
    coefficient_set: eq. (1)'s coefficients, "artifact" or "text" (the paper's §V-A).
    run_queries: the throughput of runs of this many queries, start-up included in each (cross-GPU model; the
        paper's protocol is 1000); None: the job is one run, steady-state throughput with its start-up once.
    steady_state: steady-state throughput and no start-up at all.
    host_cpu: the CPU of the machine that runs the GPU (`catalog.host_cpus`), for the cross-GPU throughput model;
        None: each GPU's default host.
    behaviour: the stack's recipe options that change what a step keeps (`simulate.behaviour.StackBehaviour`:
        torchtune's chunked loss, activation offload, optimizer in backward), for the simulator that sizes the batch.
    framework: the framework whose config describes the job (`ConfigJob.framework`, e.g. "nemo"): with the stack,
        the family whose throughput prior applies (`throughput.stack_priors.job_family`); None: the stack's alone.
    """

    name: str = DEFAULT_ESTIMATOR
    calibrate: tuple[Path, ...] = ()
    coefficient_set: str = "artifact"
    run_queries: int | None = None
    steady_state: bool = False
    host_cpu: str | None = None
    behaviour: StackBehaviour = DEFAULT_BEHAVIOUR
    framework: str | None = None

    def __post_init__(self) -> None:
        if self.framework is not None:
            framework_family(self.framework)  # an unknown framework is an error
        if self.run_queries is not None and self.run_queries < 1:
            raise TunecostError(f"run queries must be >= 1, got {self.run_queries}")
        if self.run_queries is not None and self.steady_state:
            raise TunecostError("give a run length or steady state, not both")
        if self.host_cpu is not None:
            object.__setattr__(self, "host_cpu", resolve_host_cpu(self.host_cpu).name)


@dataclass(frozen=True, kw_only=True)
class EstimateRequest:
    """What one estimator answers: the job on one GPU, with the estimator's options.

    The job's sequence length sizes the batch (the paper's 512 tokens per query when it has none) and, when given,
    fixes the throughput's too; without one, the throughput follows the length distribution of the job's dataset.
    `fixed_batch`: the job's batch size is the user's, checked against the largest that fits; otherwise the
    estimator uses the largest batch that fits (as the paper assumes)."""

    job: FineTuneJob
    gpu: GPU
    options: EstimatorOptions = field(default_factory=EstimatorOptions)
    fixed_batch: bool = False

    @cached_property
    def spec(self) -> ModelSpec:
        return resolve_model(self.job.model)

    @property
    def experts_per_token(self) -> int:
        return self.spec.top_k(self.job.experts_per_token)

    @property
    def dataset(self) -> str:
        """The dataset whose throughput is modelled (and whose eq. (2) fit applies)."""
        return self.job.dataset or DEFAULT_THROUGHPUT_DATASET

    @property
    def lengths_dataset(self) -> str | None:
        """The dataset whose lengths the cross-GPU model prices: the job's, else (without a seq_len) `dataset`;
        None with a seq_len and no data (every query at that length)."""
        return self.job.dataset if self.job.seq_len else self.dataset

    @property
    def sizing_seq_len(self) -> int:
        """Tokens per query the batch is sized at: the data's longest (cut at seq_len), else seq_len, else the
        paper's 512."""
        return sizing_seq_len(self.job)

    @property
    def sizing_job(self) -> FineTuneJob:
        """The job as the step simulator sizes it: at `sizing_seq_len` tokens per query (a packed job: rows of
        seq_len tokens, as a fixed length), searched from batch 1."""
        if self.job.packing != "none":
            return self.job.with_(batch_size=1, packing="none", lengths=None)
        return self.job.with_(seq_len=self.sizing_seq_len, batch_size=1)


def sizing_seq_len(job: FineTuneJob) -> int:
    """The padded length of a job's longest batch: what decides whether it fits (a packed job's full row)."""
    if job.lengths and job.packing == "none":  # padded to a multiple of 8, as the throughput's batches are
        return padded_length(min(max(job.lengths), job.seq_len or max(job.lengths)))
    if job.packing == "none" and modelled_lengths(job.dataset, job.seq_len):  # the length model's longest, cut
        return padded_length(catalog_longest_tokens(str(job.dataset), job.seq_len or PAPER_CUTOFF_TOKENS))
    return job.seq_len or EQ1_ARTIFACT_SEQ_LEN


def modelled_lengths(dataset: str | None, seq_len: int | None) -> bool:
    """A catalog dataset's length model sizes a job on it: given a seq_len, or not the paper's (eq. (1) sized at
    512)."""
    if not has_length_statistic(dataset):
        return False
    return seq_len is not None or not get_dataset_facts(str(dataset)).has_paper_median


def sized_job(job: FineTuneJob) -> FineTuneJob:
    """The job at its longest batch's padded length, as the multi-GPU estimate sizes its memory; data without
    lengths is an error, as on one GPU (`job_lengths`)."""
    job_lengths(job.with_(batch_size=1))
    return job.with_(seq_len=sizing_seq_len(job))


def lengths_note(job: FineTuneJob) -> str:
    """How the job's tokens per query were taken, for the assumptions."""
    if job.packing != "none":
        rows = job_packed_lengths(job.with_(batch_size=1)).source
        return f"tokens per query: {rows}; the batch counts rows; memory sized at a full row"
    if job.lengths:
        cut = f", cut at {job.seq_len}" if job.seq_len else ""
        return (
            f"tokens per query: the data's own lengths{cut}, each batch padded to its longest (multiple of 8); "
            f"memory sized at the longest batch, {sizing_seq_len(job)} tokens"
        )
    if modelled_lengths(job.dataset, job.seq_len):
        facts = get_dataset_facts(str(job.dataset))
        cut = f"--seq-len {job.seq_len}" if job.seq_len else f"{PAPER_CUTOFF_TOKENS} (the paper's cutoff_len)"
        longest = "" if facts.max_tokens is not None else f" (the length model's longest of {facts.num_queries:,})"
        return (
            f"tokens per query: {facts.length_summary}, cut at {cut}, each batch padded to its longest; memory "
            f"sized at the longest batch, {sizing_seq_len(job)} tokens{longest}"
        )
    if job.seq_len:
        why = f" ({job.dataset}: no token-length statistic in the catalog)" if job.dataset else ""
        return f"tokens per query: every query padded to --seq-len {job.seq_len}{why}"
    return (
        f"tokens per query: memory sized at {EQ1_ARTIFACT_SEQ_LEN} (the paper's eq. (1) length: {job.dataset} has "
        "only a median length; --seq-len or a data file to set it), throughput over the dataset's length "
        "distribution padded to each batch's longest"
    )


@dataclass(frozen=True, kw_only=True)
class EstimatePoint:
    max_batch_size: int  # 0: does not fit with the safety margin
    batch_size: int  # the batch the throughput is for (the maximum, as the paper assumes)
    queries_per_s: float | None  # None: this estimator cannot say for this GPU
    queries_per_s_interval: tuple[float, float] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    extrapolation: bool = False  # the throughput is predicted outside what the estimator was calibrated on
    startup_s: float = 0.0  # the run's one-off start-up, beside the steady-state throughput (0: inside it)
    borderline_batch_size: int | None = None  # largest batch within the card without the margin (None: as max)
    eq2_dataset: str | None = None  # the dataset of the eq. (2) fit the throughput came from (None: not eq. (2))

    @property
    def fit(self) -> str:
        """ "yes", "borderline" (fits only inside the safety margin) or "no" for the priced batch."""
        border = self.max_batch_size if self.borderline_batch_size is None else self.borderline_batch_size
        if 0 < self.batch_size <= self.max_batch_size:
            return "yes"
        return "borderline" if 0 < self.batch_size <= border else "no"


Estimator = Callable[[EstimateRequest], EstimatePoint]
_REGISTRY: dict[str, Estimator] = {}
_DESCRIPTIONS: dict[str, str] = {}


def register_estimator(name: str, description: str) -> Callable[[Estimator], Estimator]:
    def deco(func: Estimator) -> Estimator:
        _REGISTRY[name] = func
        _DESCRIPTIONS[name] = description
        return func

    return deco


def _load_plugins() -> None:
    """Estimators defined beside the modules they need (imported lazily: torch is heavy)."""
    import importlib

    for module in ("tunecost.estimate.simulated", "tunecost.estimate.calibrated"):
        importlib.import_module(module)


def estimator_names() -> dict[str, str]:
    _load_plugins()
    return dict(_DESCRIPTIONS)


def get_estimator(name: str) -> Estimator:
    _load_plugins()
    if name not in _REGISTRY:
        raise unknown_name_error("estimator", name, _REGISTRY.keys())
    return _REGISTRY[name]


@dataclass(frozen=True, kw_only=True)
class Sizing:
    """The largest batch that fits a GPU with the safety margin, the largest inside the card without it, and
    how they were found."""

    max_batch_size: int
    borderline_batch_size: int
    note: str


def does_not_fit(sizing: Sizing, why: str) -> EstimatePoint:
    """The answer for a GPU that has no room for a single query with the margin."""
    border = f"; batch {sizing.borderline_batch_size} only inside the safety margin" * bool(
        sizing.borderline_batch_size
    )
    return EstimatePoint(
        max_batch_size=0,
        batch_size=sizing.borderline_batch_size,
        borderline_batch_size=sizing.borderline_batch_size,
        queries_per_s=None,
        notes=(sizing.note, f"does not fit: {why}{border}"),
    )


def batch_to_price(req: EstimateRequest, sizing: Sizing) -> tuple[int, list[str]]:
    """The batch the throughput is for: the user's (with a note, and a warning when it does not fit) or the
    largest that fits with the margin."""
    if not req.fixed_batch:
        return sizing.max_batch_size, []
    batch = req.job.batch_size
    notes = [f"batch fixed at {batch} (the job's: --batch-size or --config)"]
    if batch > sizing.borderline_batch_size:
        notes.append(f"DOES NOT FIT: batch {batch} is more than the {sizing.max_batch_size} that fit in {req.gpu.name}")
    elif batch > sizing.max_batch_size:
        notes.append(f"BORDERLINE: batch {batch} fits {req.gpu.name} only inside the safety margin")
    return batch, notes


@lru_cache(maxsize=8)
def _fits_for(calibrate: tuple[Path, ...]) -> dict[tuple[str, str, str], ThroughputFit]:
    points = load_measurements(PAPER_A40_MEASUREMENTS)
    for path in calibration_files(calibrate) if calibrate else ():
        points = points + load_measurements(path)
    return {(f.model, f.dataset, f.gpu): f for f in fit_all(points, "artifact")}


def eq1_max_batch_size(
    spec: ModelSpec,
    *,
    gpu_memory_gb: float,
    experts_per_token: int,
    seq_len: int | None = None,
    coefficient_set: str = "artifact",
) -> tuple[int, str]:
    """Eq. (1) for `spec` on `gpu_memory_gb`, with the coefficient set asked for (falling back to the text's);
    (batch size, a note naming the coefficients). TunecostError for a model the paper has no coefficients for."""
    name = spec.name
    coeffs = EQ1_COEFFICIENTS.get((name, coefficient_set)) or EQ1_COEFFICIENTS.get((name, "text"))
    if coeffs is None:
        models = sorted({m for m, _ in EQ1_COEFFICIENTS})
        raise TunecostError(
            f"the paper's eq. (1) has coefficients only for {', '.join(models)}, not {name}; "
            "use --estimator simulate (any model from its config)"
        )
    seq_len = seq_len or EQ1_ARTIFACT_SEQ_LEN
    sparsity = sparsity_fraction(experts_per_token, spec.num_experts)
    mbs = max_batch_size_eq1(
        gpu_memory_gb=gpu_memory_gb,
        model_memory_gb=coeffs.model_memory_gb,
        seq_len_tokens=seq_len,
        sparsity=sparsity,
        c0=coeffs.c0,
        c1=coeffs.c1,
    )
    set_used = coefficient_set if (name, coefficient_set) in EQ1_COEFFICIENTS else "text"
    return (
        mbs,
        f"eq. (1) {set_used} coefficients C0={coeffs.c0}, C1={coeffs.c1}, model memory "
        f"{coeffs.model_memory_gb} GB, seq_len {seq_len}",
    )


def paper_max_batch_size(req: EstimateRequest) -> tuple[int, str]:
    """Eq. (1) for the request's model and GPU. The paper's GPU_mem is the datasheet label ("48GB" for the A40),
    which the catalog holds as `memory_gib`: eq. (1)'s coefficients were fitted on those labels, so the label is
    passed as it is, not converted."""
    return eq1_max_batch_size(
        req.spec,
        gpu_memory_gb=req.gpu.memory_gib,
        experts_per_token=req.experts_per_token,
        seq_len=req.sizing_seq_len,
        coefficient_set=req.options.coefficient_set,
    )


def paper_throughput(req: EstimateRequest, batch_size: int) -> tuple[float | None, list[str]]:
    """Eq. (2) (artifact form) fitted on measurements of this model, dataset and GPU, if there are any (never for
    an FP8 job: bf16 measurements)."""
    if req.job.fp8 != "none":
        return None, ["eq. (2) was fitted on bf16 runs: the FP8 job's throughput is the cross-GPU model's"]
    if (other := other_setup(req)) is not None:
        return None, [f"eq. (2) was fitted on other runs ({other}): the throughput is the cross-GPU model's"]
    fits = _fits_for(req.options.calibrate)
    fit = fits.get((req.spec.name, req.dataset, req.gpu.name))
    if fit is None:
        have = sorted({g for (m, d, g) in fits if m == req.spec.name and d == req.dataset})
        return None, [
            f"eq. (2) is fitted per GPU and there are no {req.spec.name}/{req.dataset} measurements on {req.gpu.name} "
            f"(have: {', '.join(have) or 'none'}); pass --calibrate FILE with measurements on it, "
            "or use --estimator calibrated"
        ]
    sparsity = sparsity_fraction(req.experts_per_token, req.spec.num_experts)
    qps = fit.predict_queries_per_s(batch_size=batch_size, sparsity=sparsity)
    notes = [f"eq. (2) {fit.note}; fitted on {fit.num_points} points (RMSE {fit.rmse:.3f} qps)"]
    lo, hi = fit.batch_size_range
    if not lo <= batch_size <= hi:
        notes.append(f"extrapolation: batch {batch_size} is outside the measured batch sizes {lo}..{hi}")
    return qps, notes


def other_setup(req: EstimateRequest) -> str | None:
    """How the job trains unlike the measurements eq. (1) and (2) are fitted on (the paper's setup), if it does."""
    measured = throughput_target(
        model=req.spec.name, gpu=req.gpu.name, batch_size=1, seq_len=512, method=req.job.method
    ).job
    ours, theirs = setup_label(req.job), setup_label(measured)
    if ours == theirs and req.job.packing != "none":
        return f"they padded each batch to its longest query; this job packs them ({req.job.packing} attention)"
    return None if ours == theirs else f"they ran {theirs}; this job {ours}"


def _check_paper_method(req: EstimateRequest) -> None:
    if req.job.fp8 != "none":
        raise TunecostError(
            "--fp8: the paper's eq. (1) and (2) have no FP8 term; use --estimator calibrated or simulate"
        )
    expected = PAPER_METHOD.get(req.spec.name)
    if expected is not None and req.job.method != expected:
        raise TunecostError(
            f"the paper measured {req.spec.name} with --method {expected} only; its coefficients do not apply to "
            f"{req.job.method} (use --estimator simulate)"
        )
    if (other := other_setup(req)) is not None:
        raise TunecostError(
            f"the paper's eq. (1) and (2) were fitted on its own setup: {other} (use --estimator simulate)"
        )


@register_estimator("paper", "Xia et al. eq. (1) max batch size + eq. (2) throughput fitted on measurements")
def paper_estimator(req: EstimateRequest) -> EstimatePoint:
    _check_paper_method(req)
    mbs, note = paper_max_batch_size(req)
    sizing = Sizing(max_batch_size=max(mbs, 0), borderline_batch_size=max(mbs, 0), note=note)
    if mbs < 1:
        return does_not_fit(sizing, "eq. (1) gives no room for a batch")
    batch, batch_notes = batch_to_price(req, sizing)
    qps, notes = paper_throughput(req, batch)
    notes = [note, *batch_notes, *notes]
    return EstimatePoint(
        max_batch_size=mbs, batch_size=batch, queries_per_s=qps, notes=tuple(notes), eq2_dataset=req.dataset
    )
