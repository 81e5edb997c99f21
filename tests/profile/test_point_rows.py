"""Record rows and the `tunecost profile` command (tunecost.profile.point_rows, cli/commands/profile.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunecost.profile.expert_load import ExpertLoad
from tunecost.profile.kernel_breakdown import KernelBreakdown, KernelClassTime
from tunecost.profile.layers import LayerTimes
from tunecost.profile.loop import StepResult
from tunecost.profile.memory import PeakMemory
from tunecost.profile.point import PointMeasurement, Workload
from tunecost.profile.point_rows import (
    KINDS,
    finished_points,
    point_rows,
    purge_unfinished,
    read_rows,
    summary,
    write_point,
)
from tunecost.profile.timers import StepTimes
from tunecost.results.schema import point_id

MICRO_DIR = Path(__file__).parents[1] / "fixtures" / "profile" / "micro-mixtral"


def _measurement(batch_size: int = 2, status: str = "done") -> PointMeasurement:
    w = Workload(
        model="m",
        method="qlora",
        experts_impl="qlora-linear4bit",
        experts_per_token=2,
        batch_size=batch_size,
        seq_len=128,
        dataset=None,
        device="cpu",
    )

    def step(f, b, o, wall, layers=None):
        return StepResult(
            times=StepTimes(forward_seconds=f, backward_seconds=b, optimizer_seconds=o, step_seconds=wall),
            wall_seconds=wall,
            loss=None,
            layers=layers,
        )

    layers = LayerTimes(
        seconds={
            ("forward", 0, "moe_experts"): 0.6,
            ("forward", 0, "attention"): 0.3,
            ("backward", 0, "moe_experts"): 1.0,
            ("recompute", 0, "moe_experts"): 0.5,
            ("forward", None, "embedding"): 0.05,
        },
        num_model_calls=1,
    )
    return PointMeasurement(
        workload=w,
        status=status,
        plain=[step(1.0, 2.0, 0.1, 3.2), step(1.1, 2.1, 0.1, 3.4), step(0.9, 1.9, 0.1, 3.0)],
        instrumented=[step(1.0, 2.0, 0.1, 3.3, layers)] * 3,
        layers=layers,
        layers_step=StepTimes(forward_seconds=1.0, backward_seconds=2.0, optimizer_seconds=0.1, step_seconds=3.3),
        num_queries=6,
        num_tokens=768,
        padded_tokens=768,
        memory=PeakMemory(peak_bytes=10 * 2**20, source="measured-cpu", detail={}),
        kernels=KernelBreakdown(
            classes=(KernelClassTime(kernel_class="matmul_w2_down", seconds=0.2, count=8),),
            source="torch.profiler",
            timing="cpu-self-time",
            profiled_seconds=5.0,
        ),
        load_before=ExpertLoad(tokens={0: [100, 150, 6, 0]}),
        load_after=ExpertLoad(tokens={0: [64, 64, 64, 64]}),
        elapsed_seconds=20.0,
    )


def test_point_rows_follow_the_record_format():
    rows = point_rows(_measurement())
    assert set(rows) == {*KINDS, "point"}
    for kind, kind_rows in rows.items():
        for r in kind_rows:
            assert r["schema_version"] == 1 and r["kind"] == kind
            assert r["point_id"] == point_id(
                {
                    k: r[k]
                    for k in (
                        "model",
                        "method",
                        "experts_impl",
                        "experts_per_token",
                        "batch_size",
                        "seq_len",
                        "dataset",
                        "device",
                    )
                }
            )
    thr = rows["throughput"][0]
    assert thr["queries_per_s"] == pytest.approx(6 / 9.6) and thr["tokens_per_s"] == pytest.approx(768 / 9.6)
    stages = {r["stage"]: r for r in rows["stages"]}
    assert stages["step"]["seconds"] == 3.2 and stages["forward"]["seconds"] == 1.0  # the median step's
    assert stages["forward"]["median_seconds"] == 1.0 and stages["step"]["per_step_seconds"] == [3.2, 3.4, 3.0]
    over = {r["instrumentation"]: r for r in rows["overhead"]}
    assert over["layer-hooks"]["ratio"] == pytest.approx(9.9 / 9.6)
    assert over["torch.profiler"]["ratio"] == pytest.approx(5.0 / 3.2)
    assert {(r["phase"], r["expert"]) for r in rows["expert_load"]} == {
        (p, e) for p in ("before", "after") for e in range(4)
    }
    assert next(r["component"] for r in rows["layers"] if r["pass"] == "forward") == "embedding"
    assert all(r["step_pass_seconds"] == (1.0 if r["pass"] == "forward" else 2.0) for r in rows["layers"])


def test_every_row_carries_the_number_of_experts():
    """What "dense" (top-k == number of experts) is read from; absent when the sweep does not know it."""
    rows = point_rows(_measurement(), extra={"num_experts": 4})
    assert all(r["num_experts"] == 4 for kind_rows in rows.values() for r in kind_rows)
    assert all("num_experts" not in r for kind_rows in point_rows(_measurement()).values() for r in kind_rows)


def test_oom_point_has_only_its_completion_row():
    rows = point_rows(_measurement(status="oom"))
    assert len(rows["point"]) == 1 and rows["point"][0]["status"] == "oom"
    assert all(not rows[k] for k in KINDS)


def test_write_purge_and_summary(tmp_path):
    write_point(tmp_path, _measurement(2))
    partial = point_rows(_measurement(4))  # a point killed after its throughput row
    with open(tmp_path / "throughput.jsonl", "a") as fh:
        fh.write(json.dumps(partial["throughput"][0]) + "\n")
    assert len(finished_points(tmp_path)) == 1
    assert purge_unfinished(tmp_path) == 1
    assert [r["batch_size"] for r in read_rows(tmp_path, "throughput")] == [2]
    (row,) = summary(tmp_path)
    assert row["queries_per_s"] == pytest.approx(6 / 9.6) and row["step_seconds"] == 3.2
    assert row["moe_share"] == pytest.approx(2.1 / 2.45)
    assert row["load_variance_after"] == 0 and row["load_variance_before"] > 0
    assert row["overhead_ratio"] == pytest.approx(9.9 / 9.6) and row["peak_bytes"] == 10 * 2**20


def _profile_args(out: Path, *extra: str, steps: str = "1") -> list[str]:
    return [
        "profile",
        "--model",
        str(MICRO_DIR),
        "--random-weights",
        "--method",
        "lora",
        "--experts-per-token",
        "1,4",
        "--batch-sizes",
        "1",
        "--seq-len",
        "16",
        "--steps",
        steps,
        "--warmup-steps",
        "0",
        "--no-kernels",
        "--no-instrumentation-overhead",
        "--device",
        "cpu",
        "--out",
        str(out),
        *extra,
    ]


def test_cli_profile_writes_records_and_prints_the_table(cli_runner, tmp_path):
    from tunecost.cli.main import app

    result = cli_runner.invoke(app, _profile_args(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "lora (peft-fused) on cpu" in text and "measured 2 point(s)" in text and str(tmp_path / "run") in text
    assert len(read_rows(tmp_path / "run", "point")) == 2
    again = cli_runner.invoke(app, [*_profile_args(tmp_path / "run"), "--json"])
    data = json.loads(again.stdout)
    assert data["measured"] == [] and len(data["skipped"]) == 2 and len(data["points"]) == 2


def test_cli_profile_bad_input_is_one_clear_line(cli_error, tmp_path):
    assert "unknown model" in cli_error(["profile", "--model", "mixtral-9x9b", "--out", str(tmp_path / "a")])
    assert "--steps must be at least 1" in cli_error(_profile_args(tmp_path / "b", steps="0"))
    assert "bad batch size" in cli_error(["profile", "--batch-sizes", "1,x", "--out", str(tmp_path / "c")])
    data = tmp_path / "two.jsonl"
    data.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "c", "output": "d"}\n')
    line = cli_error(
        [
            "profile",
            "--model",
            "tiny-mixtral",
            "--method",
            "lora",
            "--dataset",
            str(data),
            "--batch-sizes",
            "2",
            "--steps",
            "3",
            "--out",
            str(tmp_path / "d"),
            "--device",
            "cpu",
        ]
    )
    assert "has 2 queries, but 3 steps at batch size 2 need 6" in line


def test_cli_profile_interrupt_keeps_finished_points(cli_runner, tmp_path, monkeypatch):
    from tunecost.cli.main import app
    from tunecost.profile import sweep

    real = sweep.measure_point
    calls = []

    def interrupt_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep, "measure_point", interrupt_second)
    result = cli_runner.invoke(app, _profile_args(tmp_path / "run"))
    assert result.exit_code == 130
    assert "1 finished point(s) are kept" in " ".join(result.stderr.split())
    assert "rerun the same command to resume" in " ".join(result.stderr.split())
    assert len(read_rows(tmp_path / "run", "point")) == 1


def _files_and_lines(out: Path) -> list[tuple[str, int]]:
    return [
        (path.name, i)
        for path in sorted(out.glob("*.jsonl"))
        for i, _ in enumerate(path.read_text(encoding="utf-8").splitlines())
    ]


@pytest.mark.parametrize("damage", ["cut", "delete"])
def test_damaging_any_line_of_a_finished_point_reruns_that_point_only(tmp_path, damage):
    import warnings

    reference = tmp_path / "reference"
    for batch in (2, 4):
        write_point(reference, _measurement(batch))
    user_row = {"note": "a row of the user's own"}
    with open(reference / "throughput.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(user_row) + "\n")
    ids = {p["batch_size"]: pid for pid, p in finished_points(reference).items()}
    assert len(ids) == 2
    cases = _files_and_lines(reference)
    assert len(cases) > 20  # every line of every file, both points
    for name, index in cases:
        out = tmp_path / f"{name}-{index}"
        out.mkdir()
        for path in reference.iterdir():
            (out / path.name).write_bytes(path.read_bytes())
        lines = (out / name).read_text(encoding="utf-8").splitlines(keepends=True)
        line = lines[index]
        if "point_id" not in line:
            continue  # the user's own row: not a point's record
        hit = json.loads(line)["point_id"]
        lines[index] = line[: len(line) // 2] + "\n" if damage == "cut" else ""
        (out / name).write_text("".join(lines), encoding="utf-8")
        with warnings.catch_warnings(record=True) as first:
            warnings.simplefilter("always")
            purge_unfinished(out)
        assert set(finished_points(out)) == set(ids.values()) - {hit}, (name, index)
        kept = [r for r in read_rows(out, "throughput") if "point_id" in r]
        assert {r["point_id"] for r in kept} <= set(ids.values()) - {hit}
        assert user_row in read_rows(out, "throughput")  # never deleted
        for other in set(ids.values()) - {hit}:  # the other point is untouched, row for row
            for kind in (*KINDS, "point"):
                assert [r for r in read_rows(out, kind) if r.get("point_id") == other] == [
                    r for r in read_rows(reference, kind) if r.get("point_id") == other
                ]
        with warnings.catch_warnings(record=True) as again:  # the damage was reported once, not forever
            warnings.simplefilter("always")
            purge_unfinished(out)
            finished_points(out)
        assert len(first) == (1 if damage == "cut" else 0) and again == [], (name, index)
