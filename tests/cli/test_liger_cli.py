"""`--liger-kernel` end to end: the simulated step keeps no logits, so the same GPU fits a larger batch; the
throughput model counts Liger's kernels; a config's switch reaches the estimate and --emit writes it back."""

from __future__ import annotations

import pytest

JOB = {"model": "qwen2.5-0.5b", "method": "lora", "seq_len": 1024, "batch_size": 4}


def test_memory_drops_the_logits(cli_json) -> None:
    eager, liger = (cli_json("memory", **JOB, liger_kernel=on) for on in (False, True))
    vocab = 151936  # Qwen2.5's: the fp32 logits alone are 4 x 1024 x vocab x 4 bytes
    assert eager["peak_bytes"] - liger["peak_bytes"] > 4 * 1024 * vocab * 4
    assert any(a.startswith("Liger kernels") for a in liger["assumptions"])


@pytest.mark.long  # 15-50 s on 2 cores: every probed batch traces Liger's chunked loss (the step: the test below)
def test_estimate_fits_a_larger_batch_and_says_why(cli_json) -> None:
    job = {"model": "qwen2.5-0.5b", "method": "lora", "gpu": "RTX3080-10GB", "seq_len": 1024, "queries": 1000}
    eager, liger = (cli_json("estimate", **job, epochs=1, liger_kernel=on)[0] for on in (False, True))
    assert liger["max_batch_size"] > eager["max_batch_size"]
    assert "fused linear cross-entropy" in liger["notes"] and "Liger" not in eager["notes"]


def test_a_config_with_liger_reaches_the_step(cli_json, tmp_path) -> None:
    peaks = []
    for on in ("false", "true"):
        config = tmp_path / f"lora_{on}.yaml"
        config.write_text(
            "model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nfinetuning_type: lora\ncutoff_len: 1024\n"
            f"per_device_train_batch_size: 4\nenable_liger_kernel: {on}\n"
        )
        peaks.append(cli_json("memory", config=str(config))["peak_bytes"])
    assert peaks[0] - peaks[1] > 4 * 1024 * 151936 * 4
