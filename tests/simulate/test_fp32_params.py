"""A full fine-tune over fp32 parameters under autocast (torch AMP, `FineTuneJob.fp32_params`): fp32 weights,
gradients and AdamW states, the simulated peak equal to the one the CPU allocator reports for the same step."""

from __future__ import annotations

import json

import pytest

from tunecost.errors import TunecostError
from tunecost.simulate import simulate_step
from tunecost.simulate.measure import measure_step_peak
from tunecost.workload.job import FineTuneJob, LoraConfig
from tunecost.workload.parallel import ParallelPlan

LLAMA = {
    "model_type": "llama",
    "tie_word_embeddings": False,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 200,
}


@pytest.fixture
def llama(tmp_path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA), encoding="utf-8")
    return str(path)


def _job(model: str, **changes) -> FineTuneJob:
    return FineTuneJob(**{"model": model, "method": "full", "batch_size": 2, "seq_len": 16, **changes})


@pytest.mark.parametrize("checkpointing", [True, False])
def test_fp32_parameters_double_the_stored_bytes_and_match_the_cpu_allocator(llama, checkpointing) -> None:
    bf16_job = _job(llama, gradient_checkpointing=checkpointing)
    bf16 = simulate_step(bf16_job, num_layers_to_trace=99, granule_bytes=1, use_cache=False)
    amp_job = _job(llama, gradient_checkpointing=checkpointing, fp32_params=True)
    amp = simulate_step(amp_job, num_layers_to_trace=99, granule_bytes=1, use_cache=False)
    for part in ("trainable_params", "optimizer_states"):
        assert amp.breakdown_bytes[part] == pytest.approx(2 * bf16.breakdown_bytes[part], rel=0.01)
    assert amp.peak_bytes > 1.5 * bf16.peak_bytes
    assert any("torch AMP" in a for a in amp.assumptions)
    measured = measure_step_peak(amp_job)  # real CPU tensors under CPU autocast, the allocator's own events
    assert measured.num_events > 100
    assert abs(amp.peak_bytes - measured.peak_bytes) <= 0.03 * measured.peak_bytes


def test_the_layer_scaling_holds_under_autocast(llama) -> None:
    job = _job(llama, fp32_params=True)
    full = simulate_step(job, num_layers_to_trace=99, use_cache=False)
    scaled = simulate_step(job, num_layers_to_trace=3, use_cache=False)
    assert scaled.layers_traced == (2, 3) and scaled.peak_bytes == pytest.approx(full.peak_bytes, rel=0.01)


def test_lora_over_fp32_frozen_weights_doubles_them_and_matches_the_cpu_allocator(llama) -> None:
    """TRL's default fp32 load and litgpt's bf16-mixed under LoRA: the frozen weights fp32, each cast where used."""
    lora = dict(method="lora", lora=LoraConfig(rank=8, targets=("attention", "mlp")))
    bf16 = simulate_step(_job(llama, **lora), num_layers_to_trace=99, granule_bytes=1, use_cache=False)
    amp_job = _job(llama, **lora, fp32_params=True)
    amp = simulate_step(amp_job, num_layers_to_trace=99, granule_bytes=1, use_cache=False)
    assert amp.breakdown_bytes["frozen_weights"] == pytest.approx(2 * bf16.breakdown_bytes["frozen_weights"], rel=0.01)
    assert amp.breakdown_bytes["trainable_params"] == bf16.breakdown_bytes["trainable_params"]  # fp32 adapters
    assert any("frozen weights in fp32" in a for a in amp.assumptions)
    measured = measure_step_peak(amp_job)
    assert abs(amp.peak_bytes - measured.peak_bytes) <= 0.03 * measured.peak_bytes


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(method="qlora"), "use --method full or lora"),
        (dict(compute_dtype="fp32"), "bf16 or fp16 autocast"),
        (dict(parallel=ParallelPlan(num_gpus=2, strategy="zero3")), "layout zero3: DeepSpeed and Megatron"),
        (
            dict(parallel=ParallelPlan(num_gpus=4, strategy="fsdp2", tp=2)),
            "layout tp2 fsdp2: fp32 parameters beside TP",
        ),
        (dict(method="lora", parallel=ParallelPlan(num_gpus=2, strategy="zero2")), "is one GPU, DDP or FSDP"),
    ],
)
def test_fp32_parameters_are_amp_or_fsdp_mixed_precision(llama, changes, message) -> None:
    with pytest.raises(TunecostError, match=message):
        _job(llama, fp32_params=True, **changes)
    for strategy in ("ddp", "fsdp2", "fsdp1", "hsdp"):
        _job(llama, fp32_params=True, parallel=ParallelPlan(num_gpus=2, strategy=strategy))
        _job(llama, fp32_params=True, method="lora", parallel=ParallelPlan(num_gpus=2, strategy=strategy))


def test_the_cli_prices_fp32_parameters_and_refuses_them_where_they_do_not_apply(cli_json, cli_error, llama) -> None:
    """`memory --fp32-params`: fp32 weights and states in the answer; beside QLoRA or a DeepSpeed strategy, one
    error line."""
    options = dict(model=llama, method="full", batch_size=2, seq_len=16)
    bf16, amp = cli_json("memory", **options), cli_json("memory", **options, fp32_params=True)
    for part in ("optimizer_states", "gradients"):
        assert amp["breakdown"][part] == pytest.approx(2 * bf16["breakdown"][part], rel=0.01)
    assert "--method qlora stores them in 4 bits" in cli_error(
        ["estimate", "--model", "llama-3.2-1b", "--method", "qlora", "--fp32-params", "--gpu", "H100"]
    )
    assert "--strategy zero3 with --fp32-params: use ddp or fsdp2 or fsdp1 or hsdp" in cli_error(
        ["estimate", "--model", "llama-3.2-1b", "--method", "full", "--fp32-params", "--gpu", "H100", "--gpus", "2",
         "--strategy", "zero3", "--seq-len", "512", "--epochs", "1", "--queries", "100"]
    )  # fmt: skip
    assert "--offload params: CPU offload of fp32 parameters is not modelled; drop --offload" in cli_error(
        ["estimate", "--model", "llama-3.2-1b", "--method", "full", "--fp32-params", "--gpu", "H100", "--gpus", "2",
         "--offload", "params", "--seq-len", "512", "--epochs", "1", "--queries", "100"]
    )  # fmt: skip


def test_a_litgpt_config_on_one_device_is_priced_with_fp32_weights(cli_ok, tmp_path) -> None:
    """litgpt's bf16-mixed on one device: `estimate` and `plan` price one GPU, though litgpt's several-device
    strategies (FSDP) do not hold fp32 parameters under autocast."""
    config = tmp_path / "full.yaml"
    config.write_text(
        "checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B\nprecision: bf16-mixed\ndevices: 1\n"
        "train:\n  micro_batch_size: 2\n  max_seq_length: 256\n"
    )
    for command in ("estimate", "plan"):
        result = cli_ok(command, config=str(config), gpu="H100", queries=100)
        assert "fp32_params: precision bf16-mixed" in result.stderr
        assert "1 x H100-80GB-SXM" in result.stdout.splitlines()[0], result.stdout
