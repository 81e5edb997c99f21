"""The embedded demo: every part of tunecost on built-in data, on a CPU, in minutes.

Stages write tidy records into one run directory (docs/dev/records.md); the report is built from them.
The demo adds no logic of its own: each stage calls the same library function as its CLI command.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tunecost.catalog.datasets import get_dataset_facts
from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.estimate.measurements import PAPER_A40_MEASUREMENTS, PAPER_A40_SOURCE, load_measurements
from tunecost.estimate.paper import EQ1_ARTIFACT_SEQ_LEN
from tunecost.io import atomic_write_json
from tunecost.models.catalog import model_catalog, resolve_model
from tunecost.outputs import check_output_folder
from tunecost.profile.model_setup import ModelSetup
from tunecost.profile.ranks import profile_point
from tunecost.profile.sweep import InputSpec, SweepSpec, run_sweep
from tunecost.results.meta import run_metadata
from tunecost.results.records import (
    SCHEMA_VERSION,
    estimate_rows,
    fit_rows,
    multi_gpu_rows,
    record,
    validation_rows,
    write_records,
)
from tunecost.results.schema import record_path
from tunecost.simulate.batch import fitting_batch_size
from tunecost.train.trainability import TrainabilityJob, run_trainability
from tunecost.units import bytes_from_gib
from tunecost.workload.datasets import load_dataset
from tunecost.workload.job import FineTuneJob
from tunecost.workload.lengths import length_distribution
from tunecost.workload.templates import template_by_name
from tunecost.workload.tokenizers import tokenizer_by_name

if TYPE_CHECKING:
    from tunecost.workload.job import Method

ProgressFn = Callable[[int, int, str], None]

DEMO_GPUS = ("A40-48GB", "A100-40GB", "A100-80GB-SXM", "H100-80GB-SXM", "H200-141GB", "L40S-48GB")


@dataclass(frozen=True, kw_only=True)
class DemoStage:
    name: str
    description: str
    run: Callable[[Path, ProgressFn | None], None]


def _stage_fit(out: Path, on_progress: ProgressFn | None) -> None:
    """Eq. (2) refitted on the paper's A40 measurements (Fig. 14)."""
    from tunecost.estimate.fit import fit_all

    points = load_measurements(PAPER_A40_MEASUREMENTS)
    fits = [f for form in ("artifact", "printed") for f in fit_all(points, form)]
    write_records(record_path(out, "fit"), fit_rows(points, fits, source=PAPER_A40_SOURCE))


def _stage_estimate(out: Path, on_progress: ProgressFn | None) -> None:
    """Cost of fine-tuning the real Mixtral-8x7B (QLoRA) and BlackMamba-2.8B (full) on catalog GPUs."""
    from tunecost.estimate.cost import estimate_costs, estimate_job
    from tunecost.estimate.estimators import EstimatorOptions, estimator_names

    rows: list[dict] = []
    jobs = [("mixtral-8x7b", "qlora"), ("blackmamba-2.8b", "full")]
    jobs = [(m, meth) for m, meth in jobs if m in model_catalog()]
    names = [e for e in ("paper", "simulate", "calibrated") if e in estimator_names()]
    total = len(jobs) * len(names) * 2
    done = 0
    for model, method in jobs:
        job = estimate_job(model, method=method, dataset="math_14k")
        for estimator in names:
            for k in (2, 8):
                options = EstimatorOptions(name=estimator)
                costs = estimate_costs(job.with_(experts_per_token=k), DEMO_GPUS, epochs=10, options=options)
                rows += estimate_rows(costs, method=method, experts_per_token=k)
                done += 1
                if on_progress:
                    on_progress(done, total, f"estimate {model} top-{k} ({estimator})")
    write_records(record_path(out, "estimate"), rows)


DEMO_DATASET = "synthetic-arith"  # embedded: generated, no download
# GPU memory sizes of the catalog as datasheets state them ("48 GB"): eq. (1) takes the figure itself, the paper's
# GPU_mem, beside its 23.35 GB model memory; the simulator takes the bytes the card has, the figure read as GiB
# (`units.bytes_from_gib`, as `GPU.memory_bytes` does for catalog GPUs).
MAX_BATCH_MEMORY_GB = (24, 40, 48, 80, 141)
# (model, method, [(simulator stack, gradient checkpointing)]): Mixtral on the paper's 2024 stack as it reproduces
# Table III (docs/memory-model.md: checkpointing off) and on today's stack with checkpointing; BlackMamba is
# tunecost's own model on both stacks, full fine-tune without checkpointing.
MAX_BATCH_JOBS: tuple[tuple[str, Method, tuple[tuple[str, bool], ...]], ...] = (
    ("mixtral-8x7b", "qlora", (("hf-2024", False), ("tunecost", True))),
    ("blackmamba-2.8b", "full", (("tunecost", False),)),
)
PROFILE_JOBS = (("tiny-mixtral", "qlora"), ("tiny-blackmamba", "full"))
PROFILE_BATCH_SIZES = (1, 2, 4)
DENSE_SPARSE = (2, 8)


def _stage_lengths(out: Path, on_progress: ProgressFn | None) -> None:
    """Tokens per query of the embedded dataset with the real Mixtral tokenizer and prompt template (Fig. 2)."""
    dist = length_distribution(load_dataset(DEMO_DATASET), tokenizer_by_name("mistral"), template_by_name("mistral"))
    rows = [
        record(
            "lengths",
            dataset=dist.dataset,
            tokenizer=dist.tokenizer,
            template=dist.template,
            query_index=i,
            length=n,
        )
        for i, n in enumerate(dist.lengths)
    ]
    write_records(record_path(out, "lengths"), rows)


def _stage_max_batch(out: Path, on_progress: ProgressFn | None) -> None:
    """Largest batch vs GPU memory for the real models: eq. (1) beside the step simulator on the paper's 2024
    stack and on today's (Fig. 13 and Table III)."""
    from tunecost.estimate.estimators import eq1_max_batch_size

    seq_len = EQ1_ARTIFACT_SEQ_LEN
    rows: list[dict] = []
    total = len(MAX_BATCH_JOBS) * len(DENSE_SPARSE) * len(MAX_BATCH_MEMORY_GB)
    done = 0
    for model, method, setups in MAX_BATCH_JOBS:
        spec = resolve_model(model)
        for k in DENSE_SPARSE:
            job = FineTuneJob(model=model, method=method, experts_per_token=k, seq_len=seq_len)
            keys = {**job.record_keys(), "device": "none"}
            for gb in MAX_BATCH_MEMORY_GB:
                eq1, note = eq1_max_batch_size(spec, gpu_memory_gb=gb, experts_per_token=k, seq_len=seq_len)
                rows.append(
                    record(
                        "max_batch",
                        **keys,
                        gpu_memory_gb=gb,
                        max_batch_size=max(0, eq1),
                        source="eq1",
                        estimator="paper eq. (1)",
                        note=note,
                    )
                )
                for stack, checkpointing in setups:
                    mbs = fitting_batch_size(
                        job.with_(gradient_checkpointing=checkpointing, stack=stack), bytes_from_gib(gb)
                    )
                    rows.append(
                        record(
                            "max_batch",
                            **keys,
                            gpu_memory_gb=gb,
                            max_batch_size=mbs,
                            source="simulated",
                            estimator=f"simulator, {stack} stack, checkpointing {'on' if checkpointing else 'off'}",
                            stack=stack,
                            gradient_checkpointing=checkpointing,
                        )
                    )
                done += 1
                if on_progress:
                    on_progress(done, total, f"max batch {model} top-{k} at {gb} GB")
    write_records(record_path(out, "max_batch"), rows)


def _stage_profile(out: Path, on_progress: ProgressFn | None) -> None:
    """Fine-tune tiny random-weight models of the real architectures on the embedded dataset on this CPU, dense vs
    sparse: throughput, stage / layer / kernel breakdown, expert load, memory (Figs. 4-8, 11). Resumes finished
    points."""
    total = len(PROFILE_JOBS) * len(DENSE_SPARSE) * len(PROFILE_BATCH_SIZES)
    done = 0
    for model, method in PROFILE_JOBS:
        spec = SweepSpec(
            setup=ModelSetup(model=model, method=method, device="cpu"),
            experts_per_token=DENSE_SPARSE,
            batch_sizes=PROFILE_BATCH_SIZES,
            inputs=InputSpec(dataset=DEMO_DATASET),
        )

        def progress(d: int, t: int, label: str, _base: int = done, _model: str = model) -> None:
            if on_progress:
                on_progress(_base + d, total, f"profile {_model}: {label}")

        result = run_sweep(spec, out / f"profile-{model}", command=["tunecost", "demo"], on_progress=progress)
        done += len(result.points)


def _stage_trainability(out: Path, on_progress: ProgressFn | None) -> None:
    """Fine-tune a tiny MoE on the embedded arithmetic task, top-2 vs dense: accuracy per epoch (Fig. 3)."""
    run_trainability(trainability_job(), out, on_progress=on_progress)


def trainability_job():
    """The paper's setup on the embedded task: tiny Mixtral, top-2 and dense, 10 epochs (TrainabilityJob defaults)."""
    return TrainabilityJob()


def _stage_validate(out: Path, on_progress: ProgressFn | None) -> None:
    """Every estimate beside the published measurements of the shipped corpus (`tunecost validate`)."""
    from tunecost.validate import read_corpus, validate_rows

    rows = validate_rows(read_corpus(None), on_progress=on_progress)
    write_records(record_path(out, "validation"), validation_rows(rows))


MULTI_GPU_DEMO = ("mixtral-8x7b", "lora", ("H100-80GB-SXM", "A100-80GB-SXM"), ("ddp", "fsdp2"), 8)
RANKS_DEMO = ("tiny-mixtral", "lora", "fsdp2", 2)  # model, method, strategy, ranks


def _stage_multi_gpu(out: Path, on_progress: ProgressFn | None) -> None:
    """Mixtral-8x7B LoRA on 1-8 GPUs (`estimate --gpus auto`: DDP's replica does not fit, FSDP2's shard does),
    then a real 2-rank FSDP2 step of tiny Mixtral on gloo (`profile --nproc-per-node 2`; resumes)."""
    from tunecost.estimate.cost import estimate_job
    from tunecost.estimate.gpu_search import estimate_multi_gpu

    model, method, gpus, strategies, max_gpus = MULTI_GPU_DEMO
    if on_progress:
        on_progress(0, 2, f"estimate {model} ({method}) on 1-{max_gpus} GPUs")
    job = estimate_job(model, method=method, dataset="math_14k").with_(batch_size=1, seq_len=512)
    answer = estimate_multi_gpu(
        job,
        gpus=[resolve_gpu_name(g).gpu for g in gpus],
        strategies=strategies,
        max_gpus=max_gpus,
        num_queries=get_dataset_facts("math_14k").num_queries,
        epochs=10,
    )
    write_records(record_path(out, "multi_gpu"), multi_gpu_rows(answer))
    tiny, tiny_method, strategy, ranks = RANKS_DEMO
    if on_progress:
        on_progress(1, 2, f"profile {tiny} ({tiny_method}) on {ranks} CPU ranks ({strategy})")
    setup = ModelSetup(model=tiny, method=tiny_method, random_weights=True)
    profile_point(
        setup, out / "profile-ranks", strategy=strategy, nproc_per_node=ranks, batch_size=2, seq_len=64, steps=2
    )
    if on_progress:
        on_progress(2, 2, "several GPUs")


def _stage_report(out: Path, on_progress: ProgressFn | None) -> None:
    """One self-contained HTML page from every record above."""
    from tunecost.report.html import build_report

    build_report(out, out / "report.html")


STAGES: tuple[DemoStage, ...] = (
    DemoStage(name="lengths", description="sequence lengths of the embedded dataset", run=_stage_lengths),
    DemoStage(name="fit", description="fit eq. (2) to the paper's A40 measurements", run=_stage_fit),
    DemoStage(name="max_batch", description="max batch size: eq. (1) vs the step simulator", run=_stage_max_batch),
    DemoStage(name="estimate", description="estimate costs on catalog GPUs", run=_stage_estimate),
    DemoStage(name="validate", description="estimates beside published measurements", run=_stage_validate),
    DemoStage(name="multi_gpu", description="several GPUs: cost vs GPU count, a 2-rank profile", run=_stage_multi_gpu),
    DemoStage(name="profile", description="profile tiny Mixtral (QLoRA) and BlackMamba (full)", run=_stage_profile),
    DemoStage(name="trainability", description="trainability: top-2 vs dense", run=_stage_trainability),
    DemoStage(name="report", description="build the report", run=_stage_report),
)


def run_demo(
    out_dir: Path, *, on_stage: Callable[[DemoStage], None] | None = None, on_progress: ProgressFn | None = None
) -> dict[str, float]:
    """Run every demo stage into `out_dir`; returns seconds per stage. Rerunning resumes the profile sweeps and
    the trainability runs where they stopped; the quick stages are redone. A folder that is not a tunecost run's
    (`outputs.check_output_folder`) is refused before anything is written."""
    check_output_folder(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        out_dir / "meta.json",
        run_metadata(device="cpu", command=["tunecost", "demo"], extra={"demo_stages": [s.name for s in STAGES]}),
    )
    seconds: dict[str, float] = {}
    for stage in STAGES:
        if on_stage:
            on_stage(stage)
        start = time.perf_counter()
        stage.run(out_dir, on_progress)
        seconds[stage.name] = time.perf_counter() - start
        atomic_write_json(out_dir / "demo.json", {"schema_version": SCHEMA_VERSION, "stages_seconds": seconds})
    return seconds
