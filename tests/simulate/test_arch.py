"""GPTBigCode (SantaCoder: multi-query attention in one fused `c_attn`, learned positions, LayerNorm, GELU MLP) and
GraniteMoe (fused 3-D experts under `block_sparse_moe`, a `router`; GraniteMoeShared adds a shared MLP) in the step
simulator: the model it steps is transformers' own (same parameter count), LoRA lands on the named targets, and
layer scaling is exact."""

from __future__ import annotations

import pytest
import torch

from tunecost.simulate import simulate_step
from tunecost.simulate.hf2024 import Loop2024Experts
from tunecost.simulate.modules import SimExperts, SimLinear, SimLoraRouter
from tunecost.simulate.prepare import build_prepared
from tunecost.workload.job import FineTuneJob, LoraConfig

# family fixture -> LoRA targets that exist in it (rank 8: grouped expert GEMMs need 16-byte strides in bf16)
CASES = {
    "tiny-gpt-bigcode": ("attention", "mlp"),
    "tiny-granitemoe": ("attention", "experts", "router"),
    "tiny-granitemoeshared": ("attention", "experts", "router"),
    "tiny-gpt-oss": ("attention", "experts", "router"),
}


def _job(config_path, name: str, method: str = "lora", **kw) -> FineTuneJob:
    lora = LoraConfig(rank=8, alpha=16, targets=CASES[name])
    return FineTuneJob(model=config_path(name), method=method, lora=lora, batch_size=2, seq_len=32, **kw)


@pytest.mark.parametrize("name", sorted(CASES))
def test_parameter_count_is_transformers(config_path, name) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    prepared = build_prepared(_job(config_path, name, method="full"), num_units=None)
    config = AutoConfig.from_pretrained(config_path(name))
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    assert type(prepared.model) is type(reference)
    simulated = sum(p.numel() for p in prepared.model.parameters())
    assert simulated == sum(p.numel() for p in reference.parameters())


def test_gpt_bigcode_parameter_count_by_hand(config_path) -> None:
    # n_embd 64, 4 heads of 16, one key/value head (multi-query): c_attn 64 -> 64 + 2 x 16, with biases
    h, inner, vocab, positions, layers = 64, 96, 256, 64, 5
    per_layer = (h * (h + 32) + h + 32) + (h * h + h) + (h * inner + inner) + (inner * h + h) + 2 * 2 * h
    expected = vocab * h + positions * h + layers * per_layer + 2 * h  # wte (tied head), wpe, blocks, ln_f
    prepared = build_prepared(_job(config_path, "tiny-gpt-bigcode", method="full"), num_units=None)
    assert sum(p.numel() for p in prepared.model.parameters()) == expected


def test_gpt_bigcode_lora_on_fused_projections(config_path) -> None:
    prepared = build_prepared(_job(config_path, "tiny-gpt-bigcode"), num_units=None)
    layers = prepared.model.transformer.h
    assert len(layers) == 5
    for layer in layers:
        for linear in (layer.attn.c_attn, layer.attn.c_proj, layer.mlp.c_fc, layer.mlp.c_proj):
            assert isinstance(linear, SimLinear) and linear.lora_rank == 8
    # trainable: rank x (in + out) per LoRA'd matrix, nothing else (embeddings, norms, biases frozen)
    h, kv, inner, r = 64, 16, 96, 8
    per_layer = r * ((h + h + 2 * kv) + (h + h) + (h + inner) + (inner + h))
    assert sum(p.numel() for p in prepared.trainable) == 5 * per_layer


def test_granitemoe_lora_on_experts_and_router(config_path) -> None:
    prepared = build_prepared(_job(config_path, "tiny-granitemoe"), num_units=None)
    for layer in prepared.model.model.layers:
        block = layer.block_sparse_moe
        assert isinstance(block.experts, SimExperts) and block.experts.lora_rank == 8
        assert isinstance(block.router, SimLoraRouter)
        assert isinstance(layer.self_attn.q_proj, SimLinear) and layer.self_attn.q_proj.lora_rank == 8
    assert prepared.is_moe and prepared.num_experts == 4 and prepared.top_k == 2
    # attention q, k, v, o (4 heads of 16, 2 key/value heads), 4 experts x (gate, up, down), router (4 x 64)
    h, kv, inner, experts, r = 64, 32, 32, 4, 8
    attention = r * ((h + h) + 2 * (h + kv) + (h + h))
    per_layer = attention + experts * 3 * r * (h + inner) + r * (h + experts)
    assert sum(p.numel() for p in prepared.trainable) == 5 * per_layer


def test_granitemoeshared_shared_mlp_takes_the_experts_lora(config_path) -> None:
    """GraniteMoeShared's always-on `shared_mlp` (fused gate/up `input_linear`, `output_linear`) is expert work:
    LoRA on experts adapts it too, as PEFT's target names would (input_linear, output_linear)."""
    prepared = build_prepared(_job(config_path, "tiny-granitemoeshared"), num_units=None)
    h, kv, inner, shared, experts, r = 64, 32, 32, 48, 4, 8
    for layer in prepared.model.model.layers:
        for linear in (layer.shared_mlp.input_linear, layer.shared_mlp.output_linear):
            assert isinstance(linear, SimLinear) and linear.lora_rank == 8
        assert isinstance(layer.block_sparse_moe.experts, SimExperts)
    attention = r * ((h + h) + 2 * (h + kv) + (h + h))
    per_layer = attention + experts * 3 * r * (h + inner) + r * (h + experts) + r * ((h + 2 * shared) + (shared + h))
    assert sum(p.numel() for p in prepared.trainable) == 5 * per_layer


def test_gpt_oss_experts_keep_their_biases_and_take_one_lora_on_the_fused_gate_up(config_path) -> None:
    """gpt-oss: experts transposed (`gate_up_proj` (E, H, 2I), gate and up interleaved) with biases, a router with a
    bias, q/k/v/o with biases; LoRA on experts is one A/B on the fused gate/up and one on down, per expert."""
    prepared = build_prepared(_job(config_path, "tiny-gpt-oss"), num_units=None)
    h, heads, kv_heads, head_dim, inner, experts, r = 64, 4, 2, 16, 48, 4, 8
    for layer in prepared.model.model.layers:
        sim = layer.mlp.experts
        assert isinstance(sim, SimExperts) and sim.layout == "interleaved" and sim.lora_rank == 8
        assert tuple(sim.gate_up_proj.shape) == (experts, 2 * inner, h) and tuple(sim.gate_up_bias.shape) == (4, 96)
        assert tuple(sim.down_proj.shape) == (experts, h, inner) and tuple(sim.down_bias.shape) == (experts, h)
        assert isinstance(layer.mlp.router, SimLoraRouter)
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = r * ((h + q) + 2 * (h + kv) + (q + h))
    per_layer = attention + experts * r * ((h + 2 * inner) + (inner + h)) + r * (h + experts)
    assert sum(p.numel() for p in prepared.trainable) == 5 * per_layer


def test_gpt_oss_experts_compute_what_transformers_computes() -> None:
    """On real tensors SimExperts (frozen weights, no LoRA) and the 2024 stack's per-expert loop give GptOssExperts'
    own output."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    torch.manual_seed(0)
    config = GptOssConfig(hidden_size=16, intermediate_size=12, num_local_experts=4, num_experts_per_tok=2)
    experts = GptOssExperts(config)
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(10, 16)
    index = torch.stack([torch.randperm(4)[:2] for _ in range(10)])
    weights = torch.rand(10, 2)
    sim = SimExperts(experts, quant=None, lora_rank=None)
    torch.testing.assert_close(sim(x, index, weights), experts(x, index, weights), rtol=1e-5, atol=1e-5)
    loop = Loop2024Experts(experts, quant=None, lora_rank=None, lora_alpha=0.0, trainable=True)  # per-expert Linears
    torch.testing.assert_close(loop(x, index, weights), experts(x, index, weights), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_scaling_matches_the_full_trace(config_path, name, method) -> None:
    job = _job(config_path, name, method=method)
    full = simulate_step(job.with_(stack="hf-peft"), num_layers_to_trace=99, use_cache=False)
    scaled = simulate_step(job.with_(stack="hf-peft"), num_layers_to_trace=3, use_cache=False)
    assert full.layers_traced == (5,) and scaled.layers_traced == (2, 3)
    assert scaled.peak_bytes == pytest.approx(full.peak_bytes, rel=0.01)
    assert scaled.flops_per_step == pytest.approx(full.flops_per_step, rel=1e-6)
    assert full.module_bytes.get("attention", 0) > 0 and full.module_bytes.get("embedding", 0) > 0


def test_fused_attention_keeps_no_dropout_mask(config_path, write_file) -> None:
    """SantaCoder trains with attention dropout 0.1: a fused kernel (FlashAttention-2 / SDPA) keeps only its RNG
    state, so its peak equals the dropout-free model's; eager attention keeps the (B, heads, L, L) mask too."""
    import json
    from pathlib import Path

    config = json.loads(Path(config_path("tiny-gpt-bigcode")).read_text(encoding="utf-8"))
    without = write_file("no-dropout.json", json.dumps({**config, "attn_pdrop": 0.0}))
    peaks = {}
    for attention in ("flash", "eager"):
        for label, model in (("dropout", config_path("tiny-gpt-bigcode")), ("none", str(without))):
            lora = LoraConfig(rank=8, alpha=16, targets=("attention",))
            job = FineTuneJob(
                model=model, lora=lora, batch_size=4, seq_len=64, attention=attention, gradient_checkpointing=False
            )
            peaks[attention, label] = simulate_step(job.with_(stack="hf-peft"), use_cache=False).peak_bytes
    assert peaks["flash", "dropout"] == peaks["flash", "none"]
    assert peaks["eager", "dropout"] > peaks["eager", "none"]
