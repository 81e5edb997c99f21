"""Dense models in the step simulator: Llama (GQA, tied embeddings) and Qwen2 (q/k/v biases) simulate, and the
layer scaling used for every full-size model is exact for dense decoder stacks too."""

from __future__ import annotations

import json

import pytest
from tiny_models import dense_lora_job

from tunecost.simulate import simulate_step

TINY = {
    "llama": {"model_type": "llama", "tie_word_embeddings": True},
    "qwen2": {"model_type": "qwen2", "tie_word_embeddings": False, "use_sliding_window": False},
}


@pytest.mark.parametrize("family", sorted(TINY))
@pytest.mark.parametrize("stack", ["tunecost", "hf-peft"])
def test_dense_scaling_matches_the_full_trace(tmp_path, family, stack) -> None:
    config = {
        **TINY[family],
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 5,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 200,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    job = dense_lora_job(path)
    full = simulate_step(job.with_(stack=stack), num_layers_to_trace=99, use_cache=False)
    scaled = simulate_step(job.with_(stack=stack), num_layers_to_trace=3, use_cache=False)
    assert full.layers_traced == (5,) and scaled.layers_traced == (2, 3)
    assert scaled.peak_bytes == pytest.approx(full.peak_bytes, rel=0.01)
    assert scaled.flops_per_step == pytest.approx(full.flops_per_step, rel=1e-6)
    # LoRA on q, k, v, o, gate, up, down of 5 layers, fp32: rank x (in + out) per matrix, 4 bytes each
    kv = 2 * (64 // 4)  # key/value width: 2 heads of head_dim 16
    per_layer = 4 * ((64 + 64) + 2 * (64 + kv) + (64 + 64) + 2 * (64 + 96) + (96 + 64))
    assert full.breakdown_bytes["trainable_params"] >= 5 * per_layer * 4
