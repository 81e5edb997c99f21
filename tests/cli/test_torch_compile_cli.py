"""`--torch-compile` end to end: the throughput counts fuse each layer's element-wise chains, memory stays eager's."""

from __future__ import annotations

JOB = {"model": "qwen2.5-0.5b", "method": "lora", "gpu": "A100-80GB", "dataset": "gsm8k-train", "epochs": 1}


def test_compiled_step_is_faster_and_fits_the_same_batch(cli_json) -> None:
    eager, compiled = (cli_json("estimate", **JOB, batch_size=8, torch_compile=c)[0] for c in (False, True))
    assert compiled["queries_per_s"] > eager["queries_per_s"]
    assert compiled["max_batch_size"] == eager["max_batch_size"]  # the simulated step is eager's
    assert "torch.compile" in compiled["notes"] and "torch.compile" not in eager["notes"]


def test_a_config_that_compiles_reaches_the_estimate(cli_json, tmp_path) -> None:
    config = tmp_path / "lora.yaml"
    config.write_text(
        "model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nfinetuning_type: lora\ncutoff_len: 512\n"
        "per_device_train_batch_size: 8\ntorch_compile: true\n"
    )
    rows = cli_json("estimate", config=str(config), gpu="A100-80GB", dataset="gsm8k-train", epochs=1)
    assert "each layer's element-wise chains counted fused" in rows[0]["notes"]


def test_memory_is_the_eager_steps_and_says_so(cli_json) -> None:
    job = {"model": "qwen2.5-0.5b", "method": "lora", "seq_len": 256, "batch_size": 2}
    eager, compiled = (cli_json("memory", **job, torch_compile=c) for c in (False, True))
    assert compiled["peak_bytes"] == eager["peak_bytes"]
    assert "eager step's memory" in compiled["torch_compile"] and "torch_compile" not in eager
