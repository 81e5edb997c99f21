"""`Arch` of DeepSeek-V2 (and V2-Lite) and V3 (the same modules: multi-head latent attention, routed plus shared
experts, a dense prefix), and of GLM-4.5 (grouped-query attention in the same MoE layout)."""

from __future__ import annotations

from typing import Any

from tunecost.models.arch import Arch, _decoder_arch, _get, _Shape


def deepseek_v2_arch(config: dict[str, Any], family: str) -> Arch:
    """DeepSeek-V2 as transformers builds it: MLA (q_proj, or q_a_proj + q_b_proj under `q_lora_rank`;
    kv_a_proj_with_mqa, kv_b_proj, o_proj; RMSNorms on the latents), the first `first_k_dense_replace` layers a
    dense MLP, the rest `n_routed_experts` experts plus one always-on MLP of `n_shared_experts` experts' width.
    The attention's head width is the mean of its query/key and value widths, so the score and value work add
    up."""
    hidden = int(_get(config, "hidden_size"))
    layers = int(_get(config, "num_hidden_layers"))
    heads = int(_get(config, "num_attention_heads"))
    vocab = int(_get(config, "vocab_size"))
    rope, nope, v_dim = (int(_get(config, k)) for k in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"))
    kv_rank, q_rank = int(_get(config, "kv_lora_rank")), int(config.get("q_lora_rank") or 0)
    qk_dim = nope + rope
    if q_rank:
        mats = [(hidden, q_rank, layers), (q_rank, heads * qk_dim, layers)]
    else:
        mats = [(hidden, heads * qk_dim, layers)]
    mats += [
        (hidden, kv_rank + rope, layers),
        (kv_rank, heads * (nope + v_dim), layers),
        (heads * v_dim, hidden, layers),
    ]
    latent_norms = kv_rank + q_rank  # kv_a_layernorm, and q_a_layernorm under q_lora_rank
    shape = _Shape(hidden, layers, heads, (qk_dim + v_dim) // 2, vocab)
    return _prefix_moe_arch(family, config, mats, shape, layer_norm_params=2 * hidden + latent_norms)


def glm4_moe_arch(config: dict[str, Any], family: str) -> Arch:
    """GLM-4.5 / 4.6 (`glm4_moe`): grouped-query attention (q, k, v with biases under `attention_bias`, a q and a k
    RMSNorm of one head's width under `use_qk_norm`) in DeepSeek-V3's MoE layout: a dense prefix of
    `first_k_dense_replace` layers, then routed experts beside `n_shared_experts` always-on ones."""
    hidden = int(_get(config, "hidden_size"))
    layers = int(_get(config, "num_hidden_layers"))
    heads = int(_get(config, "num_attention_heads"))
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    mats = [(hidden, q_out, layers), (hidden, kv_out, layers), (hidden, kv_out, layers), (q_out, hidden, layers)]
    per_layer = 2 * hidden + (q_out + 2 * kv_out if config.get("attention_bias") else 0)
    per_layer += 2 * head_dim if config.get("use_qk_norm") else 0
    shape = _Shape(hidden, layers, heads, head_dim, int(_get(config, "vocab_size")))
    return _prefix_moe_arch(family, config, mats, shape, layer_norm_params=per_layer)


def _prefix_moe_arch(
    family: str, config: dict[str, Any], mats: list[tuple[int, int, int]], shape: _Shape, *, layer_norm_params: int
) -> Arch:
    """The `Arch` of attention `mats` followed by a dense-prefix MoE stack (DeepSeek's layout); `layer_norm_params`:
    the norms' and biases' parameters of one layer."""
    hidden, layers = shape.hidden, shape.layers
    num_attention_mats = len(mats)
    num_dense = min(layers, int(config.get("first_k_dense_replace") or 0))
    num_moe = layers - num_dense
    ffn = int(_get(config, "moe_intermediate_size"))
    shared = ffn * int(config.get("n_shared_experts") or 0)
    mats = list(mats)
    if shared and num_moe:
        mats += [(hidden, shared, num_moe), (hidden, shared, num_moe), (shared, hidden, num_moe)]
    if num_dense:
        inter = int(_get(config, "intermediate_size"))
        mats += [(hidden, inter, num_dense), (hidden, inter, num_dense), (inter, hidden, num_dense)]
    return _decoder_arch(
        family,
        mats,
        shape,
        tied=bool(config.get("tie_word_embeddings", False)),
        embedding_params=shape.vocab * hidden,
        norm_params=layers * layer_norm_params + hidden,
        num_moe=num_moe,
        num_experts=int(_get(config, "n_routed_experts")) if num_moe else 1,
        ffn=ffn if num_moe else 0,
        num_attention_mats=num_attention_mats,
    )
