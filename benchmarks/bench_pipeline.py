"""Pipeline stages of a tiny Llama (2 ranks, 4 micro-batches of one 64-token sequence; 2 layers, or 4 layers as 4
stages, 2 per rank, for interleaved 1F1B): each rank's peak simulated on fake tensors in a fake process group,
measured on 2 real gloo ranks (both with torch's own `PipelineStage` and schedule), and estimated by
`model_parallel.stage_step` (what `estimate` uses); the point-to-point transfers; the schedules' bubble and
in-flight counts from the formulas and from torch's own action order. About two minutes on 2 cores.

Run: PYTHONPATH=src .venv/bin/python benchmarks/bench_pipeline.py
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from tunecost.distributed.pipeline import (
    bubble_fraction,
    bubble_from_order,
    in_flight_from_order,
    in_flight_micro_batches,
    schedule_order,
)
from tunecost.distributed.pipeline_step import measure_stages, simulate_stage
from tunecost.distributed.single_step import trace_single_gpu_step

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "distributed"))
from tiny_jobs import pipeline_job, stage_estimate

NUM_STAGES, MICRO_BATCHES = 2, 4
LAYOUTS = [("1f1b", "tiny-llama-2l", 1), ("gpipe", "tiny-llama-2l", 1), ("interleaved-1f1b", "tiny-llama-4l", 2)]


def _pct(a: int, b: int) -> str:
    return f"{100.0 * (a - b) / b:+.1f} %"


def _cats(breakdown: dict[str, int]) -> str:
    keys = ("activations", "temporaries", "gradients")
    return " / ".join(f"{breakdown.get(k, 0) / 1024:.0f}" for k in keys)


def stages_table() -> None:
    print(
        "| schedule | v | rank | measured peak (gloo) | simulated (fake PG) | sim - meas | estimate (stage_step) "
        "| est - meas | act / temp / grad KiB at the peak: meas; est | sends = recvs (n, bytes) |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---|---|")
    for schedule, config, v in LAYOUTS:
        job = pipeline_job(config=config)
        micro = trace_single_gpu_step(dataclasses.replace(job, batch_size=job.batch_size // MICRO_BATCHES), 1)
        kwargs = {"num_stages": NUM_STAGES, "schedule": schedule, "micro_batches": MICRO_BATCHES, "virtual_stages": v}
        for meas in measure_stages(job, **kwargs):
            sim = simulate_stage(job, stage=meas.stage, granule_bytes=1, **kwargs)
            est = stage_estimate(
                micro, job, stages=NUM_STAGES, micro_batches=MICRO_BATCHES, schedule=schedule, stage=meas.stage, v=v
            )
            assert sim.p2p_totals() == meas.p2p_totals()
            print(
                f"| {schedule} | {v} | {meas.stage} | {meas.peak_bytes:,} | {sim.peak_bytes:,} "
                f"| {_pct(sim.peak_bytes, meas.peak_bytes)} | {est.peak_bytes:,} "
                f"| {_pct(est.peak_bytes, meas.peak_bytes)} "
                f"| {_cats(meas.breakdown_bytes)}; {_cats(est.breakdown_bytes)} | {meas.p2p_totals()['send']} |"
            )


def schedules_table() -> None:
    print(
        "| schedule | pp | m | v | bubble formula | bubble from torch's order | in flight per rank (formula) "
        "| in flight per rank (torch's order) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for schedule, pp, m, v in [
        ("gpipe", 4, 8, 1),
        ("1f1b", 4, 8, 1),
        ("1f1b", 2, 4, 1),
        ("interleaved-1f1b", 4, 8, 2),
        ("interleaved-1f1b", 4, 16, 3),
    ]:
        order = schedule_order(schedule, pp, m, v)
        formula = [in_flight_micro_batches(schedule, pp, m, r, v) for r in range(pp)]
        counted = [in_flight_from_order(order, r) for r in range(pp)]
        print(
            f"| {schedule} | {pp} | {m} | {v} | {bubble_fraction(schedule, pp, m, v):.4f} "
            f"| {bubble_from_order(order):.4f} | {formula} | {counted} |"
        )


if __name__ == "__main__":
    schedules_table()
    print()
    stages_table()
