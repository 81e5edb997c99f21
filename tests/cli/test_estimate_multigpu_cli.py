"""`tunecost estimate --gpus/--strategy` through typer's CliRunner: the multi-GPU answer and its one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunecost.cli.main import app
from tunecost.limits import MAX_BATCH_SIZE, MAX_SEARCH_GPUS

TINY = str(Path(__file__).parents[1] / "fixtures" / "distributed" / "tiny-mixtral-2l.json")
DENSE = str(Path(__file__).parents[1] / "fixtures" / "distributed" / "tiny-llama-2l.json")
RUN = ["estimate", "--epochs", "1", "--queries", "100"]
BASE = [*RUN, "--method", "lora"]


@pytest.mark.long
@pytest.mark.slow
def test_mixtral_lora_on_8_h100_fits_under_fsdp2_not_ddp(cli_runner):
    """DDP keeps the whole bf16 model (93.4 GB of frozen weights) on every rank: more than 80 GiB; FSDP2 keeps
    1/8 of it plus the gathered layers."""
    args = [*BASE, "--model", "mixtral-8x7b", "--gpu", "H100", "--gpus", "8", "--strategy", "ddp,fsdp2", "--json"]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    setups = {s["plan"]["strategy"]: s for s in json.loads(result.stdout)["setups"]}
    ddp, fsdp2 = setups["ddp"], setups["fsdp2"]
    assert ddp["memory"]["breakdown_bytes"]["frozen_weights"] > ddp["gpu"]["memory_gib"] * 2**30
    assert ddp["cost"] is None and ddp["timing"] is None
    assert fsdp2["memory"]["breakdown_bytes"]["frozen_weights"] * 8 == pytest.approx(
        ddp["memory"]["breakdown_bytes"]["frozen_weights"], abs=8
    )
    assert fsdp2["cost"]["usd"] > 0
    assert fsdp2["timing"]["step_seconds"] > fsdp2["timing"]["compute_seconds"]


@pytest.mark.long
def test_ddp_that_does_not_fit_says_why(cli_runner):
    args = [*BASE, "--model", "mixtral-8x7b", "--gpu", "H100", "--gpus", "2", "--strategy", "ddp"]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "ddp on 2 x H100-80GB-SXM does not fit" in text
    assert "the whole model and its states replicated per rank: frozen_weights 93.41 GB" in text
    assert "needs 100.7" in text and "as nvidia-smi shows it (the allocator's reserve of" in text  # the table's GB/rank
    # no data-parallel layout holds it on 2 GPUs: the same count's tensor-parallel layouts are searched and answer
    assert "answer: 2 x H100-80GB-SXM (tp" in text


def test_no_layout_that_fits_is_the_answer(cli_runner):
    """QLoRA's 4-bit weights are not split by tensor parallelism: Mixtral on 2 T4s under ddp has nothing to try."""
    args = ["estimate", "--epochs", "1", "--queries", "100", "--method", "qlora", "--model", "mixtral-8x7b"]
    result = cli_runner.invoke(app, [*args, "--gpu", "T4", "--gpus", "2", "--strategy", "ddp"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "answer: no setup fits with the safety margin; --gpus auto finds the counts that do" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--gpus", "12", "--gpus-per-node", "8"], "cannot be split into whole nodes"),
        (["--gpus", "8", "--strategy", "zero4"], "unknown strategy"),
        (["--gpus", "8", "--interconnect", "carrier-pigeon"], "unknown interconnect"),
        (["--gpus", "many"], "--gpus must be a whole number or 'auto'"),
        (["--gpus", "2", "--batch-size", "A40=4"], "--batch-size is one whole number"),
        (["--strategy", "fsdp2", "--estimator", "simulate"], "apply to one GPU only"),
        (
            ["--gpus", "8", "--expert-parallel", "3"],
            "expert-parallel degree 3 must be at least 1 and divide the 8 GPUs",
        ),
        (
            ["--gpus", "16", "--expert-parallel", "16"],
            "expert-parallel degree 16 does not divide the model's 8 experts",
        ),
        (["--model", DENSE, "--gpus", "4", "--expert-parallel", "2"], "needs an MoE model; " + DENSE + " is dense"),
        (["--gpus", "4", "--strategy", "hsdp", "--expert-parallel", "2"], "with hsdp is not modelled"),
        (["--gpus", "4", "--strategy", "ddp", "--offload", "optimizer"], "for zero1/zero2/zero3 only; not for ddp"),
        (["--gpus", "4", "--strategy", "hsdp", "--offload", "params"], "for zero3/fsdp1/fsdp2 only; not for hsdp"),
        (["--gpus", "4", "--offload", "nvme"], "unknown offload 'nvme'"),
        (["--model", DENSE, "--gpus", "2", "--tp", "2", "--liger-kernel"], "with Liger's kernels is not modelled"),
    ],
)
def test_bad_multi_gpu_input_is_a_one_line_error(cli_runner, extra, message):
    model = [] if "--model" in extra else ["--model", TINY]
    _assert_one_error_line(cli_runner.invoke(app, [*BASE, *model, "--gpu", "H100", *extra]), message)


@pytest.mark.slow
def test_a_job_that_fits_no_count_up_to_the_limit_is_a_one_line_error(cli_runner):
    """A full fine-tune of Mixtral-8x7B (46.7B parameters) replicated by DDP on at most 2 RTX 4090s."""
    args = ["--model", "mixtral-8x7b", "--method", "full", "--gpu", "RTX4090", "--gpus", "auto", "--max-gpus", "2"]
    result = cli_runner.invoke(app, [*RUN, *args, "--strategy", "ddp"])
    _assert_one_error_line(result, "mixtral-8x7b (full) fits no setup of up to 2 GPUs")


def _assert_one_error_line(result, message: str) -> None:
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in " ".join(result.output.split())


@pytest.mark.parametrize(("option", "maximum"), [("--gpus", MAX_SEARCH_GPUS), ("--batch-size", MAX_BATCH_SIZE)])
@pytest.mark.parametrize("value", ["0", "-1", "2000000000", "100000000000000000000"])
def test_counts_past_their_bounds_are_one_error_line(cli_runner, option: str, maximum: int, value: str) -> None:
    args = ["estimate", "--model", "mixtral-8x7b", "--gpu", "A40", "--dataset", "math_14k", "--epochs", "1"]
    result = cli_runner.invoke(app, [*args, option, value])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [f"error: {option} must be between 1 and {maximum}, got {value}"]


@pytest.mark.parametrize(
    ("extra", "strategies"),
    [
        pytest.param(  # 13 s on 2 cores: CI only (the long marker); the combined case below keeps EP in make test
            ["--expert-parallel", "2"],
            {"ddp", "fsdp2", "fsdp2-shard-grad-op", "zero1", "zero2", "zero3"},
            marks=pytest.mark.long,
        ),
        (["--offload", "optimizer"], {"zero1", "zero2", "zero3"}),
        (["--offload", "params"], {"zero3", "fsdp1", "fsdp2"}),  # ZeRO-3's parameter offload, FSDP's CPU offload
        (["--offload", "params", "--expert-parallel", "2"], {"zero3", "fsdp2"}),
    ],
)
def test_all_strategies_means_those_that_take_the_options(cli_runner, extra, strategies):
    result = cli_runner.invoke(app, [*BASE, "--model", TINY, "--gpu", "H100", "--gpus", "4", *extra, "--json"])
    assert result.exit_code == 0, result.output
    setups = json.loads(result.stdout)["setups"]
    assert {s["plan"]["strategy"] for s in setups} == strategies
    assert all(s["plan"]["expert_parallel"] == (2 if "--expert-parallel" in extra else 1) for s in setups)
    assert all(s["memory"]["peak_reserved_bytes"] >= s["memory"]["peak_bytes"] for s in setups)


def test_a_catalog_datasets_length_is_said_as_on_one_gpu(cli_runner):
    """Without --seq-len or a data file, several GPUs size memory at eq. (1)'s 512 tokens and price the compute
    over the dataset's lengths, as one GPU does, and say so; a dataset the catalog has no length for is the one-GPU
    path's error."""
    args = ["estimate", "--epochs", "1", "--model", DENSE, "--gpu", "H100", "--gpus", "2", "--strategy", "fsdp2"]
    known = cli_runner.invoke(app, [*args, "--dataset", "math_14k", "--batch-size", "2"])
    assert known.exit_code == 0, known.output
    said = " ".join(known.output.split())
    assert "memory sized at 512 (the paper's eq. (1) length: math_14k has only a median length" in said
    assert "throughput over the dataset's length distribution" in said
    unknown = cli_runner.invoke(app, [*args, "--dataset", "alpaca-cleaned"])
    _assert_one_error_line(unknown, "dataset alpaca-cleaned has no token-length statistic in the catalog")


def test_the_table_shows_each_ranks_nvidia_smi_memory(cli_runner):
    """The rank's replayed reserve plus the CUDA context and NCCL's memory, beside what it needs."""
    args = [*BASE, "--model", DENSE, "--gpu", "H100", "--gpus", "2", "--strategy", "fsdp2", "--batch-size", "2"]
    result = cli_runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    (setup,) = json.loads(result.stdout)["setups"]
    m = setup["memory"]
    assert m["peak_reserved_bytes"] > m["peak_bytes"]
    smi = m["peak_reserved_bytes"] + m["device_overhead_bytes"] + m["nccl_bytes"]
    lines = cli_runner.invoke(app, args, terminal_width=250).stdout.splitlines()
    header = next(line for line in lines if "GB/rank" in line)
    row = next(line for line in lines if "fsdp2" in line and "│" in line)
    cells = dict(zip([c.strip() for c in header.split("┃")], [c.strip() for c in row.split("│")], strict=True))
    assert cells["GB/rank"] == f"{smi / 1e9:.1f}"  # what nvidia-smi shows


def test_out_records_every_setup_for_the_report(cli_runner, tmp_path: Path):
    """`--out RUN` adds one multi_gpu record per (GPU, strategy, count) evaluated; the report draws them; a second
    run into the same folder is refused without --force."""
    from tunecost.report.html import build_report

    run = tmp_path / "run"
    args = [*BASE, "--model", TINY, "--gpu", "H100", "--gpus", "auto", "--max-gpus", "4", "--strategy", "ddp,fsdp2"]
    result = cli_runner.invoke(app, [*args, "--out", str(run)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run / "multi_gpu.jsonl").read_text(encoding="utf-8").splitlines()]
    layouts = {(s, n) for s in ("ddp", "fsdp2") for n in (2, 3, 4)} | {("single", 1)}  # one GPU is one layout
    assert {(r["strategy"], r["num_gpus"]) for r in rows} == layouts
    assert all(r["kind"] == "multi_gpu" and r["fits"] == (r["fit"] == "yes") for r in rows)
    assert "multi_gpu" in build_report(run).sections_shown
    again = cli_runner.invoke(app, [*args, "--out", str(run)])
    assert again.exit_code == 2 and "--force" in again.stderr
    assert cli_runner.invoke(app, [*args, "--out", str(run), "--force"]).exit_code == 0


def test_a_named_host_runs_the_ranks_and_the_offloaded_optimizer_step(cli_runner):
    """--host-cpu with --gpus: the named host's single-thread speed times each rank's host work and its memory the
    offloaded optimizer (two sockets of 8 DDR5-4800 channels for the DGX H100's Xeon, one of 2 DDR5-5200 channels
    for a Ryzen 9 7950X workstation)."""
    args = [*RUN, "--model", TINY, "--method", "full", "--gpu", "H100", "--gpus", "2", "--strategy", "zero2"]
    steps = {}
    for host, bandwidth in (
        ("Xeon Platinum 8480C", "614 GB/s, the datasheet bandwidth of 2"),
        ("Ryzen 9 7950X", "83 GB/s, the datasheet bandwidth of 1"),
    ):
        result = cli_runner.invoke(app, [*args, "--offload", "optimizer", "--host-cpu", host, "--json"])
        assert result.exit_code == 0, result.output
        answer = json.loads(result.stdout)
        steps[host] = answer["setups"][0]["timing"]["compute_seconds"]
        assert any(f"{bandwidth} x {host} (named)" in n for n in answer["notes"])
    assert steps["Ryzen 9 7950X"] != steps["Xeon Platinum 8480C"]


def test_a_strategy_on_one_gpu_is_said_to_be_one_gpu_alone(cli_runner):
    """--gpus 1 --strategy zero3 without offload: ZeRO-3 of one rank shards nothing, priced and said as one GPU."""
    args = [*BASE, "--model", DENSE, "--gpu", "H100", "--gpus", "1", "--strategy", "zero3", "--json"]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert [s["plan"]["strategy"] for s in answer["setups"]] == ["single"]
    assert "one GPU: zero3 shard and replicate nothing there; priced as one GPU alone" in answer["notes"]


def test_max_gpus_beside_a_named_count_is_an_error_not_ignored(cli_error):
    line = cli_error([*BASE, "--model", DENSE, "--gpu", "H100", "--gpus", "2", "--max-gpus", "4"])
    assert line == "error: --max-gpus bounds the search of --gpus auto; --gpus 2 names the count"


def test_searching_counts_of_an_moe_model_weighs_expert_parallel_layouts(cli_runner):
    """`--gpus auto` without --expert-parallel prices tiny-mixtral's layouts at expert-parallel 2 and 4 too (as
    `plan` does) and says so; a degree given, or a count given, prices that degree only."""
    args = [*BASE, "--model", TINY, "--gpu", "H100", "--max-gpus", "4", "--strategy", "ddp,fsdp2", "--json"]
    searched = json.loads(cli_runner.invoke(app, [*args, "--gpus", "auto"]).stdout)
    assert {s["plan"]["expert_parallel"] for s in searched["setups"]} == {1, 2, 4}
    assert "expert-parallel layouts searched too: degree 2, 4 (--expert-parallel sets one)" in searched["notes"]
    given = json.loads(cli_runner.invoke(app, [*args, "--gpus", "auto", "--expert-parallel", "1"]).stdout)
    assert {s["plan"]["expert_parallel"] for s in given["setups"]} == {1}
    assert [s for s in searched["setups"] if s["plan"]["expert_parallel"] == 1] == given["setups"]
    per_gpu = [[n for n in answer["notes"] if n.startswith("H100")] for answer in (searched, given)]
    assert per_gpu[0] == per_gpu[1]  # the GPU's links and first throughput once, as one search says them
    counted = cli_runner.invoke(app, [*args[:-5], "--strategy", "ddp", "--gpus", "4", "--json"])
    assert {s["plan"]["expert_parallel"] for s in json.loads(counted.stdout)["setups"]} == {1}
