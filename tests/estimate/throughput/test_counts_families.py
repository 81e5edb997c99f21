"""Architecture numbers of the dense families beyond Llama/Mistral/Qwen2 (Qwen3, Gemma, Gemma 2, Phi, Phi-3,
Granite): parameter totals against transformers' own models, and the matmul and attention FLOPs by hand."""

from __future__ import annotations

import json

import pytest

from tunecost.estimate.throughput.counts import analytic_step_counts
from tunecost.estimate.throughput.lengths import empirical_lengths, fixed_lengths
from tunecost.estimate.throughput.mixers import windowed_sq_len_tokens2
from tunecost.models.catalog import resolve_model
from tunecost.models.families import arch_of
from tunecost.workload.job import FineTuneJob, LoraConfig

H, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 64, 96, 4, 4, 2, 32, 200
BASE = {
    "hidden_size": H,
    "intermediate_size": FFN,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "vocab_size": VOCAB,
    "max_position_embeddings": 256,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# (family, config keys beyond BASE): every option that changes a parameter count at least once
VARIANTS = [
    ("qwen3", {"head_dim": HEAD_DIM, "tie_word_embeddings": True}),
    ("qwen3", {"head_dim": HEAD_DIM, "attention_bias": True, "use_sliding_window": True, "sliding_window": 16}),
    ("gemma", {"head_dim": HEAD_DIM}),  # head_dim 32 > hidden / heads = 16
    ("gemma2", {"head_dim": HEAD_DIM, "query_pre_attn_scalar": HEAD_DIM, "sliding_window": 16}),
    ("gemma3_text", {"head_dim": HEAD_DIM, "query_pre_attn_scalar": HEAD_DIM, "sliding_window": 16}),
    ("gemma3_text", {"head_dim": HEAD_DIM, "sliding_window": 16, "attention_bias": True, "tie_word_embeddings": False}),
    ("phi", {"partial_rotary_factor": 0.5}),
    ("phi", {"partial_rotary_factor": 0.5, "qk_layernorm": True, "tie_word_embeddings": False}),
    ("phi3", {"tie_word_embeddings": False}),
    ("granite", {"attention_bias": True, "mlp_bias": True, "embedding_multiplier": 12.0, "logits_scaling": 8.0}),
]


def _spec(directory, family: str, extra: dict):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    path.write_text(json.dumps({"model_type": family, **BASE, **extra}), encoding="utf-8")
    return resolve_model(str(path))


def _transformers_total(tmp_path) -> int:
    """Parameters of transformers' own model of the config in `tmp_path`, built on the meta device (tied once)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(tmp_path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(("family", "extra"), VARIANTS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(VARIANTS)])
def test_arch_total_is_the_transformers_models(tmp_path, family: str, extra: dict) -> None:
    spec = _spec(tmp_path, family, extra)
    arch = arch_of(spec)
    assert arch.family == family and arch.num_experts == 1
    assert arch.total_params == _transformers_total(tmp_path)


@pytest.mark.parametrize("name", ["gemma-7b", "gemma-2-9b", "gemma-3-4b", "qwen3-8b", "phi-2", "phi-3-mini-4k"])
def test_catalog_arch_totals_match_the_meta_built_model(name: str) -> None:
    from tunecost.models.params import count_parameters

    spec = resolve_model(name)
    assert arch_of(spec).total_params == count_parameters(spec).total


@pytest.mark.parametrize(
    ("layers", "extra", "window_layers"),
    [
        (12, {}, 10),  # transformers' default pattern 6: layers 5 and 11 attend over the whole sequence
        (26, {"sliding_window_pattern": 6}, 22),  # Gemma 3 1B's config: full layers 5, 11, 17, 23
        (4, {"layer_types": ["sliding_attention", "full_attention", "full_attention", "sliding_attention"]}, 2),
    ],
)
def test_gemma3_window_layers_follow_the_pattern_and_q_k_norms_count(tmp_path, layers, extra, window_layers) -> None:
    spec = _spec(
        tmp_path, "gemma3_text", {"head_dim": HEAD_DIM, "sliding_window": 16, "num_hidden_layers": layers, **extra}
    )
    arch = arch_of(spec)
    assert (arch.num_window_layers, arch.attention_window_tokens) == (window_layers, 16)
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    # four RMSNorms of the hidden width and a q and a k RMSNorm of one head's width per layer; the final norm
    norms = layers * (4 * H + 2 * HEAD_DIM) + H
    per_layer = H * q + 2 * H * kv + q * H + 3 * H * FFN
    assert arch.tied_embedding and arch.total_params == VOCAB * H + layers * per_layer + norms


def test_gemma2_full_finetune_matmuls_and_windowed_attention_by_hand(tmp_path) -> None:
    spec = _spec(tmp_path, "gemma2", {"head_dim": HEAD_DIM, "query_pre_attn_scalar": HEAD_DIM, "sliding_window": 16})
    arch = arch_of(spec)
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM  # 128, 64
    attention = LAYERS * (H * q + 2 * H * kv + q * H)  # q, k, v, o
    mlp = LAYERS * 3 * H * FFN  # GeGLU: gate, up, down
    head = VOCAB * H  # tied to the embedding: stored once, still a matmul
    norms = LAYERS * 4 * H + H  # input, post-attention, pre- and post-feed-forward RMSNorms; final norm
    assert arch.tied_embedding and arch.dense_params == attention + mlp
    assert arch.total_params == attention + mlp + head + norms
    assert (arch.num_window_layers, arch.attention_window_tokens) == (2, 16)  # layers 0 and 2 of 4
    seq, batch = 48, 2
    job = FineTuneJob(model=spec.name, method="full", gradient_checkpointing=False, batch_size=batch, seq_len=seq)
    counts = analytic_step_counts(spec, job)
    tokens = batch * seq
    # forward 2, backward 4 (input and weight gradients) FLOPs per matmul parameter per token
    matmul = counts.flops_by_class["dense_matmul"] + counts.flops_by_class["lm_head"]
    assert matmul == pytest.approx(6 * (attention + mlp + head) * tokens)
    # causal attention scores l^2 / 2 pairs a sequence; a query of a window layer sees at most 16 keys, which
    # drops the (l - 16)^2 / 2 pairs beyond the window. QK^T and PV: 2 matmuls x 2 FLOPs x q width per pair.
    pairs = 2 * seq**2 / 2 + 2 * (seq**2 / 2 - (seq - 16) ** 2 / 2)  # 2 full + 2 window layers
    attention_fwd = batch * pairs * 2 * 2 * q
    assert counts.flops_by_class["attention"] == pytest.approx((1 + 2.5) * attention_fwd)  # FA2 backward: 2.5 x


def test_phi3_lora_adapts_the_fused_matrices(tmp_path) -> None:
    spec = _spec(tmp_path, "phi3", {"tie_word_embeddings": False})
    arch = arch_of(spec)
    head_dim = H // HEADS
    qkv_out = (HEADS + 2 * KV_HEADS) * head_dim
    # the same matmul parameters as split q, k, v and gate, up
    assert arch.dense_params == LAYERS * (H * qkv_out + HEADS * head_dim * H + H * 2 * FFN + FFN * H)
    assert arch.num_attention_matrices == 2 * LAYERS and arch.num_dense_matrices == 4 * LAYERS
    r, seq = 8, 32
    job = FineTuneJob(
        model=spec.name, method="lora", lora=LoraConfig(rank=r, targets=("attention",)), batch_size=1, seq_len=seq
    )
    counts = analytic_step_counts(spec, job)
    attention_in_out = LAYERS * ((H + qkv_out) + (HEADS * head_dim + H))  # qkv_proj, o_proj
    passes = 4  # forward, recompute (gradient checkpointing), grad-input, grad-weight of A and B
    assert counts.flops_by_class["lora"] == pytest.approx(passes * 2 * r * seq * attention_in_out)


def test_phi_counts_every_bias_and_one_layer_norm_per_layer(tmp_path) -> None:
    arch = arch_of(_spec(tmp_path, "phi", {"partial_rotary_factor": 0.5}))
    head_dim = H // HEADS
    q, kv = HEADS * head_dim, KV_HEADS * head_dim
    assert arch.dense_params == LAYERS * (H * q + 2 * H * kv + q * H + 2 * H * FFN)  # q, k, v, dense, fc1, fc2
    biases = LAYERS * (q + 2 * kv + H + FFN + H) + VOCAB  # every linear, lm_head included
    layer_norms = LAYERS * 2 * H + 2 * H  # input_layernorm and final_layernorm, weight and bias
    assert arch.norm_params == biases + layer_norms and not arch.tied_embedding


def test_windowed_attention_work() -> None:
    # one fixed length: exact, l^2 inside the window, l^2 - (l - w)^2 beyond it
    assert windowed_sq_len_tokens2(fixed_lengths(100, 2), 4096) == 100**2
    assert windowed_sq_len_tokens2(fixed_lengths(100, 2), 30) == 100**2 - 70**2
    assert windowed_sq_len_tokens2(fixed_lengths(100, 2), 0) == 100**2  # no window
    # a spread of lengths, every one inside the window: E[l^2]
    spread = empirical_lengths([10, 20, 30, 40], 2)
    assert windowed_sq_len_tokens2(spread, 64) == pytest.approx((100 + 400 + 900 + 1600) / 4)
    # lengths beyond the window: at most 2 w E[l] (each l^2 - (l - w)^2 <= 2 w l), never above E[l^2]
    exact = sum(length**2 - max(length - 15, 0) ** 2 for length in (10, 20, 30, 40)) / 4
    bound = windowed_sq_len_tokens2(spread, 15)
    assert bound == pytest.approx(2 * 15 * 25) and exact <= bound <= spread.mean_sq_len_tokens2


def test_gemma2_feed_forward_norms_add_element_wise_traffic(tmp_path) -> None:
    """Gemma 2 is Gemma plus a pre- and a post-feed-forward RMSNorm per layer: two more norms' traffic and
    kernels per layer (no window within these 32 tokens, no other difference in the counts)."""
    from tunecost.estimate.throughput.mixers import (
        BWD_BYTES_PER_FWD_BYTE,
        BWD_KERNELS_PER_FWD_KERNEL,
        RMSNORM_BYTES_PER_HIDDEN,
        RMSNORM_KERNELS,
    )

    gemma = _spec(tmp_path / "gemma", "gemma", {"head_dim": HEAD_DIM})
    gemma2 = _spec(tmp_path, "gemma2", {"head_dim": HEAD_DIM, "query_pre_attn_scalar": HEAD_DIM, "sliding_window": 64})
    assert (arch_of(gemma).num_layer_norms, arch_of(gemma2).num_layer_norms) == (2, 4)
    seq = 32

    def counts(spec):
        return analytic_step_counts(spec, FineTuneJob(model=spec.name, method="full", batch_size=1, seq_len=seq))

    one, two = counts(gemma), counts(gemma2)
    passes = 1 + 1 + BWD_BYTES_PER_FWD_BYTE  # forward, recompute (gradient checkpointing), backward
    extra_bytes = passes * LAYERS * seq * 2 * RMSNORM_BYTES_PER_HIDDEN * H
    assert two.bytes_by_class["elementwise"] - one.bytes_by_class["elementwise"] == pytest.approx(extra_bytes)
    extra_kernels = (1 + 1 + BWD_KERNELS_PER_FWD_KERNEL) * LAYERS * 2 * RMSNORM_KERNELS
    assert two.kernels_by_class["elementwise"] - one.kernels_by_class["elementwise"] == pytest.approx(extra_kernels)
    assert two.flops_by_class["attention"] == one.flops_by_class["attention"]
