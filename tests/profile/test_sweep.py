"""Resumable sweeps (tunecost.profile.sweep): every record written, interrupted sweeps resume, OOM is a result."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tunecost.errors import TunecostError
from tunecost.profile import point as point_module
from tunecost.profile.model_setup import ModelSetup
from tunecost.profile.point import MeasureOptions
from tunecost.profile.point_rows import KINDS, read_rows
from tunecost.profile.sweep import InputSpec, SweepSpec, run_sweep

MICRO_DIR = Path(__file__).parents[1] / "fixtures" / "profile" / "micro-mixtral"
WORKLOAD_KEYS = ("model", "method", "experts_per_token", "batch_size", "seq_len", "dataset", "device", "point_id")


def _spec(method="lora", ks=(1, 2), batch_sizes=(1, 2), seq_lens=(32,), **options) -> SweepSpec:
    opts = {"steps": 2, "warmup_steps": 1, **options}
    return SweepSpec(
        setup=ModelSetup(model=str(MICRO_DIR), method=method, random_weights=True),
        experts_per_token=ks,
        batch_sizes=batch_sizes,
        inputs=InputSpec(seq_lens=seq_lens),
        options=MeasureOptions(**opts),
    )


def test_sweep_writes_every_record_kind(tmp_path):
    result = run_sweep(_spec("qlora", ks=(1, 4), batch_sizes=(2,)), tmp_path)
    assert len(result.points) == 2 and len(result.measured) == 2 and not result.skipped
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert len(meta["workloads"]) == 2 and meta["versions"]["torch"]
    for kind in KINDS:
        rows = read_rows(tmp_path, kind)
        assert rows, kind
        for row in rows:
            assert row["schema_version"] == 1 and all(k in row for k in WORKLOAD_KEYS), (kind, row)
    thr = read_rows(tmp_path, "throughput")
    assert all(r["queries_per_s"] > 0 and r["tokens_per_s"] == pytest.approx(32 * r["queries_per_s"]) for r in thr)
    assert {r["stage"] for r in read_rows(tmp_path, "stages")} == {"forward", "backward", "optimizer", "step"}
    for r in read_rows(tmp_path, "stages"):
        if r["stage"] == "step":
            parts = [
                s["seconds"]
                for s in read_rows(tmp_path, "stages")
                if s["point_id"] == r["point_id"] and s["stage"] != "step"
            ]
            assert sum(parts) == pytest.approx(r["seconds"], rel=0.05)
    layers = read_rows(tmp_path, "layers")
    assert {r["pass"] for r in layers} == {"forward", "backward", "recompute"}  # checkpointing is on
    loads = read_rows(tmp_path, "expert_load")
    assert {r["phase"] for r in loads} == {"before", "after"} and {r["layer_index"] for r in loads} == {0, 1}
    for r in thr:  # tokens per expert add up to top-k x tokens, per layer
        per_layer = sum(
            x["tokens"]
            for x in loads
            if x["point_id"] == r["point_id"] and x["phase"] == "before" and x["layer_index"] == 0
        )
        assert per_layer == r["experts_per_token"] * r["num_tokens"]
    classes = {r["kernel_class"] for r in read_rows(tmp_path, "kernels")}
    assert {"lora", "dequantize", "topk", "softmax", "router", "elementwise"} <= classes
    assert classes & {"matmul_w1_gate", "matmul_w3_up", "matmul_w2_down"}
    assert {r["instrumentation"] for r in read_rows(tmp_path, "overhead")} == {"layer-hooks", "torch.profiler"}
    assert all(r["peak_bytes"] > 0 and r["source"] == "measured-cpu" for r in read_rows(tmp_path, "memory"))
    assert len(result.table) == 2 and all(r["status"] == "done" and r["queries_per_s"] for r in result.table)


def test_interrupted_sweep_resumes_without_redoing_points(tmp_path):
    spec = _spec(kernels=False, expert_load=False, instrumentation_overhead=False, steps=1, warmup_steps=0)
    seen = []

    def stop_after_two(m):
        seen.append(m.workload.point_id)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, tmp_path, on_point=stop_after_two)
    assert len({r["point_id"] for r in read_rows(tmp_path, "point")}) == 2
    # a kill between two files leaves rows of an unfinished point: they are dropped on resume
    torn = dict(read_rows(tmp_path, "throughput")[0], point_id="unfinished|point")
    with open(tmp_path / "throughput.jsonl", "a") as fh:
        fh.write(json.dumps(torn) + "\n" + '{"torn": ')
    result = run_sweep(spec, tmp_path)
    assert set(result.skipped) == set(seen) and len(result.measured) == 2
    assert not set(result.measured) & set(seen)  # finished points are not recomputed
    for kind in ("point", "throughput", "stages", "layers"):
        ids = [r["point_id"] for r in read_rows(tmp_path, kind)]
        assert set(ids) == {p.point_id for p in result.points}, kind  # complete, and nothing else
    assert len(read_rows(tmp_path, "point")) == 4 and len(read_rows(tmp_path, "throughput")) == 4
    assert len(result.table) == 4
    again = run_sweep(spec, tmp_path)  # everything finished: nothing is built or measured
    assert not again.measured and len(again.skipped) == 4
    longer = _spec(kernels=False, expert_load=False, instrumentation_overhead=False, steps=2, warmup_steps=0)
    with pytest.raises(TunecostError, match="measured with steps 1 \\(now 2\\); resume with the same settings"):
        run_sweep(longer, tmp_path)  # points of 1 step and of 2 would be one table
    cut = dataclasses.replace(spec, setup=dataclasses.replace(spec.setup, num_layers=1))
    with pytest.raises(TunecostError, match="measured with num_layers None \\(now 1\\)"):
        run_sweep(cut, tmp_path)  # the whole model's points are not the cut-down model's
    deeper = dataclasses.replace(spec, setup=dataclasses.replace(spec.setup, num_layers=99))
    with pytest.raises(TunecostError, match="--num-layers 99: .* has \\d+ decoder layers"):
        run_sweep(deeper, tmp_path / "other")
    assert len(read_rows(tmp_path, "throughput")) == 4


def test_out_of_memory_point_is_a_recorded_boundary(tmp_path, monkeypatch):
    import torch

    real = point_module.train_step

    def oom_above_one(model, optimizer, batch, clock, **kw):
        if batch.batch_size > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, optimizer, batch, clock, **kw)

    monkeypatch.setattr(point_module, "train_step", oom_above_one)
    spec = _spec(ks=(2,), batch_sizes=(1, 2), kernels=False, steps=1, warmup_steps=0)
    result = run_sweep(spec, tmp_path)
    assert len(result.oom) == 1 and "batch_size=2" in result.oom[0]
    status = {r["batch_size"]: r for r in read_rows(tmp_path, "point")}
    assert status[1]["status"] == "done" and status[2]["status"] == "oom"
    assert "out of memory at batch size 2" in status[2]["message"]
    assert [r["batch_size"] for r in read_rows(tmp_path, "throughput")] == [1]  # measured rows kept
    monkeypatch.setattr(point_module, "train_step", real)
    assert not run_sweep(spec, tmp_path).measured  # an OOM point is finished (a boundary), not retried


def test_dataset_too_small_is_an_error_before_measuring(tmp_path):
    data = tmp_path / "tiny.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"q{i}", "output": "a"}) + "\n" for i in range(3)))
    spec = SweepSpec(
        setup=ModelSetup(model="tiny-mixtral", method="lora"),
        batch_sizes=(2,),
        inputs=InputSpec(dataset=str(data), tokenizer="mistral"),
        options=MeasureOptions(steps=2),
    )
    with pytest.raises(TunecostError, match="has 3 queries, but 2 steps at batch size 2 need 4"):
        run_sweep(spec, tmp_path / "run")
    assert not (tmp_path / "run" / "points.jsonl").exists()


def test_second_writer_to_the_same_folder_is_refused(tmp_path):
    import fcntl

    with open(tmp_path / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(TunecostError, match="another tunecost profile is writing"):
            run_sweep(_spec(), tmp_path)
