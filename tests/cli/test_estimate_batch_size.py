"""`tunecost estimate --batch-size` (fixed batch per GPU) and `--run-queries` (throughput of runs, as the paper
measured it)."""

from __future__ import annotations

import json

import pytest

from tunecost.cli.commands.estimate import parse_batch_sizes
from tunecost.cli.main import app
from tunecost.errors import TunecostError
from tunecost.estimate.cost import estimate_costs, estimate_job
from tunecost.estimate.estimators import EstimatorOptions

BASE = ["estimate", "--model", "mixtral-8x7b", "--dataset", "math_14k", "--epochs", "10", "--experts-per-token", "2"]


def test_parse_batch_sizes_forms() -> None:
    gpus = ["A40", "A100-80GB", "H100"]
    assert parse_batch_sizes("17", gpus) == {"*": 17}
    assert parse_batch_sizes("4,17,17", gpus) == {"A40": 4, "A100-80GB": 17, "H100": 17}
    assert parse_batch_sizes("A40=4, H100=17", gpus) == {"A40": 4, "H100": 17}
    with pytest.raises(TunecostError, match="2 values for 3 GPUs"):
        parse_batch_sizes("4,17", gpus)
    with pytest.raises(TunecostError, match="all values as GPU=B"):
        parse_batch_sizes("A40=4,17", gpus)
    with pytest.raises(TunecostError, match="not a whole number"):
        parse_batch_sizes("four", gpus)


def test_fixed_batch_with_the_paper_estimator_prices_that_batch() -> None:
    job = estimate_job("mixtral-8x7b", dataset="math_14k", experts_per_token=2)
    paper = EstimatorOptions(name="paper")
    free = estimate_costs(job, ["A40"], epochs=10, options=paper)
    fixed = estimate_costs(job, ["A40"], epochs=10, options=paper, batch_sizes={"a40": 4})  # an alias of "A40"
    assert fixed[0].batch_size == 4 and fixed[0].max_batch_size == free[0].max_batch_size == 8  # eq. (1)
    assert fixed[0].queries_per_s < free[0].queries_per_s  # eq. (2) grows with the batch
    assert "batch fixed at 4" in fixed[0].notes and fixed[0].fits
    too_big = estimate_costs(job, ["A40"], epochs=10, options=paper, batch_sizes={"*": 9})[0]
    assert not too_big.fits and "DOES NOT FIT: batch 9 is more than the 8 that fit in A40-48GB" in too_big.notes
    with pytest.raises(TunecostError, match="not among the GPUs"):
        estimate_costs(job, ["A40"], epochs=1, batch_sizes={"H100": 4})
    with pytest.raises(TunecostError, match="batch size must be >= 1"):
        estimate_costs(job, ["A40"], epochs=1, batch_sizes={"*": 0})


@pytest.mark.long
def test_calibrated_estimate_at_fixed_batches_marks_extrapolation(cli_runner) -> None:
    args = [*BASE, "--gpu", "A40,H100", "--batch-size", "4,17", "--estimator", "calibrated", "--provider"]
    result = cli_runner.invoke(app, [*args, "paper-2024", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["gpu"]: r for r in json.loads(result.stdout)}
    assert rows["A40-48GB"]["batch_size"] == 4 and not rows["A40-48GB"]["extrapolation"]
    assert rows["H100-80GB-SXM"]["batch_size"] == 17 and rows["H100-80GB-SXM"]["extrapolation"]
    h100 = rows["H100-80GB-SXM"]
    hours = 14000 * 10 / h100["queries_per_s"] / 3600 + h100["startup_s"] / 3600  # one run, start-up once
    assert h100["usd"] == pytest.approx(hours * h100["usd_per_hour"])
    table = cli_runner.invoke(app, [*args, "paper-2024", "--verbose"])
    assert table.exit_code == 0
    lines = table.stdout.splitlines()
    assert any(line.startswith("│ H100") and "yes*" in line for line in lines)  # marked in the table itself
    assert any(line.startswith("│ A40") and "│ yes " in line for line in lines)
    # the paper's protocol on request: 1000-query runs, each with its start-up
    runs = cli_runner.invoke(app, [*args, "paper-2024", "--run-queries", "1000", "--json"])
    run_rows = {r["gpu"]: r for r in json.loads(runs.stdout)}
    assert run_rows["H100-80GB-SXM"]["queries_per_s"] < h100["queries_per_s"]
    assert run_rows["H100-80GB-SXM"]["hours"] > h100["hours"]
    assert "steady-state throughput; the run's start-up counted once" in h100["notes"]
    steady = cli_runner.invoke(app, [*args, "paper-2024", "--steady-state", "--json"])
    steady_rows = {r["gpu"]: r for r in json.loads(steady.stdout)}
    assert steady_rows["H100-80GB-SXM"]["queries_per_s"] == h100["queries_per_s"]
    assert steady_rows["H100-80GB-SXM"]["hours"] < h100["hours"]  # no start-up at all
    assert "steady-state" in steady_rows["H100-80GB-SXM"]["notes"]


def test_steady_state_and_a_run_length_are_exclusive(cli_error) -> None:
    args = [*BASE, "--gpu", "A40", "--steady-state"]
    assert "--steady-state: give it or --run-queries, not both" in cli_error([*args, "--run-queries", "1000"])
    assert "needs the cross-GPU model" in cli_error([*args, "--estimator", "paper"])
