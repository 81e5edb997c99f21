"""Estimates a user can act on: one run, fits with a margin, the data's own lengths, one batch search."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.catalog.memory_margin import default_memory_margin

LLAMA_QLORA = {"model": "llama-3-8b", "method": "qlora", "gpu": "H100", "seq_len": 512}


def test_a_job_is_one_run_with_its_start_up_once(cli_json) -> None:
    one_run = cli_json("estimate", **LLAMA_QLORA, queries=20000, epochs=3)[0]
    steady = cli_json("estimate", **LLAMA_QLORA, queries=20000, epochs=3, steady_state=True)[0]
    paper = cli_json("estimate", **LLAMA_QLORA, queries=20000, epochs=3, run_queries=1000)[0]
    assert one_run["startup_s"] > 0 and steady["startup_s"] == 0 and paper["startup_s"] == 0
    assert one_run["queries_per_s"] == steady["queries_per_s"]  # steady state, start-up beside it
    assert abs(one_run["hours"] / steady["hours"] - 1) < 0.05
    assert one_run["hours"] == pytest.approx(steady["hours"] + one_run["startup_s"] / 3600)
    assert paper["hours"] > one_run["hours"]  # 60 runs of 1000 queries each pay the start-up


def test_the_answer_comes_first_and_start_up_on_its_own_line(cli_ok) -> None:
    lines = cli_ok("estimate", **LLAMA_QLORA, queries=20000, epochs=3).stdout.splitlines()
    assert lines[0].startswith("answer: H100-80GB-SXM")
    assert sum(line.startswith("start-up:") for line in lines) == 1


# (model, method, seq_len, gpu): jobs near the edge of a card, small enough to simulate in seconds; the three
# slowest (10-17 s each on 2 cores) run in CI only (the long marker)
_CI = pytest.mark.long
JOBS = [
    pytest.param("qwen2.5-0.5b", "full", 1024, "RTX-4090", marks=_CI),
    ("qwen2.5-0.5b", "lora", 2048, "RTX-4090"),
    pytest.param("qwen2.5-1.5b", "qlora", 2048, "RTX-4090", marks=_CI),
    pytest.param("llama-3.2-1b", "lora", 2048, "RTX-4090", marks=_CI),
    ("smollm2-135m", "full", 2048, "RTX-4060"),
]


@pytest.mark.parametrize(("model", "method", "seq_len", "gpu"), JOBS)
def test_every_command_gives_the_same_largest_batch(cli_json, model, method, seq_len, gpu) -> None:
    job = {"model": model, "method": method, "seq_len": seq_len}
    memory = cli_json("memory", **job, gpu=gpu)
    max_batch = cli_json("max-batch", **job, gpu=gpu, device="cpu")
    single = cli_json("estimate", **job, gpu=gpu, queries=1000, epochs=1)[0]
    one_gpu = cli_json("estimate", **job, gpu=gpu, queries=1000, epochs=1, gpus=1)
    (setup,) = one_gpu["setups"]
    assert setup["plan"]["strategy"] == "single"
    largest = memory["max_batch_size"]
    assert largest >= 1
    assert max_batch["max_batch_size"] == single["max_batch_size"] == setup["micro_batch"] == largest
    # what the device gives at that batch, with the margin, stays within the card
    need = memory["max_batch"]["need_bytes"]
    card = resolve_gpu_name(gpu).gpu.usable_memory_bytes
    assert need * (1 + default_memory_margin().fraction) <= card
    assert memory["max_batch"]["borderline_batch_size"] >= largest


@pytest.mark.slow
@pytest.mark.long  # 34 s on 2 cores: CI runs it (make test-long)
def test_a_data_file_prices_its_own_lengths(cli_json, cli_ok, tmp_path: Path) -> None:
    data = tmp_path / "short.jsonl"
    rows = [{"instruction": f"Add {i} and {i + 1}.", "input": "", "output": f"{2 * i + 1}"} for i in range(200)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = {"model": "mistral-7b-v0.1", "method": "qlora", "gpu": "A100-80GB", "epochs": 1}
    own = cli_json("estimate", **job, dataset=str(data), seq_len=2048)[0]
    padded = cli_json("estimate", **job, queries=200, seq_len=2048)[0]
    assert own["num_queries"] == 200
    assert own["queries_per_s"] > 2 * padded["queries_per_s"]  # a few tokens per example, not 2048
    out = cli_ok("estimate", **job, dataset=str(data), seq_len=2048).stdout
    assert "the data's own lengths" in out and "padded to its longest" in out
    small = {**job, "gpu": "RTX-4060", "dataset": str(data), "seq_len": 2048}
    one = cli_json("estimate", **small)[0]
    several = cli_json("estimate", **small, gpus=1)  # the same sizing on one rank of the multi-GPU path
    assert several["seq_len"] < 64 and several["setups"][0]["micro_batch"] == one["max_batch_size"] >= 1


@pytest.mark.long
def test_owned_and_rented_in_one_table(cli_ok, cli_json, tmp_path: Path) -> None:
    prices = tmp_path / "prices.csv"
    prices.write_text(
        "provider,gpu,usd_per_gpu_hour,date,source_url\n"
        "owned,RTX-4090,0,2026-12-01,my desk\n"
        "cloud,H100,2.5,2026-12-01,a quote\n"
    )
    args = {**LLAMA_QLORA, "gpu": "RTX-4090,H100", "gpus": "2,1", "queries": 2000, "epochs": 1}
    answer = cli_json("estimate", **args, prices=str(prices))
    found = {(s["gpu"]["name"], s["plan"]["num_gpus"]) for s in answer["setups"]}
    assert found >= {("RTX4090-24GB", 2), ("H100-80GB-SXM", 1)}
    owned = [s for s in answer["setups"] if s["gpu"]["name"] == "RTX4090-24GB" and s["cost"]]
    assert owned and all(s["cost"]["usd"] == 0 for s in owned)
    out = cli_ok("estimate", **args, prices=str(prices)).stdout
    assert "owned" in out and "H100-80GB-SXM" in out and "RTX4090-24GB" in out
