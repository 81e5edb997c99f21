"""Dense families beyond Llama/Mistral/Qwen2 (Qwen3, Gemma, Gemma 2, Gemma 3, Phi, Phi-3, Granite): a tiny random
config of each builds through the catalog path with the parameters of transformers' own model, its LoRA targets are
found, and the step simulator runs it."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import dense_lora_job

from tunecost.models.build import build_model
from tunecost.models.catalog import resolve_model
from tunecost.models.params import count_parameters

_SIZES = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 200,
    "max_position_embeddings": 128,
}
FAMILIES = {
    "qwen3": {"head_dim": 16, "tie_word_embeddings": True},
    "gemma": {"head_dim": 16},
    "gemma2": {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 64},
    "gemma3_text": {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 64, "sliding_window_pattern": 2},
    "phi": {"partial_rotary_factor": 0.5},
    "phi3": {"tie_word_embeddings": False, "pad_token_id": 0, "eos_token_id": 2},  # defaults: token 32000
    "granite": {"embedding_multiplier": 12.0, "residual_multiplier": 0.22, "logits_scaling": 8.0},
}
# a LoRA target module of each family's attention and MLP (Phi-3 fuses q/k/v and gate/up; Phi's MLP is fc1/fc2)
TARGETS = {
    "qwen3": ("self_attn.q_proj", "mlp.gate_proj"),
    "gemma": ("self_attn.q_proj", "mlp.gate_proj"),
    "gemma2": ("self_attn.q_proj", "mlp.gate_proj"),
    "gemma3_text": ("self_attn.q_proj", "mlp.gate_proj"),
    "phi": ("self_attn.dense", "mlp.fc1"),
    "phi3": ("self_attn.qkv_proj", "mlp.gate_up_proj"),
    "granite": ("self_attn.q_proj", "mlp.gate_proj"),
}


def _config_file(tmp_path, family: str):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": family, **_SIZES, **FAMILIES[family]}), encoding="utf-8")
    return path


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_counted_parameters_are_transformers_models(tmp_path, family) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    path = _config_file(tmp_path, family)
    spec = resolve_model(str(path))
    assert spec.family == family and not spec.is_moe
    config = AutoConfig.from_pretrained(str(tmp_path))
    config._attn_implementation = "eager"
    reference = AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in reference.parameters())  # tied weights once
    assert count_parameters(spec).total == expected
    built = build_model(spec, device="meta")
    assert {n for n, _ in built.named_parameters()} == {n for n, _ in reference.named_parameters()}


def test_phi3_fused_projections_by_hand(tmp_path) -> None:
    """Phi-3: one qkv_proj of (heads + 2 kv heads) x head_dim outputs, one gate_up_proj of 2 x intermediate."""
    spec = resolve_model(str(_config_file(tmp_path, "phi3")))
    model = build_model(spec, device="meta")
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    head_dim = 64 // 4
    assert tuple(attn.qkv_proj.weight.shape) == ((4 + 2 * 2) * head_dim, 64)
    assert tuple(mlp.gate_up_proj.weight.shape) == (2 * 96, 64)
    h, inter, vocab, layers = 64, 96, 200, 3
    per_layer = (4 + 4) * head_dim * h + h * h + 2 * inter * h + inter * h + 2 * h  # qkv, o, gate_up, down, 2 norms
    assert count_parameters(spec).total == 2 * vocab * h + layers * per_layer + h


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_lora_targets_found_and_step_simulates(tmp_path, family) -> None:
    from tunecost.simulate import simulate_step
    from tunecost.simulate.modules import SimLinear
    from tunecost.simulate.prepare import transform

    path = _config_file(tmp_path, family)
    job = dense_lora_job(path)
    model = build_model(resolve_model(str(path)), device="meta", dtype=torch.bfloat16)
    transform(model, job)
    layer = model.model.layers[0]
    for target in TARGETS[family]:
        module = layer.get_submodule(target)
        assert isinstance(module, SimLinear)
        assert any(p.requires_grad for p in module.parameters())
    result = simulate_step(job, use_cache=False)
    assert result.peak_bytes > 0 and result.breakdown_bytes["trainable_params"] > 0
