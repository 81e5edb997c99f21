from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from tunecost.errors import TunecostError
from tunecost.io import read_jsonl
from tunecost.results.schema import record_path
from tunecost.train.trainability import STATE_FILE, TrainabilityJob, run_trainability
from tunecost.workload.job import FineTuneJob

TINY_JOB = FineTuneJob(model="tiny-mixtral", method="full", dataset="synthetic-arith", seq_len=None, batch_size=16)
FAST = dict(job=TINY_JOB, epochs=2, num_train=32, num_eval=4, max_new_tokens=8)
ROW_KEYS = {
    "schema_version",
    "kind",
    "model",
    "method",
    "routing",
    "experts_per_token",
    "num_experts",
    "epoch",
    "accuracy",
    "train_loss",
    "num_eval",
    "seconds",
    "eval_seconds",
    "dataset",
    "tokenizer",
    "template",
    "point_id",
    "device",
    "batch_size",
}


def test_rows_written_and_rerun_skips_everything(tmp_path):
    job = TrainabilityJob(**FAST)
    rows = run_trainability(job, tmp_path)
    assert [(r["routing"], r["experts_per_token"], r["epoch"]) for r in rows] == [
        ("sparse", 2, 0),
        ("sparse", 2, 1),
        ("sparse", 2, 2),
        ("dense", 8, 0),
        ("dense", 8, 1),
        ("dense", 8, 2),
    ]
    for row in rows:
        assert set(row) >= ROW_KEYS and row["kind"] == "trainability" and row["num_eval"] == 4
        assert 0.0 <= row["accuracy"] <= 1.0 and "mistral" in row["tokenizer"]
    assert rows[0]["train_loss"] is None and rows[1]["train_loss"] > 0
    for run in ("sparse-k2", "dense-k8"):
        final = tmp_path / run / "final"
        assert (final / "config.json").is_file() and (final / "tunecost_tokenizer.json").is_file()
        assert not (tmp_path / run / STATE_FILE).exists()  # only the final model is kept by default
        assert not (tmp_path / run / "epoch-1").exists()
    calls = []
    again = run_trainability(job, tmp_path, on_progress=lambda *a: calls.append(a))
    assert again == rows and calls == []  # nothing retrained
    assert len(read_jsonl(record_path(tmp_path, "trainability"))) == 6


def test_resume_after_interruption_skips_finished_epochs(tmp_path):
    job = TrainabilityJob(**{**FAST, "experts_per_token": (2,)})
    labels: list[str] = []

    def stop_in_epoch_2(done: int, total: int, label: str) -> None:
        labels.append(label)
        if "epoch 2/" in label:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_trainability(job, tmp_path, on_progress=stop_in_epoch_2)
    assert [r["epoch"] for r in read_jsonl(record_path(tmp_path, "trainability"))] == [0, 1]
    assert (tmp_path / "sparse-k2" / STATE_FILE).is_file()
    labels.clear()
    rows = run_trainability(job, tmp_path, on_progress=lambda d, t, label: labels.append(label))
    assert [r["epoch"] for r in rows] == [0, 1, 2]
    assert labels and all("epoch 2/2" in label for label in labels)  # epoch 1 was not trained again


def test_save_every_epoch_and_eval_cli_reads_the_checkpoint(tmp_path):
    from tunecost.cli.main import app

    job = TrainabilityJob(**{**FAST, "epochs": 1, "experts_per_token": (2,), "save_every_epoch": True})
    run_trainability(job, tmp_path)
    checkpoint = tmp_path / "sparse-k2" / "epoch-1"
    assert (checkpoint / "config.json").is_file()
    marker = json.loads((checkpoint / "tunecost_tokenizer.json").read_text())
    assert marker["tokenizer"] == "mistral" and marker["template"] == "mistral" and marker["subset_base_ids"]
    options = ["--dataset", "synthetic-arith-test", "--limit", "3", "--max-new-tokens", "4", "--json"]
    result = CliRunner().invoke(app, ["eval", "--model", str(checkpoint), *options])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["num_eval"] == 3 and "subset" in payload["tokenizer"] and payload["template"] == "mistral"


def test_job_validation():
    with pytest.raises(TunecostError):
        TrainabilityJob(epochs=0)
    with pytest.raises(TunecostError):
        TrainabilityJob(experts_per_token=())
    with pytest.raises(TunecostError, match="evaluation dataset"):
        TrainabilityJob(job=TINY_JOB.with_(dataset="math_14k"))
    with pytest.raises(TunecostError, match="fully fine-tunes on a dataset; got method lora"):
        TrainabilityJob(job=TINY_JOB.with_(method="lora"))
    with pytest.raises(TunecostError, match="learning rate must be positive"):
        TrainabilityJob(lr=0.0)
    with pytest.raises(TunecostError):
        TrainabilityJob(vocab="small")
    assert TrainabilityJob().run_key(2) != TrainabilityJob().run_key(8)
    assert TrainabilityJob().run_key(2) != TrainabilityJob(lr=1e-3).run_key(2)


def test_cli_trainability_json(tmp_path):
    from tunecost.cli.main import app

    options = ["--epochs", "1", "--num-train", "16", "--num-eval", "2", "--experts-per-token", "2", "--json"]
    result = CliRunner().invoke(app, ["trainability", "--out", str(tmp_path), *options])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["epoch"] for r in rows] == [0, 1] and rows[0]["routing"] == "sparse"
    bad = CliRunner().invoke(app, ["trainability", "--out", str(tmp_path), "--experts-per-token", "2,x"])
    assert bad.exit_code == 2


@pytest.mark.slow
@pytest.mark.long  # the full 10-epoch experiment, minutes on 2 cores: CI runs it (.ci/run)
def test_tiny_moe_learns_the_embedded_task_dense_and_sparse(tmp_path):
    """Near-chance -> >= 80 % within 10 epochs for top-2 and dense, on CPU."""
    start = time.perf_counter()
    rows = run_trainability(TrainabilityJob(), tmp_path)
    seconds = time.perf_counter() - start
    for routing in ("sparse", "dense"):
        curve = {r["epoch"]: r["accuracy"] for r in rows if r["routing"] == routing}
        assert sorted(curve) == list(range(11))
        assert curve[0] <= 0.2, curve  # near chance before fine-tuning
        assert max(curve.values()) >= 0.8, curve
    print(f"trainability wall time {seconds:.0f} s")
