"""`tunecost plan`: the recommended setup fits, respects the budget and deadline, agrees with `estimate`, and its
front and ruled-out setups say why."""

from __future__ import annotations

import itertools
import json

import pytest

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.cli.main import app
from tunecost.errors import TunecostError
from tunecost.estimate.cost import estimate_job
from tunecost.estimate.estimators import sizing_seq_len
from tunecost.estimate.plan import make_plan, pareto_front, parse_owned
from tunecost.estimate.setups import estimate_multi_gpu

SMALL = {"num_queries": 2000, "epochs": 1, "max_gpus": 4, "gpus_per_node": 8}


def _plan(cli_runner, args: list[str]) -> dict:
    result = cli_runner.invoke(app, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["plan"]


def test_70b_qlora_on_two_owned_4090s_needs_cpu_offload(cli_runner) -> None:
    args = ["--model", "meta-llama/Llama-2-70b-hf", "--method", "qlora", "--own", "2xRTX-4090", "--gpu", "none"]
    plan = _plan(cli_runner, [*args, "--dataset", "alpaca", "--epochs", "1", "--seq-len", "2048"])
    best = plan["recommended"]
    assert best["setup"]["plan"]["num_gpus"] == 2 and best["owned"] and best["setup"]["cost"]["usd"] == 0
    assert best["offload"] == "params" and best["setup"]["plan"]["strategy"].startswith("fsdp")
    assert best["setup"]["cost"]["hours"] > 0
    no_offload = [o for o in plan["ruled_out"] if o["offload"] == "none"]
    assert no_offload and all(o["why_not"].startswith("does not fit") for o in no_offload)


@pytest.mark.parametrize(
    ("model", "method", "gpu_names", "provider"),
    [
        pytest.param("mixtral-8x7b", "qlora", ("A40", "A100-80GB", "H100"), "paper-2024", marks=pytest.mark.long),
        ("Qwen/Qwen2.5-0.5B", "lora", ("RTX-4090", "H100"), None),
    ],
)
def test_the_front_holds_estimates_numbers(model: str, method: str, gpu_names: tuple, provider: str | None) -> None:
    """Each setup on the front is the one `estimate --gpus N --strategy S` prices, with the same hours and $."""
    job = estimate_job(model, method=method, dataset="math_14k")
    job = job.with_(seq_len=sizing_seq_len(job))
    gpus = [resolve_gpu_name(g).gpu for g in gpu_names]
    plan = make_plan(
        [job], gpus=gpus, provider=provider, **{**SMALL, "max_gpus": 2, "num_queries": 14000, "epochs": 10}
    )
    assert plan.front and plan.recommended in plan.front
    for option in plan.front:
        s = option.setup
        strategies = ["ddp"] if s.plan.strategy == "single" else [s.plan.strategy]
        same = estimate_multi_gpu(
            job,
            gpus=[s.gpu],
            strategies=strategies,
            num_gpus=s.plan.num_gpus,
            offload=option.offload,
            provider=provider,
            num_queries=14000,
            epochs=10,
        )
        (twin,) = [t for t in same.setups if t.plan == s.plan]
        assert (twin.micro_batch, twin.cost.hours, twin.cost.usd) == (s.micro_batch, s.cost.hours, s.cost.usd)


def test_a_budget_is_kept_at_the_point_estimate_and_a_crossing_interval_is_said() -> None:
    job = estimate_job("Qwen/Qwen2.5-0.5B", method="lora", seq_len=512)
    gpus = [resolve_gpu_name(g).gpu for g in ("RTX-4090", "H100")]
    free = make_plan([job], gpus=gpus, **SMALL)
    cheapest = min(o.usd for o in free.front)
    budget = cheapest * 1.01
    plan = make_plan([job], gpus=gpus, budget_usd=budget, **SMALL)
    assert plan.recommended is not None and plan.recommended.usd <= budget
    assert plan.goal == "fastest within the budget"
    if plan.recommended.interval(plan.recommended.usd)[1] > budget:
        assert "over the" in plan.reason
    assert all(o.usd <= budget for o in plan.front)
    assert any(o.why_not.startswith("over budget") for o in plan.ruled_out)


def test_a_deadline_picks_the_cheapest_in_time() -> None:
    job = estimate_job("Qwen/Qwen2.5-0.5B", method="lora", seq_len=512)
    gpus = [resolve_gpu_name(g).gpu for g in ("RTX-4090", "H100")]
    free = make_plan([job], gpus=gpus, **SMALL)
    fastest = min(o.hours for o in free.front)
    plan = make_plan([job], gpus=gpus, deadline_h=fastest * 1.001, **SMALL)
    assert plan.recommended is not None and plan.recommended.hours <= fastest * 1.001
    assert plan.goal == "cheapest within the deadline"


def test_the_front_is_the_options_nobody_beats() -> None:
    job = estimate_job("Qwen/Qwen2.5-0.5B", method="lora", seq_len=512)
    plan = make_plan([job], gpus=[resolve_gpu_name("H100").gpu], **SMALL)
    front = plan.front
    assert list(front) == list(pareto_front(front))
    assert [o.usd for o in front] == sorted(o.usd for o in front)
    assert all(a.hours > b.hours for a, b in itertools.pairwise(front))
    assert plan.evaluated > 0


def test_a_global_batch_is_micro_batch_times_accumulation_times_ranks() -> None:
    job = estimate_job("Qwen/Qwen2.5-0.5B", method="lora", seq_len=512)
    plan = make_plan([job], gpus=[resolve_gpu_name("H100").gpu], global_batch=32, **SMALL)
    for option in plan.front:
        assert option.setup.micro_batch * option.accumulation * option.setup.plan.num_gpus == 32


@pytest.mark.parametrize(
    ("text", "message"),
    [("2xTPU", "unknown GPU"), ("0xRTX-4090", "COUNTxGPU"), ("x", "unknown GPU")],
)
def test_own_is_checked(text: str, message: str) -> None:
    with pytest.raises(TunecostError, match=message):
        parse_owned(text)


def test_plan_errors_are_one_line(cli_error) -> None:
    base = ["plan", "--model", "Qwen/Qwen2.5-0.5B", "--queries", "100", "--epochs", "1"]
    assert "--method" in cli_error([*base, "--method", "prefix-tuning"])
    assert "--own" in cli_error([*base, "--gpu", "none"])
    assert "--budget" in cli_error([*base, "--budget", "-3"])


def test_emit_writes_the_recipe_and_never_replaces_a_file(cli_runner, cli_error, tmp_path) -> None:
    args = ["plan", "--model", "Qwen/Qwen2.5-0.5B", "--method", "lora", "--gpu", "H100", "--queries", "1000"]
    args += ["--epochs", "1", "--seq-len", "512", "--max-gpus", "2", "--emit", str(tmp_path / "recipe")]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "recipe" / "accelerate_config.yaml").is_file()
    assert "--force" in cli_error(args)
    assert cli_runner.invoke(app, [*args, "--force"]).exit_code == 0
