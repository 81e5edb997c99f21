"""The embedded demo (tunecost.demo) end to end, shrunk: every stage runs for real on fewer points."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunecost import demo
from tunecost.report.figures import SECTIONS

pytestmark = pytest.mark.slow  # started first on the test workers (tests/conftest.py)


@pytest.fixture(scope="module")
def simulator_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")  # cold at the first test, shared by this module's tests


@pytest.fixture
def small_demo(monkeypatch, tmp_path: Path, simulator_cache: Path):
    from tunecost.train.trainability import TrainabilityJob

    monkeypatch.setenv("TUNECOST_CACHE_DIR", str(simulator_cache))
    monkeypatch.setattr(demo, "PROFILE_BATCH_SIZES", (2,))
    monkeypatch.setattr(demo, "MAX_BATCH_MEMORY_GB", (48,))
    monkeypatch.setattr(demo, "DEMO_GPUS", ("A40-48GB", "H100-80GB-SXM"))
    monkeypatch.setattr(demo, "MULTI_GPU_DEMO", ("mixtral-8x7b", "lora", ("H100-80GB-SXM",), ("ddp", "fsdp2"), 4))
    monkeypatch.setattr(demo, "trainability_job", lambda: TrainabilityJob(epochs=1, num_train=64, num_eval=8))
    return tmp_path / "run"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.long  # every stage end to end, minutes on 2 cores even shrunk: CI runs it (.ci/run)
def test_demo_writes_every_record_and_the_report(small_demo: Path) -> None:
    stages_seen = []
    seconds = demo.run_demo(small_demo, on_stage=lambda s: stages_seen.append(s.name))
    assert stages_seen == [s.name for s in demo.STAGES] == list(seconds)
    html = (small_demo / "report.html").read_text(encoding="utf-8")
    for section in SECTIONS:
        if section.key in ("counters", "plan"):  # Nsight Compute needs a GPU; the demo runs no plan
            assert f"no `{section.key}.jsonl` records" in html
            continue
        assert f"id='{section.key}'" in html, section.key
        assert (small_demo / "figures" / f"{section.key}.png").is_file(), section.key
    assert html.count("Omitted:") == 2  # counters and plan only
    # Records of both tiny architectures, dense and sparse, on the embedded dataset.
    for model in ("tiny-mixtral", "tiny-blackmamba"):
        tp = _rows(small_demo / f"profile-{model}" / "throughput.jsonl")
        assert {r["experts_per_token"] for r in tp} == {2, 8}
        assert all(r["dataset"] == demo.DEMO_DATASET and r["queries_per_s"] > 0 for r in tp)
    meta = json.loads((small_demo / "meta.json").read_text(encoding="utf-8"))
    assert meta["tool"] == "tunecost" and meta["device"]["kind"] == "cpu"


@pytest.mark.long  # a Mixtral batch search per GPU: CI runs it
def test_max_batch_rows_are_eq1_and_the_simulator(small_demo: Path) -> None:
    from tunecost.estimate.paper import EQ1_COEFFICIENTS, max_batch_size_eq1, sparsity_fraction
    from tunecost.simulate import max_batch_size
    from tunecost.units import BYTES_PER_GIB
    from tunecost.workload.job import FineTuneJob

    small_demo.mkdir(parents=True)
    demo._stage_max_batch(small_demo, None)
    rows = _rows(small_demo / "max_batch.jsonl")
    eq1 = next(r for r in rows if r["model"] == "mixtral-8x7b" and r["experts_per_token"] == 2 and r["source"] == "eq1")
    c = EQ1_COEFFICIENTS[("mixtral-8x7b", "artifact")]
    assert eq1["max_batch_size"] == max_batch_size_eq1(
        gpu_memory_gb=48,
        model_memory_gb=c.model_memory_gb,
        seq_len_tokens=512,
        sparsity=sparsity_fraction(2, 8),
        c0=c.c0,
        c1=c.c1,
    )
    sim = next(
        r
        for r in rows
        if r["model"] == "blackmamba-2.8b" and r["experts_per_token"] == 8 and r["source"] == "simulated"
    )
    job = FineTuneJob(
        model="blackmamba-2.8b", method="full", experts_per_token=8, seq_len=512, gradient_checkpointing=False
    )
    assert sim["max_batch_size"] == max_batch_size(job.with_(stack="tunecost"), 48 * BYTES_PER_GIB).batch_size > 0
    assert {r["estimator"] for r in rows if r["model"] == "mixtral-8x7b"} == {
        "paper eq. (1)",
        "simulator, hf-2024 stack, checkpointing off",
        "simulator, tunecost stack, checkpointing on",
    }
