"""`tunecost calibrate-gpu` through typer's CliRunner on CPU (--quick): writes a readable profile, keeps files."""

from __future__ import annotations

import json

from tunecost.cli.main import app
from tunecost.estimate.throughput.gpu_profile import load_gpu_profile
from tunecost.profile import gpu_bench


def test_quick_cpu_run_writes_a_readable_profile(cli_runner, tmp_path):
    out = tmp_path / "cpu-profile.json"
    result = cli_runner.invoke(app, ["calibrate-gpu", "--out", str(out), "--device", "cpu", "--quick", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["kind"] == "gpu_profile" and doc["device"]["kind"] == "cpu" and doc["quick"] is True
    terms = load_gpu_profile(out)
    assert terms.name == doc["name"] and terms.source.startswith("profile: cpu-profile.json measured ")
    assert terms.matmul_flops_per_s == doc["values"]["matmul_flops_per_s"]["value"] > 0
    assert "calibrate-gpu: square GEMM" in result.stderr  # progress on stderr, not in the JSON
    assert len(doc["gemms"]) == len(gpu_bench.BenchPlan.for_device("cpu", quick=True).rows)


def test_existing_out_is_refused_before_measuring_and_replaced_with_force(cli_runner, tmp_path, monkeypatch):
    out = tmp_path / "p.json"
    out.write_text("keep me", encoding="utf-8")
    calls = []
    real = gpu_bench.run_gpu_bench

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(gpu_bench, "run_gpu_bench", counted)
    refused = cli_runner.invoke(app, ["calibrate-gpu", "--out", str(out), "--device", "cpu", "--quick"])
    assert refused.exit_code == 2 and "already exists" in refused.stderr and "--force" in refused.stderr
    assert "Traceback" not in refused.output and out.read_text() == "keep me" and not calls
    forced = cli_runner.invoke(app, ["calibrate-gpu", "--out", str(out), "--device", "cpu", "--quick", "--force"])
    assert forced.exit_code == 0, forced.output
    assert calls and load_gpu_profile(out).memory_bytes_per_s > 0
    assert "matmul_flops_per_s" in forced.stdout  # the table


def test_cuda_without_a_gpu_is_one_line(cli_runner, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = cli_runner.invoke(app, ["calibrate-gpu", "--out", str(tmp_path / "p.json"), "--device", "cuda"])
    assert result.exit_code == 2 and result.stderr.startswith("error: --device cuda: no CUDA device")
    assert not (tmp_path / "p.json").exists()
