"""GPU-busy time per step: the interval union, the records' new fields, and the host/GPU split reader."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tunecost.errors import TunecostError
from tunecost.estimate.throughput.measured_split import read_measured_split
from tunecost.profile.gpu_busy import device_intervals_seconds, measure_gpu_busy, union_seconds
from tunecost.profile.model_setup import ModelSetup
from tunecost.profile.point import MeasureOptions
from tunecost.profile.point_rows import read_rows
from tunecost.profile.sweep import InputSpec, SweepSpec, run_sweep

MICRO_DIR = Path(__file__).parents[1] / "fixtures" / "profile" / "micro-mixtral"


def test_union_counts_overlaps_once_and_gaps_not_at_all():
    assert union_seconds([]) == 0.0
    assert union_seconds([(0.0, 1.0)]) == 1.0
    assert union_seconds([(0.0, 1.0), (0.5, 2.0)]) == 2.0  # overlap (two streams) counted once
    assert union_seconds([(0.0, 1.0), (3.0, 4.0)]) == 2.0  # the idle gap 1..3 is not busy
    assert union_seconds([(3.0, 4.0), (0.0, 1.0), (0.2, 0.4)]) == 2.0  # nested, unsorted
    assert union_seconds([(1.0, 1.0), (2.0, 1.5)]) == 0.0  # empty and reversed intervals carry no time


def _event(device, start_ns, duration_ns, annotation=False):
    return SimpleNamespace(
        device_type=lambda: f"DeviceType.{device}",
        start_ns=lambda: start_ns,
        duration_ns=lambda: duration_ns,
        is_user_annotation=lambda: annotation,
    )


def test_device_intervals_keep_device_work_only():
    events = [
        _event("CPU", 0, 10_000),  # a host op
        _event("CUDA", 1_000, 2_000),  # a kernel: 1 us .. 3 us
        _event("CUDA", 0, 50_000, annotation=True),  # a range marker on the GPU timeline, not work
        _event("CUDA", 5_000, 1_000),
    ]
    intervals = device_intervals_seconds(events)
    assert intervals == [(1e-6, 3e-6), (5e-6, 6e-6)]
    assert union_seconds(intervals) == pytest.approx(3e-6)


def test_not_measured_on_cpu():
    assert measure_gpu_busy(lambda: None, "cpu") is None


def _cpu_run(tmp_path):
    spec = SweepSpec(
        setup=ModelSetup(model=str(MICRO_DIR), method="lora", random_weights=True),
        experts_per_token=(1, 2),
        batch_sizes=(2,),
        inputs=InputSpec(seq_lens=(16,)),
        options=MeasureOptions(steps=3, warmup_steps=1, kernels=False, expert_load=False),
    )
    run_sweep(spec, tmp_path)
    return tmp_path


def test_cpu_profile_records_wall_step_and_null_gpu_busy(tmp_path):
    run = _cpu_run(tmp_path)
    rows = read_rows(run, "throughput")
    assert len(rows) == 2
    steps = {r["point_id"]: r for r in read_rows(run, "stages") if r["stage"] == "step"}
    for row in rows:
        assert row["gpu_busy_step_seconds"] is None and row["gpu_busy_method"] is None
        # the median plain step: the same per-step wall times the `step` stage row lists
        assert row["wall_step_seconds"] == pytest.approx(statistics.median(steps[row["point_id"]]["per_step_seconds"]))
    split = read_measured_split(run)
    assert [(s.experts_per_token, s.batch_size) for s in split] == [(1, 2), (2, 2)]
    for s, row in zip(split, rows, strict=True):
        assert s.device == "cpu" and s.gpu  # the CPU's name from meta.json
        assert s.wall_step_seconds == row["wall_step_seconds"] > 0
        assert s.gpu_busy_step_seconds is None and s.host_step_seconds is None
        assert s.method == "lora" and s.seq_len == 16
        assert s.key == (s.model, "lora", s.experts_per_token, 2, s.gpu)


def test_reader_uses_mean_step_for_older_records_and_rejects_bad_values(tmp_path):
    import json

    run = _cpu_run(tmp_path)
    path = run / "throughput.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for r in rows:
        r.pop("wall_step_seconds")
        r.pop("gpu_busy_step_seconds")
    rows[1]["gpu_busy_step_seconds"] = 0.5 * rows[1]["seconds"] / rows[1]["steps"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    split = read_measured_split(run)
    assert split[0].wall_step_seconds == pytest.approx(rows[0]["seconds"] / rows[0]["steps"])
    assert split[1].host_step_seconds == pytest.approx(0.5 * rows[1]["seconds"] / rows[1]["steps"])
    rows[0]["gpu_busy_step_seconds"] = -1.0
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TunecostError, match="gpu_busy_step_seconds"):
        read_measured_split(run)


def test_reader_errors_name_the_folder(tmp_path):
    with pytest.raises(TunecostError, match="not found"):
        read_measured_split(tmp_path / "none")
    with pytest.raises(TunecostError, match="throughput.jsonl"):
        read_measured_split(tmp_path)


@pytest.mark.gpu
def test_cuda_busy_time_excludes_host_gaps():
    import torch

    a = torch.randn(2048, 2048, device="cuda")

    def step():
        a @ a
        torch.cuda.synchronize()
        time.sleep(0.05)  # the host works, the device idles
        a @ a

    busy = measure_gpu_busy(step, "cuda", steps=3)
    assert busy is not None and busy.num_activities >= 2
    assert 0 < busy.busy_seconds < 0.05  # two 2048^3 fp32 GEMMs take milliseconds, not the 50 ms gap


@pytest.mark.gpu
def test_cuda_profile_records_gpu_busy(tmp_path):
    spec = SweepSpec(
        setup=ModelSetup(model=str(MICRO_DIR), method="lora", random_weights=True, device="cuda"),
        experts_per_token=(2,),
        batch_sizes=(2,),
        inputs=InputSpec(seq_lens=(16,)),
        options=MeasureOptions(steps=3, warmup_steps=1, kernels=False, expert_load=False),
    )
    run_sweep(spec, tmp_path)
    (s,) = read_measured_split(tmp_path)
    assert s.device == "cuda" and s.gpu_busy_step_seconds is not None
    assert 0 < s.gpu_busy_step_seconds <= 1.5 * s.wall_step_seconds
    assert s.host_step_seconds is not None
