"""`tunecost memory` through typer's CliRunner."""

from __future__ import annotations

import pytest
from tiny_models import gqa_attention, write_llama_config


def test_memory_json_with_gpu_memory(cli_json, config_path, write_file):
    lengths = write_file("lengths.txt", "12\n40\n33\n")
    out = cli_json(
        "memory",
        model=config_path("small-mixtral"),
        method="qlora",
        experts_per_token=2,
        batch_size=2,
        dataset_lengths=lengths,
        lora_rank=8,
        gpu_memory_gb=0.8,
    )
    for key in (
        "peak_bytes",
        "breakdown",
        "flops_per_step",
        "max_batch_size",
        "device_overhead_bytes",
        "assumptions",
        "weight_bytes",
    ):
        assert key in out
    assert out["seq_len"] == 40  # the longest query decides
    assert out["breakdown"]["weights_4bit"] > 0
    assert out["max_batch_size"] >= 1
    best = out["max_batch"]
    assert best["need_bytes"] == best["peak_reserved_bytes"] + best["device_overhead_bytes"]
    assert best["need_bytes"] * (1 + best["margin_fraction"]) <= 0.8e9


def test_memory_sizes_a_dataset_at_its_own_longest_query_cut_at_seq_len(cli_json, cli_error, config_path, write_file):
    import json

    from tunecost.workload.job_data import job_data
    from tunecost.workload.lengths import padded_length

    rows = [
        {"instruction": "Name a colour " * (1 + i % 7), "input": "", "output": "Blue " * (2 + i)} for i in range(30)
    ]
    data = write_file("train.json", json.dumps(rows))
    model = config_path("small-mixtral")
    lengths = job_data(str(data), model=model).lengths
    named = write_file("lengths.txt", "\n".join(map(str, lengths)))
    common = {"model": model, "method": "lora", "lora_rank": 8, "batch_size": 2}
    out = cli_json("memory", dataset=data, **common)
    assert (
        out["seq_len"] == padded_length(max(lengths))  # as estimate sizes it: padded as the collators pad
        and out["peak_bytes"] == cli_json("memory", dataset_lengths=named, **common)["peak_bytes"]
    )  # the same step as naming its lengths
    assert cli_json("memory", dataset=data, seq_len=16, **common)["seq_len"] == 16  # cut as the trainer cuts
    line = cli_error(["memory", "--model", model, "--dataset", str(data), "--dataset-lengths", str(named)])
    assert line == "error: give --dataset or --dataset-lengths, not both"


def test_memory_says_when_a_catalog_dataset_has_no_copy_here(cli_runner, monkeypatch, tmp_path) -> None:
    import json

    from tunecost.cli.main import app
    from tunecost.estimate.throughput.lengths import catalog_longest_tokens
    from tunecost.workload.lengths import padded_length

    monkeypatch.setenv("TUNECOST_DATA_DIR", str(tmp_path))  # no copy of commonsense_15k or alpaca there
    result = cli_runner.invoke(app, ["memory", "--model", "mistral-7b-v0.1", "--method", "lora", "--dataset",
                                     "gsm8k-train", "--seq-len", "1024", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    said = (  # the catalog's length statistic sizes it, as estimate sizes it: its longest query, padded
        "assumed: dataset gsm8k-train has no copy on this machine: sized at its longest query, 568 tokens, from the "
        "catalog's length statistic, as estimate sizes it"
    )
    assert "".join(result.stderr.split()) == "".join(said.split())  # rich wraps the line at its width
    assert json.loads(result.stdout)["seq_len"] == padded_length(catalog_longest_tokens("gsm8k-train", 1024)) == 568
    result = cli_runner.invoke(app, ["memory", "--model", "mistral-7b-v0.1", "--method", "lora", "--dataset",
                                     "alpaca", "--seq-len", "256", "--json"])  # fmt: skip
    said = "assumed: dataset alpaca has no copy on this machine: its lengths are not read; sized at --seq-len 256"
    assert "".join(result.stderr.split()) == "".join(said.split())  # no length statistic in the catalog
    result = cli_runner.invoke(app, ["memory", "--model", "mixtral-8x7b", "--dataset", "math_14k", "--json"])
    said = "assumed: dataset math_14k has no copy on this machine: its lengths are not read; sized at --seq-len 512"
    assert "".join(result.stderr.split()) == "".join(
        said.split()
    )  # the paper's median only: eq. (1)'s 512, as estimate
    assert json.loads(result.stdout)["seq_len"] == 512


def test_memory_table_output(cli_ok, config_path):
    small = config_path("small-mixtral")
    result = cli_ok("memory", model=small, method="lora", seq_len=32, lora_rank=8, gradient_checkpointing=False)
    assert "MiB" in result.stdout and "MB" in result.stdout and "PEAK" in result.stdout


def test_memory_errors_are_one_line(cli_error, config_path):
    line = cli_error(["memory", "--model", config_path("small-mixtral"), "--seq-len", "32", "--gpu-memory-gb", "0.001"])
    assert "does not fit even at batch size 1" in line and "short by" in line
    line = cli_error(["memory", "--model", config_path("tiny-blackmamba"), "--method", "lora"])
    assert "BlackMamba full fine-tuning only" in line
    line = cli_error(["memory", "--model", "llama-3.1-8b", "--method", "lora", "--lora-targets", "experts,router"])
    assert "dense model" in line


@pytest.mark.parametrize(("model", "targets"), [("llama-3.1-8b", "attention,mlp"), ("mixtral-8x7b", "experts,router")])
def test_memory_lora_targets_follow_the_model(cli_json, model: str, targets: str) -> None:
    """Without --lora-targets a dense model gets attention and MLP adapters, an MoE model experts and router:
    the same step as naming them."""
    by_default = cli_json("memory", model=model, method="lora", seq_len=64)
    named = cli_json("memory", model=model, method="lora", seq_len=64, lora_targets=targets)
    by_default.pop("seconds_taken")
    named.pop("seconds_taken")
    assert by_default == named


def test_memory_gptq_and_modules_to_save_options(cli_json, tmp_path):
    """--quant-type gptq stores the decoder's linear layers as auto-gptq buffers (fp16 compute by default);
    --modules-to-save trains copies of the named modules beside LoRA."""
    path = write_llama_config(
        tmp_path / "config.json",
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=128,
    )
    common = {"model": str(path), "seq_len": 16, "lora_rank": 4, "lora_targets": "attention,mlp", "no_cache": True}
    out = cli_json("memory", method="qlora", quant_type="gptq", gptq_group_size=32, **common)
    assert out["breakdown"]["weights_4bit"] > 0 and any("GPTQ" in a for a in out["assumptions"])
    plain = cli_json("memory", method="lora", **common)
    saved = cli_json("memory", method="lora", modules_to_save="embed_tokens,lm_head", **common)
    # the copies (bf16) and both AdamW states (bf16) of a 128 x 64 embedding and a 64 -> 128 head
    copies = 2 * 128 * 64 * 2
    assert saved["breakdown"]["optimizer_states"] - plain["breakdown"]["optimizer_states"] == 2 * copies


def test_memory_gptq_checkpoint_defaults(cli_error):
    """A GPTQ checkpoint of the catalog is simulated as GPTQ; bf16 compute is refused with the reason."""
    line = cli_error(["memory", "--model", "TheBloke/Mistral-7B-v0.1-GPTQ", "--dtype", "bf16", "--no-cache"])
    assert "fp16" in line


@pytest.mark.long  # CI runs it (7-15 s of work no other test shares)
def test_memory_with_a_catalog_gpu_is_sized_against_the_total_cuda_reports(cli_json, cli_ok, config_path):
    """`--gpu A40`: the budget is the 44.34 GiB an ECC-on A40 reports to CUDA, not its 48 GiB of chips, and the
    answer says so."""
    from tunecost.catalog.gpus import get_gpu

    small = config_path("small-mixtral")
    out = cli_json("memory", model=small, method="qlora", seq_len=32, lora_rank=8, gpu="A40")
    assert out["gpu"] == "A40-48GB" and out["gpu_memory_bytes"] == get_gpu("A40").usable_memory_bytes
    assert out["gpu_memory_note"] == "44.34 GiB, the total CUDA reports (datasheet 48 GB)"
    text = cli_ok("memory", model=small, method="qlora", seq_len=32, lora_rank=8, gpu="A40").stdout
    assert "Largest batch on A40-48GB (44.34 GiB, the total CUDA reports (datasheet 48 GB))" in text


def test_memory_torchtune_recipe_options(cli_json, cli_error, tmp_path) -> None:
    """--stack torchtune with its recipe options: the chunked loss keeps less than the fp32 logits, offload less
    still; the options name the stack they need."""
    sizes = gqa_attention(64, 4)
    config = write_llama_config(
        tmp_path / "config.json", intermediate_size=128, num_hidden_layers=2, vocab_size=4096, **sizes
    )
    common = dict(model=str(config), method="full", seq_len=64, batch_size=2, gradient_checkpointing=False)
    plain = cli_json("memory", stack="torchtune", **common)
    chunked = cli_json("memory", stack="torchtune", chunked_loss=True, **common)
    offloaded = cli_json("memory", stack="torchtune", chunked_loss=True, offload_activations=True, **common)
    assert plain["peak_bytes"] > chunked["peak_bytes"] > offloaded["peak_bytes"]
    in_backward = cli_json("memory", stack="torchtune", optimizer_in_backward=True, **common)
    assert any("optimizer in backward" in line for line in in_backward["assumptions"])
    assert any("CEWithChunkedOutputLoss" in line for line in chunked["assumptions"])
    line = cli_error(["memory", "--model", str(config), "--offload-activations"])
    assert "--offload-activations needs --stack torchtune or hf-peft" in line and "not 'tunecost'" in line


def test_memory_names_how_checkpointed_layers_are_recomputed(cli_json, tmp_path) -> None:
    """--non-reentrant under the re-entrant hf-peft stack: the simulation runs it and says so."""
    sizes = gqa_attention(64, 4)
    config = write_llama_config(
        tmp_path / "config.json", intermediate_size=128, num_hidden_layers=2, vocab_size=256, **sizes
    )
    common = dict(model=str(config), method="lora", seq_len=32, stack="hf-peft", no_cache=True)
    own = cli_json("memory", **common)
    named = cli_json("memory", non_reentrant=True, **common)
    assert any("re-entrant checkpointing (transformers' default)" in line for line in own["assumptions"])
    assert any("use_reentrant=False" in line for line in named["assumptions"])
    assert not any("transformers' default" in line for line in named["assumptions"])


def test_the_largest_batch_line_says_none_when_only_a_borderline_batch_fits():
    """With no batch inside the margin, the need shown is the borderline batch's, and the line says so."""
    from types import SimpleNamespace

    from tunecost.cli.commands.memory import _largest_batch_line

    common = {"margin_fraction": 0.37, "seq_len": 1024, "need_bytes": 84_860_000_000, "headroom_bytes": 170_000_000}
    none = _largest_batch_line(SimpleNamespace(batch_size=0, borderline_batch_size=7, **common), "H100")
    assert "safety margin: [bold]none[/bold] (batch 7 x 1024 tokens needs 84.86 GB" in none and "headroom" not in none
    some = _largest_batch_line(SimpleNamespace(batch_size=3, borderline_batch_size=7, **common), "H100")
    assert "[bold]3[/bold] x 1024 tokens" in some and "batch 7 is borderline" in some
