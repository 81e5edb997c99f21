"""Plan records (`tunecost.results.plan_records`): one typed `plan_option` row per setup the plan weighed, read
back as written; `tunecost plan --out RUN` never replaces a plan already there without `--force`."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.cli.main import app
from tunecost.errors import TunecostError
from tunecost.estimate.cost import estimate_job
from tunecost.estimate.plan import make_plan
from tunecost.results.plan_records import PLAN_KIND, PlanOptionRow, option_row, plan_rows, save_plan_records
from tunecost.results.records import SCHEMA_VERSION, read_records

MODEL, GPUS, SEQ_LEN = "Qwen/Qwen2.5-0.5B", ("H100", "RTX-4090"), 512
SMALL = {"num_queries": 2000, "epochs": 1, "max_gpus": 2, "gpus_per_node": 8}
CLI_ARGS = ["plan", "--model", MODEL, "--method", "lora", "--gpu", ",".join(GPUS), "--max-gpus", "2"]
CLI_ARGS += ["--queries", "2000", "--epochs", "1", "--seq-len", str(SEQ_LEN)]


@pytest.fixture(scope="module")
def plan():
    """A small LoRA plan with a deadline between its fastest and slowest setup, so some setups are ruled out."""
    job = estimate_job(MODEL, method="lora", seq_len=SEQ_LEN)
    gpus = [resolve_gpu_name(g).gpu for g in GPUS]
    hours = [o.hours for o in make_plan([job], gpus=gpus, **SMALL).front]
    return make_plan([job], gpus=gpus, deadline_h=math.sqrt(min(hours) * max(hours)), **SMALL)


def _strict_json(text: str) -> list[dict]:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in a record: not JSON")

    return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


def test_every_option_is_one_row_read_back_as_written(plan, tmp_path) -> None:
    path = save_plan_records(tmp_path / "run", plan, command="tunecost plan --out run")
    rows = read_records(path)
    assert rows == plan_rows(plan) == _strict_json(path.read_text())
    assert len(rows) == len(plan.options) > len(plan.front)
    fields = [f.name for f in dataclasses.fields(PlanOptionRow)]
    for row, option in zip(rows, plan.options, strict=True):
        assert list(row) == ["schema_version", "kind", *fields]
        assert (row["schema_version"], row["kind"]) == (SCHEMA_VERSION, PLAN_KIND)
        assert PlanOptionRow(**{k: row[k] for k in fields}) == option_row(plan, option)
        if row["hours"] is not None:
            assert row["hours_low"] <= row["hours"] <= row["hours_high"]
    assert sum(r["on_front"] for r in rows) == len(plan.front)
    (best,) = [r for r in rows if r["recommended"]]
    assert (best["gpu"], best["num_gpus"], best["hours"]) == (
        plan.recommended.setup.gpu.name,
        plan.recommended.setup.plan.num_gpus,
        plan.recommended.hours,
    )
    assert {r["goal"] for r in rows} == {plan.goal} == {"cheapest within the deadline"}
    assert any(r["why_not"].startswith("past deadline") for r in rows)
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["command"] == "tunecost plan --out run" and meta["device"] is None


def test_a_plan_is_replaced_only_with_force(plan, tmp_path) -> None:
    run = tmp_path / "run"
    path = save_plan_records(run, plan)
    before = path.read_bytes()
    with pytest.raises(TunecostError, match="--force"):
        save_plan_records(run, plan)
    assert path.read_bytes() == before  # nothing written on refusal
    other = dataclasses.replace(plan, model="another-model")
    save_plan_records(run, other)  # another model's plan sits beside it
    assert {r["model"] for r in read_records(path)} == {plan.model, "another-model"}
    fewer = dataclasses.replace(plan, options=plan.options[:3])
    save_plan_records(run, fewer, force=True)  # replaced whole: no row of the old plan is left
    rows = read_records(path)
    assert [r for r in rows if r["model"] == plan.model] == plan_rows(fewer)
    assert len([r for r in rows if r["model"] == "another-model"]) == len(plan.options)


def test_plan_out_refuses_to_replace_without_force(plan, tmp_path, cli_runner) -> None:
    run = tmp_path / "run"
    path = save_plan_records(run, plan)
    before = path.read_bytes()
    args = [*CLI_ARGS, "--deadline", repr(min(plan.options, key=lambda o: o.hours).hours * 1.5), "--out", str(run)]
    refused = cli_runner.invoke(app, args)
    assert refused.exit_code == 2 and "--force" in refused.output and "Traceback" not in refused.output
    assert path.read_bytes() == before
    forced = cli_runner.invoke(app, [*args, "--force"])
    assert forced.exit_code == 0, forced.output
    rows = read_records(path)
    assert rows and all(r["kind"] == PLAN_KIND and r["model"] == plan.model for r in rows)
    assert len(rows) == len(plan.options)  # the same search, every setup weighed
    assert sum(r["recommended"] for r in rows) == 1


def test_a_plan_without_options_writes_its_front_and_misses(plan, tmp_path) -> None:
    bare = dataclasses.replace(plan, options=())
    rows = read_records(save_plan_records(tmp_path / "run", bare))
    assert len(rows) == len(plan.front) + len(plan.ruled_out)
    assert sum(r["on_front"] for r in rows) == len(plan.front)
