"""`tunecost plan`: the recommended setup fits, respects the budget and deadline, agrees with `estimate`, and its
front and ruled-out setups say why."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import pytest

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.cli.commands.plan import parse_owned
from tunecost.cli.main import app
from tunecost.errors import TunecostError
from tunecost.estimate.cost import estimate_job
from tunecost.estimate.estimators import sizing_seq_len
from tunecost.estimate.gpu_search import estimate_multi_gpu
from tunecost.estimate.plan import make_plan, model_parallel_of, pareto_front, recommend
from tunecost.estimate.plan_launch import launch_job
from tunecost.workload.parallel import ParallelPlan

SMALL = {"num_queries": 2000, "epochs": 1, "max_gpus": 4, "gpus_per_node": 8}


def _plan(cli_runner, args: list[str]) -> dict:
    result = cli_runner.invoke(app, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["plan"]


@pytest.mark.long
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
        pytest.param("Qwen/Qwen2.5-0.5B", "lora", ("RTX-4090", "H100"), None, marks=pytest.mark.long),
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
            expert_degree=s.plan.expert_parallel,
            offload=option.offload,
            provider=provider,
            num_queries=14000,
            epochs=10,
        )
        (twin,) = [t for t in same.setups if t.plan == s.plan]
        assert (twin.micro_batch, twin.cost.hours, twin.cost.usd) == (s.micro_batch, s.cost.hours, s.cost.usd)


def test_a_rank_computes_over_the_datas_lengths_as_estimate_prices_one_gpu() -> None:
    """Memory is sized at the longest batch (512 tokens for a dataset with a median only); the compute is the
    single-GPU estimate's, over the dataset's lengths, so the 1-GPU setup is not every query padded to 512."""
    from tunecost.estimate.rank_needs import single_gpu_throughput

    job = estimate_job("Qwen/Qwen2.5-0.5B", method="lora", dataset="math_14k")
    gpu = resolve_gpu_name("H100").gpu
    plan = make_plan([job], gpus=[gpu], **{**SMALL, "max_gpus": 1})
    (single,) = [o.setup for o in plan.options if o.setup.plan.strategy == "single"]
    assert "512 tokens" in single.memory.assumptions[0]
    assert all(o.setup.plan.expert_parallel == 1 for o in plan.options)  # a dense model: no experts to split
    own, _ = single_gpu_throughput(job.with_(batch_size=single.micro_batch), gpu)
    padded, _ = single_gpu_throughput(job.with_(batch_size=single.micro_batch, seq_len=512, dataset=None), gpu)
    assert single.queries_per_s == pytest.approx(own.queries_per_s)
    assert padded.queries_per_s < 0.9 * own.queries_per_s


@pytest.mark.long  # CI runs it (with the test beside it, 7-15 s of work no other test shares)
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


@pytest.mark.long  # CI runs it (with the test beside it, 7-15 s of work no other test shares)
def test_a_deadline_picks_the_cheapest_in_time() -> None:
    job = estimate_job("Qwen/Qwen2.5-0.5B", method="lora", seq_len=512)
    gpus = [resolve_gpu_name(g).gpu for g in ("RTX-4090", "H100")]
    free = make_plan([job], gpus=gpus, **SMALL)
    fastest = min(o.hours for o in free.front)
    plan = make_plan([job], gpus=gpus, deadline_h=fastest * 1.001, **SMALL)
    assert plan.recommended is not None and plan.recommended.hours <= fastest * 1.001
    assert plan.goal == "cheapest within the deadline"


@pytest.mark.long
def test_the_front_is_the_options_nobody_beats() -> None:
    job = estimate_job("Qwen/Qwen2.5-0.5B", method="lora", seq_len=512)
    plan = make_plan([job], gpus=[resolve_gpu_name("H100").gpu], **SMALL)
    front = plan.front
    assert list(front) == list(pareto_front(front))
    assert [o.usd for o in front] == sorted(o.usd for o in front)
    assert all(a.hours > b.hours for a, b in itertools.pairwise(front))
    assert plan.evaluated > 0


def test_a_global_batch_is_micro_batch_times_accumulation_times_ranks() -> None:
    """The data-parallel ranks: every GPU without model parallelism, num_gpus / (tp x pp x cp) with it."""
    job = estimate_job("Qwen/Qwen2.5-0.5B", method="lora", seq_len=512)
    plan = make_plan([job], gpus=[resolve_gpu_name("H100").gpu], global_batch=32, **SMALL)
    for option in plan.front:
        assert option.setup.micro_batch * option.accumulation * option.setup.plan.dp == 32


def test_a_global_batch_is_priced_at_its_accumulation() -> None:
    """Each option at a global batch costs what `estimate_multi_gpu` gives its layout at that micro-batch and
    accumulation (the optimizer once per step), not what its throughput at accumulation 1 gives."""
    job = estimate_job("Qwen/Qwen2.5-0.5B", method="lora", seq_len=512)
    h100 = resolve_gpu_name("H100").gpu
    plan = make_plan([job], gpus=[h100], global_batch=1024, **SMALL)
    option = next(o for o in plan.options if o.accumulation > 1 and o.setup.plan.degree == 1 and o.setup.fits)
    alone = estimate_multi_gpu(
        job.with_(grad_accum=option.accumulation),
        gpus=[h100],
        strategies=[option.setup.plan.strategy],
        num_gpus=option.setup.plan.num_gpus,
        micro_batch=option.setup.micro_batch,
        num_queries=SMALL["num_queries"],
        epochs=SMALL["epochs"],
    )
    (setup,) = [s for s in alone.setups if s.plan == option.setup.plan]
    assert option.setup.queries_per_s == pytest.approx(setup.queries_per_s, rel=1e-9)


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
    assert "give --own" in cli_error([*base, "--host-cpu", "7950X"])
    assert "--host-cpu: unknown host CPU 'Z80'" in cli_error([*base, "--own", "RTX-4090", "--host-cpu", "Z80"])


def test_a_named_host_runs_the_owned_gpus_and_not_the_rented_ones() -> None:
    """--host-cpu is the machine of the owned GPUs: their offloaded optimizer steps on its memory; a rented GPU
    keeps its default host."""
    job = estimate_job("Qwen/Qwen2.5-0.5B", method="full", seq_len=512)
    owned = parse_owned("1xRTX-4090")
    gpus = [resolve_gpu_name("RTX-4090").gpu]
    plan = make_plan([job], gpus=gpus, own=owned, host_cpu="Ryzen 9 7950X", **{**SMALL, "max_gpus": 1})
    notes = " ".join(plan.notes)
    assert "83 GB/s, the datasheet bandwidth of 1 x Ryzen 9 7950X (named)" in notes
    assert "the datasheet bandwidth of 2 x Xeon Platinum 8380 (assumed" in notes


def test_emit_writes_the_recipe_and_never_replaces_a_file(cli_runner, cli_error, tmp_path) -> None:
    args = ["plan", "--model", "Qwen/Qwen2.5-0.5B", "--method", "lora", "--gpu", "H100", "--queries", "1000"]
    args += ["--epochs", "1", "--seq-len", "512", "--max-gpus", "2", "--emit", str(tmp_path / "recipe")]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "recipe" / "accelerate_config.yaml").is_file()
    assert "--force" in cli_error(args)
    assert cli_runner.invoke(app, [*args, "--force"]).exit_code == 0


def test_emit_keeps_the_model_the_user_named_and_asks_for_data_not_given(cli_runner, tmp_path) -> None:
    """An instruct checkpoint priced as its base model is launched as itself; no dataset: CHANGE_ME."""
    args = ["plan", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--method", "lora", "--gpu", "H100", "--queries", "1000"]
    args += ["--epochs", "1", "--seq-len", "512", "--max-gpus", "1", "--emit", str(tmp_path), "--force"]
    assert cli_runner.invoke(app, [*args, "--target", "llamafactory"]).exit_code == 0
    recipe = (tmp_path / "llamafactory.yaml").read_text()
    assert "model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct" in recipe and "dataset: CHANGE_ME" in recipe
    assert cli_runner.invoke(app, args).exit_code == 0
    train_args = json.loads((tmp_path / "train_args.json").read_text())
    assert train_args["model"]["pretrained_model_name_or_path"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert train_args["dataset"] == "CHANGE_ME"


def test_emit_without_a_seq_len_writes_the_length_memory_was_sized_at(cli_runner, tmp_path) -> None:
    """A catalog dataset with a median only and no --seq-len: sized at 512 tokens, and the recipe cuts there."""
    args = ["plan", "--model", "Qwen/Qwen2.5-0.5B", "--method", "lora", "--gpu", "H100", "--dataset", "math_14k"]
    args += ["--epochs", "1", "--max-gpus", "1", "--emit", str(tmp_path), "--force", "--target", "llamafactory"]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "cutoff_len: 512" in (tmp_path / "llamafactory.yaml").read_text()


TINY_FULL = {"num_queries": 2000, "epochs": 1, "max_gpus": 3, "gpus_per_node": 8}  # TP/PP layouts searched


@pytest.fixture(scope="module")
def tiny_full() -> tuple:
    """A full fine-tune of a small Llama on RTX-4090s up to 3 GPUs: the search weighs TP and PP layouts too."""
    job = estimate_job("tinyllama-1.1b", method="full", seq_len=2048)
    job = job.with_(seq_len=sizing_seq_len(job))
    return job, make_plan([job], gpus=[resolve_gpu_name("RTX-4090").gpu], **TINY_FULL)


def _model_parallel_options(plan) -> list:
    return [o for o in plan.options if o.setup.plan.degree > 1 and o.setup.cost is not None]


def test_a_global_batch_reprices_a_tp_pp_setup_as_itself(tiny_full) -> None:
    """At --global-batch the layout stays: micro-batch x accumulation x data-parallel ranks x pipeline
    micro-batches = G, priced as `estimate --gpus N --tp --pp` prices that layout at that micro-batch."""
    job, _ = tiny_full
    plan = make_plan([job], gpus=[resolve_gpu_name("RTX-4090").gpu], global_batch=16, **TINY_FULL)
    mp = _model_parallel_options(plan)
    assert any(o.setup.plan.pp > 1 for o in mp) and any(o.setup.plan.tp > 1 for o in mp)
    for o in mp:
        p = o.setup.plan
        assert o.setup.micro_batch * o.accumulation * p.dp * p.num_micro_batches == 16
    for o in [next(o for o in mp if o.setup.plan.pp > 1), next(o for o in mp if o.setup.plan.tp > 1)]:
        s = o.setup
        same = estimate_multi_gpu(
            job.with_(grad_accum=o.accumulation),
            gpus=[s.gpu],
            strategies=[s.plan.strategy],
            num_gpus=s.plan.num_gpus,
            offload=o.offload,
            micro_batch=s.micro_batch,
            model_parallel=model_parallel_of(s.plan),
            num_queries=TINY_FULL["num_queries"],
            epochs=TINY_FULL["epochs"],
        )
        (twin,) = [t for t in same.setups if t.plan == s.plan]
        assert (twin.cost.hours, twin.cost.usd) == (s.cost.hours, s.cost.usd)


def test_a_tie_goes_to_fewer_model_parallel_ranks_before_the_strategy(tiny_full) -> None:
    _, plan = tiny_full
    at2 = [o for o in plan.options if o.setup.plan.num_gpus == 2 and o.offload == "none" and o.setup.cost]
    tp = next(o for o in at2 if o.setup.plan.degree > 1 and o.setup.plan.strategy == "ddp")
    dp = next(o for o in at2 if o.setup.plan.degree == 1 and o.setup.plan.strategy == "zero3")
    tied = [dataclasses.replace(o, setup=dataclasses.replace(o.setup, cost=tp.setup.cost)) for o in (tp, dp)]
    _, best, _ = recommend(tied, None, None)
    assert best is not None and best.setup.plan == dp.setup.plan


def test_counts_the_search_does_not_price_say_so(tiny_full) -> None:
    """A layout is timed on its fewest GPUs that fit and their power-of-two multiples; at 3 GPUs it fits untimed."""
    _, plan = tiny_full
    untimed = [o for o in plan.options if o.setup.fits and o.setup.cost is None]
    assert untimed and {o.setup.plan.num_gpus for o in untimed} == {3}
    assert all(o.why_not.startswith("not timed: this layout fits on fewer GPUs (1)") for o in untimed)
    assert plan.skipped == len(untimed) and plan.evaluated + plan.pruned + plan.skipped == len(plan.options)
    assert not any(o.why_not.startswith(("not timed", "no throughput")) for o in plan.ruled_out)


def test_emit_refuses_a_tp_pp_setup_in_one_line(tiny_full) -> None:
    job, plan = tiny_full
    option = _model_parallel_options(plan)[0]
    with pytest.raises(TunecostError, match="data-parallel layouts only") as err:
        launch_job(option, job, epochs=1)
    assert option.setup.plan.layout_name in str(err.value) and "\n" not in str(err.value)
    data_parallel = next(o for o in plan.options if o.setup.plan.num_gpus > 1 and o.setup.plan.degree == 1)
    assert launch_job(data_parallel, job, epochs=1).strategy == data_parallel.setup.plan.strategy


@pytest.mark.long  # 33 s on 2 cores: CI runs it (make test-long); tiny_full's tests name TP/PP layouts in make test
def test_a_70b_full_plan_names_its_layout_and_emits_only_data_parallelism(cli_runner, cli_error, tmp_path) -> None:
    """The answer and the tables name the TP/PP degrees of a setup, not only its strategy; --emit refuses them."""
    args = ["plan", "--model", "meta-llama/Llama-2-70b-hf", "--method", "full", "--gpu", "H100"]
    args += ["--dataset", "alpaca", "--epochs", "1", "--seq-len", "2048"]
    best = json.loads(cli_runner.invoke(app, [*args, "--json"]).stdout)["plan"]["recommended"]
    layout = ParallelPlan(**best["setup"]["plan"])
    text = cli_runner.invoke(app, args).stdout
    assert f"plan: full on {layout.num_gpus} x H100-80GB-SXM, {layout.layout_name}," in text
    emit = [*args, "--emit", str(tmp_path / "recipe")]
    if layout.degree > 1:
        assert layout.layout_name in cli_error(emit) and not (tmp_path / "recipe").exists()
    else:
        assert cli_runner.invoke(app, emit).exit_code == 0


def test_emit_refuses_what_the_recipes_cannot_switch_on(tiny_full) -> None:
    """The launch recipes (LLaMA-Factory, torchtune, accelerate) have no selective-recomputation switch: a recipe
    without it would run another job than the one planned. FP8 reaches the recipe (LLaMA-Factory's writes it)."""
    job, plan = tiny_full
    option = next(o for o in plan.options if o.setup.plan.degree == 1)
    selective = job.with_(gradient_checkpointing=False, selective_recompute=True)
    with pytest.raises(TunecostError, match="no selective recomputation switch"):
        launch_job(option, selective, epochs=1)
    with pytest.raises(TunecostError, match="no some-layers recomputation switch"):
        launch_job(option, job.with_(gradient_checkpointing=True, recompute_layers=1), epochs=1)
    saved = job.with_(method="lora", modules_to_save=("lm_head",))
    with pytest.raises(TunecostError, match="no modules-to-save switch"):
        launch_job(option, saved, epochs=1)
    packed = launch_job(option, job.with_(seq_len=job.seq_len or 64, packing="per-document"), epochs=1)
    assert packed.packing == "per-document"  # the recipes switch packing on
    assert launch_job(option, job.with_(fp8="rowwise"), epochs=1).fp8 == "rowwise"


def test_a_pipeline_runs_the_optimizer_once_per_step(tiny_full) -> None:
    """A pipeline's m micro-batches are its accumulation: the rank's compute is m micro-batches of the single-GPU
    step with its optimizer spread over them (the job at grad_accum m), not m optimizer steps, at the pace of the
    slowest pipeline rank (its layers and, on the last stage, the LM head in layers' worth)."""
    from tunecost.distributed.pipeline import head_layer_equivalents, slowest_rank
    from tunecost.estimate.rank_needs import single_gpu_throughput
    from tunecost.models.catalog import resolve_model
    from tunecost.models.params import count_parameters

    job, plan = tiny_full
    option = next(o for o in _model_parallel_options(plan) if o.setup.plan.pp > 1)
    s, m = option.setup, option.setup.plan.num_micro_batches
    at = job.with_(batch_size=s.micro_batch)
    spread, _ = single_gpu_throughput(at.with_(grad_accum=m), s.gpu)
    each, _ = single_gpu_throughput(at, s.gpu)
    assert m > 1 and spread.queries_per_s > each.queries_per_s
    spec, p = resolve_model(job.model), s.plan
    counts = count_parameters(spec, job.experts_per_token)
    layer = (counts.active - counts.embedding) / spec.num_layers
    seq_len = job.worst_case_seq_len
    head = head_layer_equivalents(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, layer_params=layer, seq_len=seq_len
    )
    _, share = slowest_rank(spec.num_layers, p.pp, p.virtual_stages, p.stage_weights(spec.num_layers), head)
    assert share > 1 / p.pp  # the head's stage is slower than an even share
    expected = m * s.micro_batch / spread.queries_per_s / (p.tp * p.cp) * share
    assert s.timing.compute_seconds == pytest.approx(expected)


def test_a_verdict_tells_a_cost_from_the_budget_it_is_over() -> None:
    from tunecost.estimate.plan import _apart

    assert _apart(7.4213, 7.42, 2) == ("7.421", "7.42")  # not "$7.42 > $7.42"
    assert _apart(1234.5, 1000, 2) == ("1,234.50", "1,000")
    assert _apart(0.54, 0.035, 2) == ("0.54", "0.035")  # the limit as given, not "$0.04"
    assert _apart(0.04, 0.001, 1) == ("0.04", "0.001") and _apart(70.31, 48, 1) == ("70.3", "48")


def test_the_closest_miss_over_budget_is_the_cheapest_over_it() -> None:
    """A setup ruled out by the budget is shown by what it costs, not by its memory headroom."""
    job = estimate_job("Qwen/Qwen2.5-0.5B", method="lora", seq_len=512)
    plan = make_plan([job], gpus=[resolve_gpu_name("H100").gpu], budget_usd=1e-6, **SMALL)
    over = [o for o in plan.options if o.why_not.startswith("over budget")]
    missed = [o for o in plan.ruled_out if o.why_not.startswith("over budget")]
    assert missed
    for m in missed:
        same = [
            o
            for o in over
            if (o.method, o.setup.gpu.name, o.owned, o.offload) == (m.method, m.setup.gpu.name, m.owned, m.offload)
        ]
        assert m.usd == min(o.usd for o in same)


def test_emit_never_writes_onto_a_config_it_read(cli_runner, tmp_path) -> None:
    """A recipe named as the --config file (LLaMA-Factory's llamafactory.yaml) is refused even with --force; an
    --emit that is a file and an --out whose meta.json tunecost did not write are refused before the search."""
    config = tmp_path / "llamafactory.yaml"
    text = "model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nfinetuning_type: lora\ncutoff_len: 512\n"
    config.write_text(text)
    args = ["plan", "--config", str(config), "--gpu", "H100", "--queries", "1000", "--epochs", "1", "--max-gpus", "1"]
    (tmp_path / "afile").write_text("x")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "meta.json").write_text("{not json")
    for extra, said in (
        (["--target", "llamafactory", "--emit", str(tmp_path), "--force"], "is one of this command's inputs"),
        (["--emit", str(tmp_path / "afile")], "is a file; give a folder"),
        (["--out", str(tmp_path / "run")], "its meta.json is not a tunecost run's"),
    ):
        result = cli_runner.invoke(app, [*args, *extra])
        last = result.stderr.strip().splitlines()[-1]
        assert result.exit_code == 2 and last.startswith("error: ") and said in " ".join(result.stderr.split())
    assert config.read_text() == text and (tmp_path / "run" / "meta.json").read_text() == "{not json"


@pytest.mark.long  # 13 s: a search up to 32 H100s
def test_no_setup_steps_over_more_queries_than_an_epoch_holds(cli_runner) -> None:
    """1000 queries on up to 32 H100s: a micro-batch larger than a rank's share of the epoch never runs, so each
    setup's is cut to it (32 ranks: 32, not the 50-odd that fit) and the plan says so."""
    args = ["plan", "--model", "Qwen/Qwen2.5-0.5B", "--method", "lora", "--gpu", "H100", "--queries", "1000"]
    result = cli_runner.invoke(app, [*args, "--epochs", "1", "--seq-len", "512", "--budget", "1", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout[result.stdout.index("{") :])["plan"]
    for option in plan["front"]:
        layout = option["setup"]["plan"]
        dp = layout["num_gpus"] // (layout.get("tp", 1) * layout.get("pp", 1) * layout.get("cp", 1))
        assert option["setup"]["micro_batch"] <= math.ceil(1000 / (dp * option["accumulation"]))
    assert any(o["setup"]["plan"]["num_gpus"] >= 16 for o in plan["front"])
    assert any("more than an epoch's 1000 queries" in n for n in plan["notes"])


def test_a_micro_batch_is_cut_to_its_ranks_share_of_the_epoch() -> None:
    """100 queries on up to 4 H100s (the search of the test above, smaller): no setup runs a micro-batch larger
    than its ranks' share of the epoch, and the plan says so."""
    job = estimate_job("Qwen/Qwen2.5-0.5B", method="lora", seq_len=512)
    plan = make_plan([job], gpus=[resolve_gpu_name("H100").gpu], **{**SMALL, "num_queries": 100})
    for option in plan.front:
        p = option.setup.plan
        assert option.setup.micro_batch <= math.ceil(100 / (p.dp * option.accumulation))
    assert any("more than an epoch's 100 queries" in n for n in plan.notes)


@pytest.mark.long
def test_an_moe_plan_weighs_expert_parallel_layouts() -> None:
    """tiny-mixtral's 8 experts on up to 4 GPUs: layouts at expert-parallel 2 and 4 are weighed beside the
    data-parallel ones, each priced as `estimate --expert-parallel E` prices it."""
    job = estimate_job("tiny-mixtral", method="lora", dataset="math_14k")
    job = job.with_(seq_len=sizing_seq_len(job))
    gpu = resolve_gpu_name("H100").gpu
    plan = make_plan([job], gpus=[gpu], **SMALL)
    assert {o.setup.plan.expert_parallel for o in plan.options} == {1, 2, 4}
    option = next(o for o in plan.options if o.setup.plan.expert_parallel == 2 and o.setup.cost is not None)
    s = option.setup
    same = estimate_multi_gpu(
        job,
        gpus=[gpu],
        strategies=[s.plan.strategy],
        num_gpus=s.plan.num_gpus,
        expert_degree=2,
        num_queries=SMALL["num_queries"],
        epochs=SMALL["epochs"],
    )
    (twin,) = [t for t in same.setups if t.plan == s.plan]
    assert (twin.micro_batch, twin.cost.hours, twin.cost.usd) == (s.micro_batch, s.cost.hours, s.cost.usd)


@pytest.mark.long
def test_a_kept_global_batch_caps_the_micro_batch_search_at_a_ranks_share() -> None:
    """With a global batch kept, no micro-batch over a rank's share is simulated, and the setup is the uncapped
    search's at the share (the plan re-prices at a micro-batch dividing it either way)."""
    from tunecost.estimate.rank_needs import RankNeeds

    job = estimate_job("Qwen/Qwen2.5-0.5B", method="lora", seq_len=512)
    h100 = resolve_gpu_name("H100").gpu
    run = {"gpus": [h100], "strategies": ["ddp"], "num_gpus": 2, "num_queries": 2000, "epochs": 1}
    needs = RankNeeds(job.with_(batch_size=1))
    (capped,) = estimate_multi_gpu(job, **run, needs=needs, global_batch=8).setups
    assert capped.micro_batch == 4 and max(batch for _, batch in needs._memory) == 4  # 8 over 2 ranks
    (free,) = estimate_multi_gpu(job, **run).setups
    assert free.micro_batch > 4 and capped.fits == free.fits
