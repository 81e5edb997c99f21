"""--max-steps and a config's run length in optimizer steps: queries = steps x the config's global batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunecost.cli.main import app

CONFIGS = Path(__file__).parent / "configs"
NEMO = Path(__file__).parents[1] / "fixtures" / "configs" / "mlperf_llama2_70b_lora_nemo.yaml"
LF = CONFIGS / "llamafactory" / "lora_rank8" / "train.yaml"  # batch 2 x accumulation 4, one epoch


def _error_lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("error:")]


def test_mlperf_nemo_config_gives_an_answer_of_its_steps(cli_runner):
    args = ["estimate", "--config", str(NEMO), "--model", "meta-llama/Llama-2-70b-hf", "--gpu", "H200"]
    result = cli_runner.invoke(app, [*args, "--dataset", "alpaca", "--json"])
    assert result.exit_code == 0, result.output
    assert "896 x global batch 8 = 7168 queries" in result.output.replace("\n", " ")
    setup = json.loads(result.stdout[result.stdout.index("{") :])["setups"][0]
    run_s = setup["cost"]["hours"] * 3600 - setup["cost"].get("startup_s", 0.0)
    assert abs(run_s * setup["queries_per_s"] / 7168 - 1) < 0.02  # hours are 7168 queries' worth


def test_max_steps_on_the_command_line_replaces_the_configs_epochs(cli_runner):
    base = ["estimate", "--config", str(LF), "--gpu", "H100", "--dataset", "alpaca", "--json"]
    result = cli_runner.invoke(app, [*base, "--max-steps", "10"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout[result.stdout.index("[") :])[0]
    assert (row["num_queries"], row["epochs"]) == (10 * 2 * 4, 1.0)
    assert "max_steps 10 x global batch 8" in result.output.replace("\n", " ")


def test_epochs_and_max_steps_on_the_command_line_are_one_error(cli_runner):
    args = [
        "estimate",
        "--config",
        str(LF),
        "--gpu",
        "H100",
        "--dataset",
        "alpaca",
        "--max-steps",
        "5",
        "--epochs",
        "2",
    ]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 2 and _error_lines(result) == [
        "error: give --epochs or --max-steps, not both (each is the run's whole length)"
    ]


def test_max_steps_without_a_batch_says_what_to_give(cli_runner):
    args = ["estimate", "--model", "Qwen/Qwen2.5-0.5B", "--gpu", "H100", "--dataset", "alpaca", "--max-steps", "5"]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 2 and len(_error_lines(result)) == 1
    assert "global batch" in _error_lines(result)[0] and "--config" in _error_lines(result)[0]


def test_plan_takes_max_steps_with_global_batch(cli_runner):
    args = [
        "plan",
        "--config",
        str(LF),
        "--gpu",
        "H100",
        "--max-gpus",
        "1",
        "--max-steps",
        "10",
        "--global-batch",
        "16",
    ]
    result = cli_runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    assert "max_steps 10 x global batch 16 (--global-batch) = 160 queries" in result.output.replace("\n", " ")


def test_a_gpu_count_on_the_command_line_counts_its_data_parallel_ranks(cli_runner):
    """--gpus 4 over the config's one GPU: each optimizer step takes 4 ranks' batches (LoRA on a small model, DDP)."""
    base = ["estimate", "--config", str(LF), "--model", "Qwen/Qwen2.5-0.5B", "--gpu", "H100", "--dataset", "alpaca"]
    result = cli_runner.invoke(app, [*base, "--max-steps", "10", "--gpus", "4", "--strategy", "ddp"])
    assert result.exit_code == 0, result.output
    assert "max_steps 10 x global batch 32 (micro-batch 2 x accumulation 4 x 4 data-parallel ranks) = 320 queries" in (
        " ".join(result.output.split())
    )


def test_steps_of_a_per_device_batch_need_one_gpu_count(cli_runner):
    """--gpus auto prices setups of several rank counts: a run in steps of a per-device batch would need a run
    length per setup, so it is one error line naming what to give instead; plan keeps the config's global batch."""
    base = ["--config", str(LF), "--model", "Qwen/Qwen2.5-0.5B", "--gpu", "H100", "--dataset", "alpaca"]
    auto = cli_runner.invoke(app, ["estimate", *base, "--max-steps", "10", "--gpus", "auto"])
    assert auto.exit_code == 2 and len(_error_lines(auto)) == 1 and "--gpus auto" in _error_lines(auto)[0]
    # plan keeps the global batch the config states (2 x 4 on one GPU), so ten steps are 80 queries in every setup
    plan = cli_runner.invoke(app, ["plan", *base, "--max-steps", "10", "--max-gpus", "2"])
    assert plan.exit_code == 0 and "kept in every setup" in " ".join(plan.stderr.split())
    # a strategy without a GPU count (a torchtitan config's shard degree -1): estimate searches the fewest GPUs
    searched = cli_runner.invoke(app, ["estimate", *base, "--max-steps", "10", "--strategy", "fsdp2"])
    lines = _error_lines(searched)
    assert searched.exit_code == 2 and len(lines) == 1 and "GPU count is searched" in lines[0]
    assert "--gpus N" in lines[0]


def test_llamafactory_max_samples_caps_the_queries_of_an_epoch(cli_runner, tmp_path):
    """LLaMA-Factory cuts each dataset to its first max_samples examples: the run prices at most that many per
    epoch; --queries on the command line replaces the cap."""
    config = tmp_path / "train.yaml"
    config.write_text(LF.read_text() + "max_samples: 1000\ndataset: alpaca_en_demo\n")
    base = ["estimate", "--config", str(config), "--gpu", "H100", "--json"]
    capped = cli_runner.invoke(app, [*base, "--dataset", "alpaca"])
    assert capped.exit_code == 0, capped.output
    assert {row["num_queries"] for row in json.loads(capped.stdout)} == {1000}
    assert "assumed: 1000 queries per epoch: the config cuts the data there of 52002" in " ".join(capped.output.split())
    given = cli_runner.invoke(app, [*base, "--dataset", "alpaca", "--queries", "5000"])
    assert {row["num_queries"] for row in json.loads(given.stdout)} == {5000}


def test_a_dataset_on_the_command_line_is_cut_as_one_dataset(cli_runner, tmp_path):
    """max_samples cuts each of the config's datasets; --dataset replaces them with one, cut to max_samples once."""
    config = tmp_path / "train.yaml"
    config.write_text(LF.read_text() + "max_samples: 1000\ndataset: alpaca_en_demo,identity\n")
    base = ["estimate", "--config", str(config), "--gpu", "H100", "--json"]
    result = cli_runner.invoke(app, [*base, "--dataset", "alpaca"])
    assert result.exit_code == 0, result.output
    assert {row["num_queries"] for row in json.loads(result.stdout)} == {1000}  # not 2 x 1000


def test_an_oversampled_mixture_is_not_cut_to_max_samples_per_dataset(cli_runner, tmp_path):
    """interleave_over draws past each dataset's max_samples rows (repeating them): the mixture's count stands."""
    config = tmp_path / "train.yaml"
    mix = "dataset: gsm8k,commonsense_15k\nmix_strategy: interleave_over\ninterleave_probs: 0.9,0.1\n"
    config.write_text(LF.read_text() + "max_samples: 5000\n" + mix)
    result = cli_runner.invoke(app, ["estimate", "--config", str(config), "--gpu", "H100", "--json"])
    assert result.exit_code == 0, result.output
    assert {row["num_queries"] for row in json.loads(result.stdout)} == {round(5000 / 0.1)}


def test_grad_accum_on_the_command_line_sizes_the_steps_and_spreads_the_optimizer(cli_runner):
    """--grad-accum 16 over the config's 4: a step takes 16 micro-batches, and the optimizer's time is spread over
    them (the config's own accumulation by default, read from gradient_accumulation_steps)."""
    base = ["estimate", "--config", str(LF), "--gpu", "H100", "--dataset", "alpaca", "--method", "full"]
    base += ["--model", "Qwen/Qwen2.5-0.5B", "--batch-size", "2", "--json"]
    rows = {}
    for accumulation in ("4", "16"):
        result = cli_runner.invoke(app, [*base, "--max-steps", "10", "--grad-accum", accumulation])
        assert result.exit_code == 0, result.output
        rows[accumulation] = json.loads(result.stdout[result.stdout.index("[") :])[0]
    assert (rows["4"]["num_queries"], rows["16"]["num_queries"]) == (10 * 2 * 4, 10 * 2 * 16)
    assert rows["16"]["queries_per_s"] > rows["4"]["queries_per_s"]
    bad = cli_runner.invoke(app, [*base, "--grad-accum", "0"])
    assert bad.exit_code == 2 and "--grad-accum" in bad.output


def test_plan_takes_grad_accum_or_a_global_batch(cli_runner):
    """plan --grad-accum N: every option accumulates N micro-batches (the launch recipe's gradient accumulation);
    beside --global-batch, which sets each option's own accumulation, it is one error."""
    args = ["plan", "--config", str(LF), "--gpu", "H100", "--max-gpus", "1", "--epochs", "1", "--queries", "1000"]
    result = cli_runner.invoke(app, [*args, "--grad-accum", "4", "--json"])
    assert result.exit_code == 0, result.output
    front = json.loads(result.stdout[result.stdout.index("{") :])["plan"]["front"]
    assert front and {option["accumulation"] for option in front} == {4}
    both = cli_runner.invoke(app, [*args, "--grad-accum", "4", "--global-batch", "16"])
    assert both.exit_code == 2 and "give --global-batch or --grad-accum" in both.output


@pytest.mark.long
def test_plan_keeps_the_global_batch_a_config_states(cli_runner, tmp_path):
    """A config that states its micro-batch and accumulation (1 x 8) states the optimisation's batch: every setup
    the plan weighs keeps 8 queries per step, with its own micro-batch x accumulation x ranks, and says so; a config
    that leaves them to its framework's defaults, states a micro-batch per GPU alone (the launcher's GPUs multiply
    it), or a flag that sets them, leaves each setup its own."""
    path = tmp_path / "lf.yaml"
    path.write_text(
        "model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nfinetuning_type: lora\ncutoff_len: 512\n"
        "per_device_train_batch_size: 1\ngradient_accumulation_steps: 8\n"
    )
    args = ["plan", "--config", str(path), "--gpu", "H100", "--max-gpus", "2", "--epochs", "1", "--queries", "1000"]
    result = cli_runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    front = json.loads(result.stdout[result.stdout.index("{") :])["plan"]["front"]
    per_step = {o["setup"]["micro_batch"] * o["accumulation"] * o["setup"]["plan"]["num_gpus"] for o in front}
    assert front and per_step == {8}
    assert (
        "global batch 8 (micro-batch 1 x accumulation 8 x 1 data-parallel rank; the config leaves the GPU count to "
        "its launcher), kept" in " ".join(result.stderr.split())
    )
    flagged = cli_runner.invoke(app, [*args, "--global-batch", "16", "--json"])
    assert flagged.exit_code == 0 and "kept in every setup" not in flagged.stderr
    text = path.read_text()
    path.write_text(text.replace("gradient_accumulation_steps: 8", "gradient_accumulation_steps: 1"))
    per_gpu = cli_runner.invoke(app, [*args, "--json"])  # a micro-batch per GPU, times the GPUs launched
    assert per_gpu.exit_code == 0 and "kept in every setup" not in per_gpu.stderr
    path.write_text(text.replace("per_device_train_batch_size: 1\ngradient_accumulation_steps: 8\n", ""))
    defaults = cli_runner.invoke(app, [*args, "--json"])  # LLaMA-Factory's default batch: not the user's choice
    assert defaults.exit_code == 0 and "kept in every setup" not in defaults.stderr


def test_plan_emits_for_the_framework_of_the_config_from_the_config(cli_runner, tmp_path):
    """--emit without --target writes the recipe of the config's framework (LLaMA-Factory here), starting from the
    user's file: its dataset and template stay, the plan's batch and accumulation replace its own."""
    path = tmp_path / "lf.yaml"
    path.write_text(
        "model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nfinetuning_type: lora\ncutoff_len: 512\n"
        "dataset: my_set\ntemplate: qwen\nper_device_train_batch_size: 1\ngradient_accumulation_steps: 8\n"
    )
    out = tmp_path / "recipe"
    args = ["plan", "--config", str(path), "--gpu", "H100", "--max-gpus", "1", "--queries", "1000", "--emit", str(out)]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    import yaml

    config = yaml.safe_load((out / "llamafactory.yaml").read_text())
    assert (config["dataset"], config["template"]) == ("my_set", "qwen")
    assert config["per_device_train_batch_size"] * config["gradient_accumulation_steps"] == 8


def test_queries_beside_max_steps_is_one_error(cli_runner):
    """--max-steps sets the run's queries (steps x the global batch): --queries beside it would be dropped."""
    result = cli_runner.invoke(app, ["estimate", "--config", str(LF), "--gpu", "H100", "--max-steps", "10",
                                     "--queries", "100"])  # fmt: skip
    assert result.exit_code == 2 and "give --queries or --max-steps, not both" in result.output


@pytest.mark.long
def test_plan_says_the_configs_layout_is_one_it_weighs(cli_runner, tmp_path):
    """A plan searches layouts: the ZeRO-2 a config's DeepSpeed file states is weighed among them, and said."""
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2}}')
    path = tmp_path / "lf.yaml"
    path.write_text(
        "model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nfinetuning_type: lora\ncutoff_len: 512\n"
        f"deepspeed: {tmp_path / 'ds.json'}\n"
    )
    args = ["plan", "--config", str(path), "--config", str(tmp_path / "ds.json"), "--gpu", "H100", "--max-gpus", "2"]
    result = cli_runner.invoke(app, [*args, "--queries", "1000", "--json"])
    assert result.exit_code == 0, result.output
    assert "zero2 from --config is weighed among every layout the plan searches" in " ".join(result.stderr.split())


@pytest.mark.long  # 20 s: Llama-2-70B's tp4 rank traced at 8192 tokens
def test_plan_keeps_the_global_batch_a_nemo_config_states(cli_runner):
    """NeMo states the global batch and the micro-batch; the accumulation derived from them is the config's, not a
    default, so the plan keeps 8 sequences per step."""
    args = ["plan", "--config", str(NEMO), "--model", "meta-llama/Llama-2-70b-hf", "--gpu", "H200", "--max-gpus", "8"]
    result = cli_runner.invoke(app, [*args, "--dataset", "alpaca"])
    assert result.exit_code == 0, result.output
    assert "global batch 8, kept in every setup" in " ".join(result.stderr.split())


def test_emit_runs_the_steps_the_plan_priced(cli_runner, tmp_path):
    """A run given in optimizer steps is emitted in steps at the plan's global batch (the recipe's epochs alone
    would train the whole dataset): the config's global batch 8 is kept, so its 10 steps stay 10."""
    out = tmp_path / "recipe"
    args = ["plan", "--config", str(LF), "--gpu", "H100", "--max-steps", "10", "--max-gpus", "1", "--emit", str(out)]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = (out / "llamafactory.yaml").read_text(encoding="utf-8")
    micro = int(text.split("per_device_train_batch_size: ")[1].split()[0])
    accumulation = int(text.split("gradient_accumulation_steps: ")[1].split()[0])
    assert micro * accumulation == 8 and "max_steps: 10\n" in text
