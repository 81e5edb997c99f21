"""`Arch` of GPTBigCode (SantaCoder, StarCoder) and Phi: biased linears, LayerNorms and a two-matrix GELU MLP."""

from __future__ import annotations

from typing import Any

from tunecost.models.arch import Arch, _bias_params, _decoder_arch, _get, _Shape


def gpt_bigcode_arch(config: dict[str, Any], family: str) -> Arch:
    """GPTBigCode (SantaCoder, StarCoder): one fused q/k/v projection `c_attn` (multi-query: one key/value head),
    `c_proj`, a two-matrix GELU MLP `c_fc` / `c_proj` of width `n_inner`, biases on every linear, LayerNorms with
    biases, learned positions (`wpe`); the head is tied to `wte` unless the config says otherwise."""
    hidden = int(_get(config, "n_embd", "hidden_size"))
    layers = int(_get(config, "n_layer", "num_hidden_layers"))
    heads = int(_get(config, "n_head", "num_attention_heads"))
    head_dim = hidden // heads
    kv_width = head_dim if config.get("multi_query", True) else hidden
    inner = int(config.get("n_inner") or 4 * hidden)
    vocab = int(_get(config, "vocab_size"))
    positions = int(_get(config, "n_positions", "max_position_embeddings"))
    mats = [(hidden, hidden + 2 * kv_width, layers), (hidden, hidden, layers), (hidden, inner, layers)]
    mats.append((inner, hidden, layers))
    layer_norms = 2 * 2 * hidden  # ln_1, ln_2: weight and bias
    return _decoder_arch(
        family,
        mats,
        _Shape(hidden, layers, heads, head_dim, vocab),
        tied=bool(config.get("tie_word_embeddings", True)),
        embedding_params=vocab * hidden + positions * hidden,  # wte and the learned positions wpe
        norm_params=layers * layer_norms + _bias_params(mats) + 2 * hidden,  # + ln_f (weight and bias)
        num_attention_mats=2,  # c_attn (fused q, k, v) and the attention's c_proj; c_fc and c_proj are the MLP
    )


def phi_arch(config: dict[str, Any], family: str) -> Arch:
    """Phi (phi-1/1.5/2): attention and a two-matrix GELU MLP (`fc1`, `fc2`) side by side after ONE LayerNorm
    per layer, biases on every linear (q, k, v, `dense`, fc1, fc2 and the untied `lm_head`), LayerNorms with
    biases (optional per-head q/k LayerNorms under `qk_layernorm`), partial rotary (no parameters)."""
    hidden = int(_get(config, "hidden_size"))
    layers = int(_get(config, "num_hidden_layers"))
    heads = int(_get(config, "num_attention_heads"))
    kv_heads = int(_get(config, "num_key_value_heads", default=heads))
    head_dim = hidden // heads
    inter = int(_get(config, "intermediate_size"))
    vocab = int(_get(config, "vocab_size"))
    mats = [
        (hidden, heads * head_dim, layers),
        (hidden, kv_heads * head_dim, layers),
        (hidden, kv_heads * head_dim, layers),
        (heads * head_dim, hidden, layers),
        (hidden, inter, layers),
        (inter, hidden, layers),
    ]
    qk_layer_norms = 2 * 2 * head_dim if config.get("qk_layernorm") else 0
    return _decoder_arch(
        family,
        mats,
        _Shape(hidden, layers, heads, head_dim, vocab),
        tied=bool(config.get("tie_word_embeddings", False)),
        embedding_params=vocab * hidden,
        # per layer: input LayerNorm (weight and bias); then every linear's bias, final LayerNorm, lm_head's bias
        norm_params=layers * (2 * hidden + qk_layer_norms) + _bias_params(mats) + 2 * hidden + vocab,
        num_layer_norms=1,  # attention and MLP read the same normed input
    )
