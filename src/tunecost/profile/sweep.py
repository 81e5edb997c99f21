"""A resumable profile sweep: experts per token x sequence lengths (or a dataset) x batch sizes, in one run.

Every finished point is on disk before the next starts (`records.write_point`); rerunning the same sweep into the
same folder skips finished points (their ids are in `points.jsonl`), drops the partial rows of an interrupted one
and measures only what is missing. The model is built once per sweep; each point sets its top-k and restores the
trainable weights, so every point starts from the same model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tunecost.errors import TunecostError
from tunecost.outputs import read_run_metadata
from tunecost.profile.inputs import BatchSource, dataset_source, synthetic_source
from tunecost.profile.loop import TrainableSnapshot
from tunecost.profile.model_setup import ModelSetup, build_training_model, resolve_profile_model
from tunecost.profile.point import MeasureOptions, PointMeasurement, Workload, measure_point
from tunecost.profile.point_rows import finished_points, purge_unfinished, summary, write_point
from tunecost.results.meta import run_metadata, update_run_metadata

ProgressFn = Callable[[int, int, str], None]
DEFAULT_SEQ_LEN = 128  # the paper's latency / kernel runs (§III)


@dataclass(frozen=True, kw_only=True)
class InputSpec:
    """Where a sweep's queries come from: fixed lengths (synthetic ids) or a dataset."""

    seq_lens: tuple[int, ...] = ()
    dataset: str | None = None
    tokenizer: str = "mistral"
    template: str = "mistral"
    max_length: int = 1024  # the paper's cutoff length
    dataset_limit: int | None = None

    def __post_init__(self) -> None:
        if self.seq_lens and self.dataset:
            raise TunecostError("give sequence lengths or a dataset, not both")
        if any(n < 2 for n in self.seq_lens):
            raise TunecostError(f"sequence lengths must be >= 2 tokens, got {list(self.seq_lens)}")

    @property
    def resolved_seq_lens(self) -> tuple[int | None, ...]:
        if self.dataset:
            return (None,)
        return self.seq_lens or (DEFAULT_SEQ_LEN,)


@dataclass(frozen=True, kw_only=True)
class SweepSpec:
    setup: ModelSetup
    experts_per_token: tuple[int, ...] = ()  # empty: the model's own top-k
    batch_sizes: tuple[int, ...] = (1,)
    inputs: InputSpec = field(default_factory=InputSpec)
    options: MeasureOptions = field(default_factory=MeasureOptions)

    def __post_init__(self) -> None:
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise TunecostError(f"batch sizes must be >= 1, got {list(self.batch_sizes)}")
        if any(k < 1 for k in self.experts_per_token):
            raise TunecostError(f"experts per token must be >= 1, got {list(self.experts_per_token)}")


@dataclass(frozen=True, kw_only=True)
class SweepResult:
    out_dir: Path
    points: tuple[Workload, ...]
    measured: tuple[str, ...]  # point ids measured in this run
    skipped: tuple[str, ...]  # already finished before this run
    oom: tuple[str, ...]  # measured as out of memory (a boundary, not a failure)
    table: tuple[dict[str, Any], ...]  # summary of every point of the sweep


def sweep_points(spec: SweepSpec, model_spec: Any) -> list[Workload]:
    ks = spec.experts_per_token or (model_spec.default_experts_per_token,)
    for k in ks:
        if not 1 <= k <= model_spec.num_experts:
            raise TunecostError(
                f"{model_spec.name}: experts per token must be between 1 and {model_spec.num_experts}, got {k}"
            )
    for seq in spec.inputs.seq_lens:
        model_spec.check_seq_len(seq)
    layers = spec.setup.num_layers
    if layers is not None and layers > model_spec.num_layers:
        raise TunecostError(f"--num-layers {layers}: {model_spec.name} has {model_spec.num_layers} decoder layers")
    device = spec.setup.device
    return [
        Workload(
            model=spec.setup.model,
            method=spec.setup.method,
            experts_impl=spec.setup.resolved_experts_impl,
            experts_per_token=k,
            batch_size=b,
            seq_len=seq,
            dataset=spec.inputs.dataset,
            device="cuda" if device.startswith("cuda") else device,
        )
        for k in ks
        for seq in spec.inputs.resolved_seq_lens
        for b in spec.batch_sizes
    ]


def make_source(
    inputs: InputSpec, *, vocab_size: int, seq_len: int | None, num_queries: int, seed: int = 0
) -> BatchSource:
    if inputs.dataset:
        return dataset_source(
            inputs.dataset,
            vocab_size=vocab_size,
            tokenizer=inputs.tokenizer,
            template=inputs.template,
            max_length=inputs.max_length,
            limit=inputs.dataset_limit,
        )
    assert seq_len is not None
    return synthetic_source(vocab_size=vocab_size, seq_len=seq_len, num_queries=num_queries, seed=seed)


def _settings(spec: SweepSpec) -> dict[str, Any]:
    """What every point of a sweep is measured with, beside its own keys (`Workload.keys`)."""
    return {
        "steps": spec.options.steps,
        "warmup_steps": spec.options.warmup_steps,
        "gradient_checkpointing": spec.setup.gradient_checkpointing,
        "lora_rank": spec.setup.lora_rank,
        "lora_alpha": spec.setup.lora_alpha,
        "random_weights": spec.setup.random_weights,
        "num_layers": spec.setup.num_layers,
    }


def write_meta(out_dir: Path, spec: SweepSpec, points: list[Workload], command: Any, extra: dict[str, Any]) -> None:
    new = run_metadata(
        device=spec.setup.device,
        command=command,
        workloads=[p.keys() for p in points],
        extra={"profile": {**_settings(spec), **extra}},
    )
    update_run_metadata(out_dir, new)


def _check_same_settings(out: Path, spec: SweepSpec) -> None:
    """A sweep resumed into `out` measures its missing points as its finished ones were measured: other settings
    would mix two measurements in one table."""
    old = (read_run_metadata(out / "meta.json") or {}).get("profile") or {}
    changed = [f"{k} {old[k]} (now {v})" for k, v in _settings(spec).items() if k in old and old[k] != v]
    if changed:
        raise TunecostError(
            f"--out {out}: its finished points were measured with {', '.join(changed)}; resume with the same "
            "settings, or measure into another --out"
        )


def run_sweep(
    spec: SweepSpec,
    out_dir: str | Path,
    *,
    command: Any = None,
    on_progress: ProgressFn | None = None,
    on_point: Callable[[PointMeasurement], None] | None = None,
    on_step: ProgressFn | None = None,
) -> SweepResult:
    """Measure every unfinished point of `spec` into `out_dir` (see module docstring).

    `on_progress(done, total, label)` after each point; `on_point(measurement)` after each point is written;
    `on_step` within a point. A KeyboardInterrupt propagates after the last finished point is on disk.
    """
    out = Path(out_dir)
    model_spec = resolve_profile_model(spec.setup.model)
    points = sweep_points(spec, model_spec)
    out.mkdir(parents=True, exist_ok=True)
    with _exclusive(out):
        return _run_locked(spec, out, model_spec, points, command, on_progress, on_point, on_step)


@contextlib.contextmanager
def _exclusive(out: Path) -> Iterator[None]:
    """One writer per run folder: a second sweep into the same folder would measure the same points twice."""
    import fcntl

    with open(out / ".lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise TunecostError(
                f"another tunecost profile is writing to {out}; wait for it or use another --out"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run_locked(
    spec: SweepSpec,
    out: Path,
    model_spec: Any,
    points: list[Workload],
    command: Any,
    on_progress: ProgressFn | None,
    on_point: Callable[[PointMeasurement], None] | None,
    on_step: ProgressFn | None,
) -> SweepResult:
    done_before = finished_points(out)
    if done_before:
        _check_same_settings(out, spec)
    purge_unfinished(out)
    todo = [p for p in points if p.point_id not in done_before]
    write_meta(out, spec, points, command, {})
    measured: list[str] = []
    oom: list[str] = [p.point_id for p in points if done_before.get(p.point_id, {}).get("status") == "oom"]
    total, done = len(points), len(points) - len(todo)
    if on_progress:
        on_progress(done, total, "resuming" if done else "starting")
    if todo:
        num_queries = max(spec.batch_sizes) * spec.options.steps
        sources: dict[int | None, BatchSource] = {}
        for seq in spec.inputs.resolved_seq_lens:  # inputs first: a too-small dataset fails before any build
            sources[seq] = make_source(
                spec.inputs,
                vocab_size=model_spec.vocab_size,
                seq_len=seq,
                num_queries=num_queries,
                seed=spec.setup.seed,
            )
            for p in todo:
                if p.seq_len == seq:
                    sources[seq].check_enough(p.batch_size, spec.options.steps)
        first_k = todo[0].experts_per_token
        prepared = build_training_model(replace(spec.setup, experts_per_token=first_k), spec=model_spec)
        snapshot = TrainableSnapshot(prepared.model)
        extra = {
            "weights": prepared.weights,
            "dtype": prepared.dtype,
            "trainable_params": prepared.trainable_params,
            "total_params": prepared.total_params,
            "num_experts": prepared.num_experts,
        }
        for p in todo:
            label = f"k={p.experts_per_token} batch={p.batch_size} " + (
                f"seq={p.seq_len}" if p.seq_len else f"dataset={p.dataset}"
            )
            if on_progress:
                on_progress(done, total, label)
            m = measure_point(prepared, sources[p.seq_len], p, spec.options, snapshot=snapshot, on_step=on_step)
            write_point(out, m, extra=extra)
            measured.append(p.point_id)
            if m.status == "oom":
                oom.append(p.point_id)
            done += 1
            if on_point:
                on_point(m)
            if on_progress:
                on_progress(done, total, label)
    table = summary(out, [p.point_id for p in points])
    return SweepResult(
        out_dir=out,
        points=tuple(points),
        measured=tuple(measured),
        skipped=tuple(p.point_id for p in points if p.point_id in done_before),
        oom=tuple(oom),
        table=tuple(table),
    )
