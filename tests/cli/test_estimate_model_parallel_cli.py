"""`tunecost estimate --tp/--pp/--cp`: the layout's one-line errors, and the answer for a pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunecost.cli.main import app
from tunecost.distributed.pipeline import uneven_split_note
from tunecost.workload.parallel import ModelParallel

DENSE = str(Path(__file__).parents[1] / "fixtures" / "distributed" / "tiny-llama-2l.json")
BASE = ["estimate", "--epochs", "1", "--queries", "100", "--method", "full", "--gpu", "H100"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--model", "llama-2-70b", "--gpus", "12", "--tp", "8"],
            "--tp 8 x --pp 1 x --cp 1 = 8 does not divide the 12",
        ),
        (["--model", "llama-2-70b", "--gpus", "6", "--tp", "3", "--pp", "2"], "--tp 3 does not divide the model's 64"),
        (["--model", "llama-2-70b", "--gpus", "16", "--tp", "16"], "--tp 16 does not divide the model's 8 key-value"),
        (
            ["--model", "llama-2-70b", "--gpus", "96", "--pp", "96"],
            "--pp 96: 96 pipeline stages leave a stage without",
        ),
        (
            ["--model", "llama-2-70b", "--gpus", "8", "--cp", "8", "--seq-len", "1004"],
            "--cp 8 does not divide 1004 tokens of the job's sequence",
        ),
        (["--model", "llama-2-70b", "--gpus", "8", "--tp", "4", "--seq-len", "1002"], "--sequence-parallel (--tp) 4"),
        (["--model", "llama-2-70b", "--gpus", "8", "--sequence-parallel"], "needs --tp 2 or more"),
        (["--model", "llama-2-70b", "--gpus", "8", "--pp", "2", "--pipeline-schedule", "zbv"], "unknown pipeline"),
        (["--model", "llama-2-70b", "--gpus", "8", "--pp", "0"], "--pp"),
        (["--model", "llama-2-70b", "--gpus", "8", "--micro-batches", "16"], "accumulates them with --grad-accum"),
        (
            ["--model", "llama-2-70b", "--gpus", "4", "--pp", "4", "--pp-first-stage-layers", "19"],
            "--pp-first-stage-layers 19 leave 61 of the model's 80 decoder layers to 3 other stage(s)",
        ),
        (["--model", "llama-2-70b", "--gpus", "8", "--pp-last-stage-layers", "8"], "with --pp 2 or more"),
        (
            ["--model", "llama-2-70b", "--gpus", "32", "--tp", "8", "--pp", "2", "--strategy", "zero3"],
            "zero3 with --pp 2: DeepSpeed runs ZeRO-2 and ZeRO-3 without pipeline parallelism",
        ),
    ],
)
def test_a_layout_that_does_not_divide_is_one_error_line(cli_runner, args, message):
    result = cli_runner.invoke(app, [*BASE, *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in " ".join(result.output.split()), lines


def test_pipeline_stages_the_layers_do_not_fill_evenly_are_dealt_as_torchtitan_deals_them(cli_runner) -> None:
    """--pp 3 over the tiny Llama's 2 layers: torchtitan's split (the embedding and the head counted as a layer
    each) leaves the last stage the norm and head alone, and the answer says so."""
    args = [*BASE, "--model", DENSE, "--gpus", "3", "--pp", "3", "--strategy", "ddp", "--json"]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert uneven_split_note(2, ModelParallel(pp=3)) in answer["notes"]
    (setup,) = answer["setups"]
    assert setup["plan"]["pp"] == 3 and setup["micro_batch"] >= 1 and setup["cost"]["usd"] > 0


def test_a_pipeline_answers_with_memory_per_rank_and_its_bubble(cli_runner):
    args = [
        *BASE,
        "--model",
        DENSE,
        "--gpus",
        "4",
        "--pp",
        "2",
        "--micro-batches",
        "4",
        "--seq-len",
        "64",
        "--batch-size",
        "2",
    ]
    result = cli_runner.invoke(app, [*args, "--strategy", "ddp"])
    assert result.exit_code == 0, result.output
    assert "pp2 ddp" in result.output and "pipeline bubble" in result.output and "per rank" in result.output
    result = cli_runner.invoke(app, [*args, "--strategy", "ddp", "--json"])
    setup = json.loads(result.stdout)["setups"][0]
    assert setup["plan"]["pp"] == 2 and setup["plan"]["micro_batches"] == 4
    assert setup["timing"]["bubble_seconds"] / setup["timing"]["step_seconds"] == pytest.approx(1 / 5, rel=0.05)


def test_auto_searches_tensor_and_pipeline_layouts_for_a_dense_full_fine_tune(cli_runner):
    """`--gpus auto` with no model-parallel option tries TP (with sequence parallelism) x PP beside data
    parallelism for a full fine-tune of a dense Llama-family model, and names the cheapest that fits."""
    args = [*BASE, "--model", DENSE, "--gpus", "auto", "--max-gpus", "4", "--seq-len", "64", "--batch-size", "2"]
    result = cli_runner.invoke(app, [*args, "--strategy", "ddp", "--json"])
    assert result.exit_code == 0, result.output
    layouts = {(s["plan"]["tp"], s["plan"]["pp"]) for s in json.loads(result.stdout)["setups"]}
    assert {(1, 1), (2, 1), (1, 2), (2, 2)} <= layouts


def test_a_configs_layout_is_the_one_priced(cli_runner, tmp_path):
    """A --config states the layout (here data parallelism alone): --gpus auto searches its GPU counts, not the
    TP/PP layouts its framework was not told to run."""
    config = tmp_path / "args.json"
    config.write_text('{"per_device_train_batch_size": 2, "num_train_epochs": 1, "bf16": true}', encoding="utf-8")
    args = [*BASE, "--model", DENSE, "--gpus", "auto", "--max-gpus", "4", "--seq-len", "64", "--strategy", "ddp"]
    result = cli_runner.invoke(app, [*args, "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    assert {(s["plan"]["tp"], s["plan"]["pp"]) for s in json.loads(result.stdout)["setups"]} == {(1, 1)}


@pytest.mark.long
def test_the_stages_count_the_embedding_and_the_head_as_told(cli_runner) -> None:
    """4 layers over 4 stages: torchtitan's default (each counted as a layer) deals 1, 2, 1, 0, leaving the last
    stage the norm and head alone; Megatron's (neither counted) 1 each, so the last stage adds a layer to the head."""
    lora = [a if a != "full" else "lora" for a in BASE]
    args = [*lora, "--model", str(Path(DENSE).with_name("tiny-llama-4l.json")), "--gpus", "4", "--pp", "4"]
    answers = []
    for less in ("1", "0"):
        given = ["--pp-first-stage-less-layers", less, "--pp-last-stage-less-layers", less]
        result = cli_runner.invoke(app, [*args, *given, "--strategy", "ddp", "--json"])
        assert result.exit_code == 0, result.output
        answers.append(json.loads(result.stdout))
    torchtitan, megatron = (a["setups"][0] for a in answers)
    note = uneven_split_note(4, ModelParallel(pp=4))
    assert note is not None and note in answers[0]["notes"] and "1, 2, 1, 0" in note
    assert not any("pipeline stages as" in n for n in answers[1]["notes"])
    assert (megatron["plan"]["first_stage_less_layers"], megatron["plan"]["last_stage_less_layers"]) == (0, 0)
    assert megatron["memory"]["peak_segment"].startswith("pipeline rank 3")
    assert megatron["memory"]["peak_bytes"] > torchtitan["memory"]["peak_bytes"]
    too_many = cli_runner.invoke(app, [*BASE, "--model", DENSE, "--gpus", "3", "--pp", "3", *given])
    assert too_many.exit_code == 2 and "--pp 3: 3 pipeline stages leave a stage without layers" in too_many.output


def test_a_sharded_stage_without_decoder_layers_is_timed(cli_runner) -> None:
    """2 layers over 4 stages (torchtitan: 0, 1, 1, 0): under fsdp2 the first rank shards its embedding alone, its
    step timed as one unit (a traceback before)."""
    args = [*BASE, "--model", DENSE, "--gpus", "8", "--pp", "4", "--strategy", "fsdp2", "--json"]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    (setup,) = json.loads(result.stdout)["setups"]
    assert setup["plan"]["pp"] == 4 and setup["timing"]["step_seconds"] > setup["timing"]["compute_seconds"] > 0


def test_megatrons_first_and_last_stage_layers_from_the_command_line(cli_runner) -> None:
    """--pp-first-stage-layers 3 over the 4-layer Llama's 2 stages leaves the last one layer, and the answer says
    how the stages hold the layers."""
    lora = [a if a != "full" else "lora" for a in BASE]
    args = [*lora, "--model", str(Path(DENSE).with_name("tiny-llama-4l.json")), "--gpus", "2", "--pp", "2"]
    result = cli_runner.invoke(app, [*args, "--pp-first-stage-layers", "3", "--strategy", "ddp", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert any(
        n.startswith("4 layers over 2 pipeline stages as 3, 1: 3 layers on the first stage") for n in answer["notes"]
    )
    (setup,) = answer["setups"]
    assert setup["plan"]["first_stage_layers"] == 3 and setup["plan"]["last_stage_layers"] is None


MEGATRON_LM = """
language_model:
  num_layers: 4
model_parallel:
  tensor_model_parallel_size: 1
  pipeline_model_parallel_size: 2
micro_batch_size: 1
global_batch_size: 16
seq_length: 128
train_iters: 2
bf16: true
"""


def test_a_megatron_files_global_batch_sets_the_pipelines_micro_batches_at_the_gpus_given(cli_runner, tmp_path):
    """A Megatron-LM file names no GPU count: on --gpus 4 (pp 2: 2 data-parallel ranks) its global batch 16 of
    micro-batch 1 is 8 micro-batches per step, not the pipeline's default; --micro-batches overrides it (and says
    the step it makes); a count
    the global batch does not divide is one error line."""
    config = tmp_path / "megatron.yaml"
    config.write_text(MEGATRON_LM, encoding="utf-8")
    model = str(Path(DENSE).with_name("tiny-llama-4l.json"))
    args = ["estimate", "--config", str(config), "--model", model, "--gpu", "H100", "--strategy", "ddp", "--json"]
    result = cli_runner.invoke(app, [*args, "--gpus", "4"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["setups"][0]["plan"]["micro_batches"] == 8
    said = "micro_batches 8: the config's global batch 16 / (micro-batch 1 x data-parallel 2)"
    assert said in " ".join(result.stderr.split())
    given = cli_runner.invoke(app, [*args, "--gpus", "4", "--micro-batches", "4"])
    assert json.loads(given.stdout)["setups"][0]["plan"]["micro_batches"] == 4
    said = "a step of 8 queries (micro-batch 1 x data-parallel 2 x --micro-batches 4), not the config's global batch 16"
    assert said in " ".join(given.stderr.split())
    odd = cli_runner.invoke(app, [*args, "--gpus", "6"])
    assert odd.exit_code == 2
    assert "global batch 16 is not a multiple of micro-batch 1 x data-parallel 3" in " ".join(odd.stderr.split())


def test_of_equal_cost_the_answer_is_the_layout_with_the_least_memory_per_rank(cli_runner, tmp_path):
    """Pipeline stages over 2 GPUs leave one data-parallel rank: ddp and zero1 cost the same there, and the answer
    (and the table's first row) is the one that needs less memory per rank (ddp, no fp32 master copy)."""
    config = tmp_path / "megatron.yaml"
    config.write_text(MEGATRON_LM, encoding="utf-8")
    model = str(Path(DENSE).with_name("tiny-llama-4l.json"))
    args = ["estimate", "--config", str(config), "--model", model, "--gpu", "H100", "--gpus", "2"]
    result = cli_runner.invoke(app, [*args, "--strategy", "zero1,ddp"], terminal_width=200)
    assert result.exit_code == 0, result.output
    answer = next(line for line in result.stdout.splitlines() if line.startswith("answer:"))
    assert "(pp2)" in answer
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    assert "pp2 zero1" not in rows[0] and "pp2 zero1" in rows[1]


def test_a_model_other_than_the_megatron_files_architecture_is_warned(cli_runner, tmp_path):
    """A Megatron-LM file states its architecture: --model of another (a tiny Llama for a 4-layer, 64-wide file
    of other heads) is priced as asked, with one warning line naming both."""
    config = tmp_path / "megatron.yaml"
    config.write_text(
        MEGATRON_LM.replace("  num_layers: 4\n", "  num_layers: 4\n  hidden_size: 96\n  num_attention_heads: 3\n"),
        encoding="utf-8",
    )
    model = str(Path(DENSE).with_name("tiny-llama-4l.json"))
    args = ["estimate", "--config", str(config), "--model", model, "--gpu", "H100", "--strategy", "ddp", "--gpus", "4"]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    said = f"warning: --model {model} is not the architecture {config} states (4 layers, hidden 96, 3 heads"
    assert "".join(said.split()) in "".join(result.stderr.split())  # rich wraps a long path anywhere
    its_own = "  num_layers: 4\n  hidden_size: 64\n  num_attention_heads: 4\n  num_query_groups: 2\n"
    its_own += "  activation_func: swiglu\n"  # Megatron-LM's FFN: 2/3 of 4 x 64, the tiny Llama's 128
    config.write_text(MEGATRON_LM.replace("  num_layers: 4\n", its_own), encoding="utf-8")
    same = cli_runner.invoke(app, args)
    assert same.exit_code == 0 and "warning: --model" not in same.stderr
