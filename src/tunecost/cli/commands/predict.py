"""`tunecost predict`: throughput of any (model, dataset, GPU, top-k, batch) from one calibration."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tunecost.cli.common import checked_host_cpu, cli_errors, console, print_json, print_table
from tunecost.cli.jobconfig import ConfigFiles
from tunecost.cli.options import BatchSize, Force, HostCpuOpt, JobModel, JsonOut, RunQueries, SeqLen, opt
from tunecost.csvfile import read_csv_rows
from tunecost.errors import TunecostError
from tunecost.io import atomic_write_text

CALIBRATE_HELP = (
    "Measurements CSV or folder of CSVs to calibrate on; repeat for several (default: every bundled measurement: "
    "the paper's A40 and A100-40GB points)."
)
GPU_PROFILE_HELP = (
    "GPU profile from `tunecost calibrate-gpu` (FILE, or GPU=FILE to say which catalog GPU it measured); used "
    "instead of catalog values for that GPU; repeatable."
)
INPUT_HELP = (
    "TARGETS.csv: model,dataset,gpu,experts_per_token,batch_size[,seq_len][,method][,host_cpu] (or one job: "
    "--model/--config with --gpu)"
)
METHOD_HELP = "full | lora | qlora (default: the paper's method for its models, else qlora)."
TARGET_COLUMNS = ("model", "dataset", "gpu", "experts_per_token", "batch_size")
OUTPUT_COLUMNS = (
    "model",
    "dataset",
    "gpu",
    "experts_per_token",
    "batch_size",
    "seq_len",
    "method",
    "queries_per_s",
    "queries_per_s_low",
    "queries_per_s_high",
    "step_s",
    "gpu_s",
    "host_s",
    "optimizer_s",
    "host_cpu",
    "run_queries",
    "extrapolation",
    "extrapolation_reasons",
    "interval_kinds",
    "estimator",
    "calibration_notes",
)


def read_targets(path: Path, host_cpu: str | None = None) -> list:
    """TARGETS.csv rows as `ThroughputTarget`s; every error names the row (1-based, header excluded). A row's
    host_cpu column names its host; `host_cpu` is the host of rows without one."""
    from tunecost.estimate.throughput.targets import throughput_target

    _, rows = read_csv_rows(path, "targets file", required=TARGET_COLUMNS)
    if not rows:
        raise TunecostError(f"{path}: no targets")

    def integer(i: int, row: dict, col: str) -> int | None:
        text = (row.get(col) or "").strip()
        if not text:
            return None
        try:
            return int(text)
        except ValueError:
            raise TunecostError(f"{path}: row {i}: column {col!r} must be a whole number, got {text!r}") from None

    out = []
    for i, row in enumerate(rows, start=1):
        batch = integer(i, row, "batch_size")
        if batch is None:
            raise TunecostError(f"{path}: row {i}: empty batch_size")
        experts_per_token, seq_len = integer(i, row, "experts_per_token"), integer(i, row, "seq_len")
        try:  # the column checks above name the row themselves; only the target's own checks get the prefix here
            out.append(
                throughput_target(
                    model=(row.get("model") or "").strip(),
                    gpu=(row.get("gpu") or "").strip(),
                    batch_size=batch,
                    experts_per_token=experts_per_token,
                    dataset=(row.get("dataset") or "").strip() or None,
                    seq_len=seq_len,
                    method=(row.get("method") or "").strip() or None,
                    host_cpu=(row.get("host_cpu") or "").strip() or host_cpu,
                )
            )
        except TunecostError as exc:
            raise TunecostError(f"{path}: row {i}: {exc}") from None
    return out


def load_profiles(specs: list[str]) -> list:
    """GPU profiles written by `tunecost calibrate-gpu`, as `GpuTerms`. A spec is FILE (the profile's device name
    must name a catalog GPU) or GPU=FILE (the catalog GPU it stands for, e.g. H100=h100.json)."""
    if not specs:
        return []
    from dataclasses import replace

    try:
        from tunecost.estimate.throughput.gpu_profile import load_gpu_profile
    except ImportError:
        raise TunecostError("--gpu-profile needs GPU profile support (tunecost calibrate-gpu), not installed") from None
    out = []
    for spec in specs:
        gpu, sep, file = spec.partition("=")
        if sep and not Path(spec).is_file():
            out.append(replace(load_gpu_profile(Path(file)), name=gpu.strip()))
        else:
            out.append(load_gpu_profile(Path(spec)))
    return out


def job_target(model: str | None, gpu: str | None, options: dict, host_cpu: str | None) -> list:
    """The one target the job options describe (`--model`/`--config` with `--gpu`), as a TARGETS.csv row would."""
    from tunecost.estimate.throughput.targets import throughput_target

    if model is None or gpu is None:
        raise TunecostError("give --input TARGETS.csv, or one job: --model (or --config) and --gpu")
    return [throughput_target(model=model, gpu=gpu, host_cpu=host_cpu, **options)]


def _predict_all(model, targets: list, path: Path, run_queries: int | None) -> list:
    out = []
    for i, target in enumerate(targets, start=1):
        try:
            out.append(model.predict(target, run_queries=run_queries))
        except TunecostError as exc:
            raise TunecostError(f"{path}: row {i}: {exc}") from None
    return out


def _row(pred, notes: str = "") -> dict:
    t = pred.target.job
    return {
        "model": t.model,
        "dataset": t.dataset or "",
        "gpu": pred.gpu,
        "experts_per_token": pred.experts_per_token,
        "batch_size": t.batch_size,
        "seq_len": t.seq_len or "",
        "method": pred.method,
        "queries_per_s": round(pred.queries_per_s, 6),
        "queries_per_s_low": round(pred.queries_per_s_low, 6),
        "queries_per_s_high": round(pred.queries_per_s_high, 6),
        "step_s": round(pred.step.step_s, 6),
        # where the step goes: GPU work, and launch and host time the GPU work does not hide
        "gpu_s": round(pred.step.gpu_s, 6),
        "host_s": round(pred.step.exposed_host_s, 6),
        "optimizer_s": round(pred.step.class_s.get("optimizer", 0.0), 6),  # of gpu_s; sharded ranks split it
        "host_cpu": pred.host_cpu or "measured (GPU profile)",
        "run_queries": pred.run_queries or "",
        "extrapolation": str(pred.extrapolation).lower(),
        "extrapolation_reasons": "; ".join(pred.extrapolation_reasons),
        "interval_kinds": pred.interval_kinds,
        "estimator": "calibrated",
        "calibration_notes": notes,
    }


def _csv_text(rows: list[dict]) -> str:
    import csv
    import io

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(OUTPUT_COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


@cli_errors
def predict(
    input_csv: Annotated[Path | None, opt("--input", INPUT_HELP)] = None,
    model: JobModel = None,
    method: Annotated[str | None, opt("--method", METHOD_HELP)] = None,
    gpu: Annotated[str | None, opt("--gpu", "The catalog GPU of the one job.")] = None,
    batch_size: BatchSize = 1,
    seq_len: SeqLen = None,
    dataset: Annotated[str | None, opt("--dataset", "The one job's dataset (name).")] = None,
    config: ConfigFiles = None,
    calibrate: Annotated[list[Path] | None, opt("--calibrate", CALIBRATE_HELP)] = None,
    gpu_profile: Annotated[list[str] | None, opt("--gpu-profile", GPU_PROFILE_HELP)] = None,
    host_cpu: HostCpuOpt = None,
    output: Annotated[Path | None, opt("--output", "Write the predictions to this CSV (atomically).")] = None,
    run_queries: RunQueries = None,
    force: Force = False,
    steady_state: Annotated[bool, opt("--steady-state", "Predict steady-state throughput (long runs).")] = False,
    json_out: JsonOut = False,
) -> None:
    """Predict queries/s with a 95 % interval for every target, from one calibration; flag extrapolations.
    Throughput is that of runs as long as the calibration's measurements (1000 queries for the paper's), unless
    --run-queries or --steady-state says otherwise."""

    from tunecost.errors import TunecostError
    from tunecost.estimate.calibrated import calibrated_model
    from tunecost.outputs import check_output_path

    if run_queries is not None and steady_state:
        raise TunecostError("give --run-queries N or --steady-state, not both")
    inputs = (*((input_csv,) if input_csv else ()), *(calibrate or ()))
    if output is not None:
        check_output_path(output, force=force, inputs=inputs, option="--output")
    job = {"method": method, "batch_size": batch_size, "seq_len": seq_len, "dataset": dataset}
    given = [model, gpu, config, method, dataset, seq_len, batch_size if batch_size != 1 else None]
    if input_csv is not None and any(v is not None for v in given):
        raise TunecostError("give --input TARGETS.csv or one job (--model/--config with --gpu), not both")
    if input_csv is not None:
        targets = read_targets(input_csv, checked_host_cpu(host_cpu))
    else:
        targets = job_target(model, gpu, job, checked_host_cpu(host_cpu))
    calib = calibrated_model(list(calibrate or []) or None, gpu_terms=load_profiles(gpu_profile or []))
    if run_queries is None and not steady_state:
        run_queries = calib.run_queries  # like for like with the calibration's measurements
    where = input_csv or Path("--model")
    rows = [_row(p, "; ".join(calib.notes)) for p in _predict_all(calib, targets, where, run_queries)]
    if output is not None:
        atomic_write_text(output, _csv_text(rows))
    if json_out:
        print_json({"calibration": _summary(calib), "predictions": rows, "output": str(output) if output else None})
        return
    _print_predictions(rows, calib, run_queries, output)


def _summary(calib) -> dict:
    import math

    return {
        "calibration": calib.source,
        "num_points": calib.num_points,
        "in_sample_mape": calib.in_sample_mape,
        "params": calib.params.as_dict(),
        "run_overhead_s": calib.run_overhead_s,
        "interval": f"in-sample {100 * math.expm1(calib.interval_log_halfwidth):.1f} % (95 %, t on log residuals)"
        + (f"; {calib.evidence.note}" if calib.evidence else ""),
        "notes": list(calib.notes),
    }


def _print_predictions(rows: list[dict], calib, run_queries: int | None, output: Path | None) -> None:
    print_table(
        "Predicted throughput (estimator: calibrated)",
        ["model", "dataset", "gpu", "top-k", "batch", "queries/s [95 %]", "step s", "extrapolation"],
        [
            [
                r["model"],
                r["dataset"] or f"seq {r['seq_len']}",
                r["gpu"],
                r["experts_per_token"],
                r["batch_size"],
                f"{r['queries_per_s']:.3f} [{r['queries_per_s_low']:.3f}-{r['queries_per_s_high']:.3f}]",
                f"{r['step_s']:.3f}",
                "yes" if r["extrapolation"] == "true" else "no",
            ]
            for r in rows
        ],
        caption=f"calibrated on {calib.num_points} points of {calib.source}; in-sample MAPE "
        f"{100 * calib.in_sample_mape:.1f} %; "
        + ("steady state" if run_queries is None else f"runs of {run_queries} queries"),
    )
    for r in rows:
        if r["extrapolation_reasons"]:
            console.print(
                f"extrapolation ({r['model']}, {r['gpu']}, batch {r['batch_size']}): {r['extrapolation_reasons']}",
                highlight=False,
            )
    for note in calib.notes:
        console.print(f"note: {note}", highlight=False)
    if output is not None:
        console.print(f"wrote {len(rows)} predictions to {output}")


def register(app: typer.Typer) -> None:
    app.command("predict")(predict)
