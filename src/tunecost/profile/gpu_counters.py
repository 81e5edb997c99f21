"""SM and DRAM utilization of the MoE layer's kernels under Nsight Compute (paper §IV-B4, Figs. 9 and 10).

Sources and derivations: docs/profiling.md, section `tunecost.profile.gpu_counters`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunecost.errors import TunecostError
from tunecost.io import atomic_write_json, atomic_write_text, read_jsonl
from tunecost.models.catalog import resolve_model
from tunecost.moe.ranges import NCU_NVTX_EXCLUDE, NCU_NVTX_INCLUDE, is_moe_work
from tunecost.profile.model_setup import ModelSetup
from tunecost.profile.ncu import DEFAULT_METRICS, KernelCounterRow, parse_ncu_csv_file, time_weighted_utilization
from tunecost.results.records import record
from tunecost.results.schema import record_path
from tunecost.workload.job import FineTuneJob

NO_CUDA_MESSAGE = (
    "no CUDA GPU: gpu-counters needs an NVIDIA GPU and Nsight Compute (ncu); on a CPU machine use "
    "`tunecost profile` for the torch.profiler kernel breakdown"
)
_OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError")


def _default_job() -> FineTuneJob:
    # the paper's latency / Nsight runs used 128 tokens per query
    return FineTuneJob(model="tiny-mixtral", method="full", seq_len=128)


@dataclass(frozen=True, kw_only=True)
class GpuCountersJob:
    """What to profile: the job (model, method, top-k, LoRA, a fixed sequence length) at several batch sizes on
    random token ids, and how (the profiler's own options)."""

    job: FineTuneJob = field(default_factory=_default_job)  # its model: catalog name, local folder or hub id
    experts_impl: str | None = None  # tunecost.moe.spec.EXPERT_IMPLS; None: the method's default
    batch_sizes: tuple[int, ...] = (1, 32)
    steps: int = 2  # profiled training steps per batch size
    warmup_steps: int = 1  # unlabelled steps first (cuBLAS heuristics, allocator), not profiled
    layers: tuple[int, ...] = (0, 1)  # decoder layers whose MoE block is profiled
    max_kernels: int = 20000  # ncu --launch-count: a bound on profiling time

    def __post_init__(self) -> None:
        if self.job.seq_len is None:
            raise TunecostError("gpu-counters runs a fixed sequence length (seq_len), not a dataset's lengths")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise TunecostError(f"batch sizes must be positive integers, got {list(self.batch_sizes)}")
        for name in ("steps", "max_kernels"):
            if getattr(self, name) < 1:
                raise TunecostError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.warmup_steps < 0:
            raise TunecostError(f"warmup-steps must be >= 0, got {self.warmup_steps}")
        if not self.layers or any(layer < 0 for layer in self.layers):
            raise TunecostError(f"layers must be non-negative layer indices, got {list(self.layers)}")
        self.model_setup(device="cpu")  # checks the experts implementation for the method
        resolve_model(self.job.model)  # unknown names fail here, with the catalog's "did you mean"

    def model_setup(self, *, device: str) -> ModelSetup:
        """How the child builds the model: random weights, decoder layers up to the last profiled one."""
        return ModelSetup.from_job(
            self.job,
            device=device,
            experts_impl=self.experts_impl,
            random_weights=True,
            num_layers=max(self.layers) + 1,
        )

    def keys(self) -> dict[str, Any]:
        """The keys of this job's records: the job's and the profiled layers."""
        return {**self.job.record_keys(), "layers": list(self.layers)}

    def point_id(self, batch_size: int) -> str:
        job = self.job
        k = job.experts_per_token if job.experts_per_token is not None else "default"
        layers = ",".join(map(str, self.layers))
        return (
            f"gpu-counters|{job.model}|{job.method}|{self.experts_impl or 'default'}|k={k}|bs={batch_size}"
            f"|seq={job.seq_len}|layers={layers}|steps={self.steps}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "job": self.job.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuCountersJob:
        """The job `to_dict` wrote (through JSON: lists back to tuples)."""
        values: dict[str, Any] = {**data, **{k: tuple(data[k]) for k in ("batch_sizes", "layers") if k in data}}
        if "job" in values:
            values["job"] = FineTuneJob.from_dict(values["job"])
        return cls(**values)


CHILD_MODULE = "tunecost.profile.counters_child"


def child_command(job: GpuCountersJob, batch_size: int, *, mode: str, rows_out: Path | None = None) -> list[str]:
    """The command line of the child process that runs the labelled training steps (its spec last)."""
    spec: dict[str, Any] = {"mode": mode, "batch_size": batch_size, "counters": job.to_dict()}
    if rows_out is not None:
        spec["rows_out"] = str(rows_out)
    return [sys.executable, "-m", CHILD_MODULE, json.dumps(spec, sort_keys=True)]


@dataclass(frozen=True, kw_only=True)
class GpuCountersResult:
    source: str  # "ncu" or "torch.profiler" (durations only)
    rows: tuple[KernelCounterRow, ...]
    utilization: tuple[Any, ...]  # tunecost.profile.ncu.ClassUtilization, per (batch size, class)
    notes: tuple[str, ...]  # fallbacks, skipped batch sizes, parse warnings
    out_dir: str


def check_can_run(job: GpuCountersJob) -> None:
    """Fail fast, before any child starts: a CUDA GPU is needed."""
    import torch

    if not torch.cuda.is_available():
        raise TunecostError(NO_CUDA_MESSAGE)


def find_ncu() -> str | None:
    """The `ncu` executable on PATH or in the usual CUDA install folders."""
    found = shutil.which("ncu")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "ncu").is_file():
            return str(Path(root) / "bin" / "ncu")
    return None


def build_ncu_command(
    app: Sequence[str],
    *,
    log_file: Path,
    ncu: str = "ncu",
    metrics: Sequence[str] = DEFAULT_METRICS,
    nvtx_include: str = NCU_NVTX_INCLUDE,
    nvtx_exclude: str | None = NCU_NVTX_EXCLUDE,
    launch_count: int | None = None,
) -> list[str]:
    """ncu's command line: counters of the kernels inside the MoE NVTX range, CSV (raw page, base units)."""
    cmd = [ncu, "--clock-control", "none", "--target-processes", "all", "--nvtx", "--nvtx-include", nvtx_include]
    if nvtx_exclude:
        cmd += ["--nvtx-exclude", nvtx_exclude]
    cmd += [
        "--metrics",
        ",".join(metrics),
        "--csv",
        "--page",
        "raw",
        "--print-units",
        "base",
        "--log-file",
        str(log_file),
    ]
    if launch_count is not None:
        cmd += ["--launch-count", str(launch_count)]
    return [*cmd, *app]


def counters_not_permitted(text: str) -> bool:
    """ncu's message when the driver does not let this user read GPU performance counters."""
    return "ERR_NVGPUCTRPERM" in text


def _last_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line or line.startswith("==ERROR=="):
            return line[:300]
    return lines[-1][:300] if lines else "no output"


# --- the parent: one child per batch size, under ncu or torch.profiler ------------------------------------------


def _run(cmd: Sequence[str], timeout_s: float | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s, env=env, check=False)


def _row_from_dict(data: dict[str, Any]) -> KernelCounterRow:
    names = {f.name for f in dataclasses.fields(KernelCounterRow)}
    fields = {k: v for k, v in data.items() if k in names}
    fields["nvtx_ranges"] = tuple(fields.get("nvtx_ranges") or ())
    return KernelCounterRow(**fields)


def _record(job: GpuCountersJob, row: KernelCounterRow, device: str) -> dict[str, Any]:
    return record(
        "counters", point_id=job.point_id(row.batch_size or 0), **{**job.keys(), "device": device, **row.to_dict()}
    )


def _source_of(rows: Sequence[KernelCounterRow]) -> str:
    sources = {r.source for r in rows}
    return sources.pop() if len(sources) == 1 else "mixed"


def _write_results(
    out_dir: Path,
    job: GpuCountersJob,
    rows: list[KernelCounterRow],
    *,
    device: str,
    notes: list[str],
    command: list[str] | None,
    foreign: list[dict[str, Any]],
) -> tuple[Any, ...]:
    """Rewrite counters.jsonl (this job's rows after rows of other jobs found there) and utilization.json."""
    utilization = tuple(time_weighted_utilization(rows).values())
    lines = [json.dumps(r) for r in foreign] + [json.dumps(_record(job, r, device)) for r in rows]
    atomic_write_text(record_path(out_dir, "counters"), "".join(line + "\n" for line in lines))
    atomic_write_json(
        record_path(out_dir, "utilization"),
        record(
            "utilization",
            **{
                **job.keys(),
                "experts_impl": job.experts_impl,
                "steps": job.steps,
                "source": _source_of(rows),
                "device": device,
                "command": command,
                "notes": notes,
                "classes": [dataclasses.asdict(u) for u in utilization],
            },
        ),
    )
    return utilization


def _oom(text: str) -> bool:
    return any(marker in text for marker in _OOM_MARKERS)


def _measure_with_ncu(
    job: GpuCountersJob, batch: int, out: Path, ncu: str, timeout_s: float | None, notes: list[str]
) -> tuple[str, list[KernelCounterRow], list[str]]:
    """("ok" | "oom" | "not-permitted", rows, command) of one batch size under ncu."""
    log_file = out / "raw" / f"ncu_bs{batch}.csv"
    log_file.unlink(missing_ok=True)
    command = build_ncu_command(
        child_command(job, batch, mode="steps"), log_file=log_file, ncu=ncu, launch_count=job.max_kernels
    )
    proc = _run(command, timeout_s)
    text = proc.stdout + proc.stderr + (log_file.read_text(errors="replace") if log_file.exists() else "")
    if counters_not_permitted(text):
        return "not-permitted", [], command
    if _oom(text):
        return "oom", [], command
    if proc.returncode != 0:
        raise TunecostError(f"ncu run for batch size {batch} failed (exit {proc.returncode}): {_last_error_line(text)}")
    if not log_file.exists():
        raise TunecostError(f"ncu wrote no CSV for batch size {batch}: {_last_error_line(text)}")
    parsed = parse_ncu_csv_file(log_file, batch_size=batch)
    if not parsed.rows:
        raise TunecostError(
            f"ncu profiled no kernel inside the MoE range for batch size {batch} "
            f"(filter --nvtx-include {NCU_NVTX_INCLUDE!r}); see {log_file}"
        )
    notes.extend(f"batch size {batch}: {w}" for w in parsed.warnings[:20])
    rows = [r for r in parsed.rows if is_moe_work(r.nvtx_ranges)]
    if len(rows) < len(parsed.rows):
        notes.append(
            f"batch size {batch}: left out {len(parsed.rows) - len(rows)} kernels that are not MoE work "
            "(checkpoint recomputation of attention/norms inside a MoE range)"
        )
    return "ok", rows, command


def _measure_with_torch_profiler(
    job: GpuCountersJob, batch: int, out: Path, timeout_s: float | None
) -> tuple[str, list[KernelCounterRow], list[str]]:
    rows_file = out / "raw" / f"torch_profiler_bs{batch}.jsonl"
    command = child_command(job, batch, mode="torch-profiler", rows_out=rows_file)
    proc = _run(command, timeout_s)
    text = proc.stdout + proc.stderr
    if _oom(text):
        return "oom", [], command
    if proc.returncode != 0:
        raise TunecostError(f"profiling batch size {batch} failed (exit {proc.returncode}): {_last_error_line(text)}")
    return "ok", [_row_from_dict(r) for r in read_jsonl(rows_file)], command


def run_gpu_counters(
    job: GpuCountersJob,
    out_dir: str | Path,
    *,
    ncu_path: str | None = None,
    timeout_s: float | None = None,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> GpuCountersResult:
    """Profile every batch size of `job` (see docs/profiling.md) and write the results into `out_dir`."""
    import torch

    check_can_run(job)
    out = Path(out_dir)
    (out / "raw").mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0)
    ncu = ncu_path or find_ncu()
    notes: list[str] = []
    if ncu is None:
        notes.append(
            "ncu not found (install Nsight Compute or put ncu on PATH): kernel durations from "
            "torch.profiler only, no SM/DRAM utilization"
        )
    ours = {job.point_id(b) for b in job.batch_sizes}
    records = read_jsonl(record_path(out, "counters"))
    foreign = [r for r in records if r.get("point_id") not in ours]  # other jobs' rows in this folder: kept
    rows = [_row_from_dict(r) for r in records if r.get("point_id") in ours]
    done = {r.batch_size for r in rows if r.batch_size is not None}
    if done:
        notes.append(f"kept batch sizes {sorted(done)} measured by a previous run")
    command: list[str] | None = None
    total = len(job.batch_sizes)
    for index, batch in enumerate(job.batch_sizes):
        if on_progress:
            on_progress(index, total, f"batch size {batch}")
        if batch in done:
            continue
        status = "fallback"
        if ncu is not None:
            status, new_rows, command = _measure_with_ncu(job, batch, out, ncu, timeout_s, notes)
            if status == "not-permitted":
                notes.append(
                    "ncu may not read GPU performance counters here (ERR_NVGPUCTRPERM): kernel "
                    "durations from torch.profiler only, no SM/DRAM utilization"
                )
                ncu, status = None, "fallback"
        if status == "fallback":
            status, new_rows, command = _measure_with_torch_profiler(job, batch, out, timeout_s)
        if status == "oom":
            notes.append(f"batch size {batch}: out of GPU memory (skipped)")
            continue
        rows.extend(new_rows)
        _write_results(out, job, rows, device=device, notes=notes, command=command, foreign=foreign)
    if not rows:
        raise TunecostError(f"no batch size could be profiled: {'; '.join(notes) or 'no rows'}")
    utilization = _write_results(out, job, rows, device=device, notes=notes, command=command, foreign=foreign)
    if on_progress:
        on_progress(total, total, "done")
    return GpuCountersResult(
        source=_source_of(rows), rows=tuple(rows), utilization=utilization, notes=tuple(notes), out_dir=str(out)
    )
