"""`Arch` of the hybrid decoders. Qwen3.5 (dense and MoE) and Qwen3-Next: gated DeltaNet (linear attention) layers
with a gated attention layer every `full_attention_interval`-th (`layer_types`), each followed by a SwiGLU MLP or
routed experts plus a gated shared expert. Granite 4.0's hybrid: Mamba2 or attention layers per `layer_types`, each
with routed experts (or none) beside a shared MLP."""

from __future__ import annotations

import dataclasses
from typing import Any

from tunecost.models.arch import Arch, _bias_params, _decoder_arch, _get, _Shape

_FULL_ATTENTION_INTERVAL = 4  # transformers 5.23's Qwen3_5TextConfig default


def qwen3_5_arch(config: dict[str, Any], family: str) -> Arch:
    """Qwen3.5 as transformers 5.23 builds it. Attention layers: q_proj twice as wide (queries and their output
    gate), k, v, o, q/k norms of one head's width. DeltaNet layers: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a,
    out_proj, a depthwise conv over q, k and v without bias, dt_bias, A_log and a gated norm of one value head.
    Qwen3-Next fuses the DeltaNet's input projections in two (in_proj_qkvz, in_proj_ba) and places its experts per
    `decoder_sparse_step` and `mlp_only_layers`, as Qwen3-MoE."""
    hidden = int(_get(config, "hidden_size"))
    layers = int(_get(config, "num_hidden_layers"))
    heads = int(_get(config, "num_attention_heads"))
    kv_heads = int(_get(config, "num_key_value_heads", default=heads))
    head_dim = int(_get(config, "head_dim", default=256))
    vocab = int(_get(config, "vocab_size"))
    types = list(config.get("layer_types") or [])
    if not types:
        interval = int(config.get("full_attention_interval") or _FULL_ATTENTION_INTERVAL)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    full = sum(1 for t in types[:layers] if t == "full_attention")
    delta = layers - full
    nk, nv = int(_get(config, "linear_num_key_heads")), int(_get(config, "linear_num_value_heads"))
    dk, dv = int(_get(config, "linear_key_head_dim")), int(_get(config, "linear_value_head_dim"))
    conv = int(_get(config, "linear_conv_kernel_dim", default=4))
    key_dim, value_dim = nk * dk, nv * dv
    attention = [
        (hidden, 2 * heads * head_dim, full),
        (hidden, kv_heads * head_dim, full),
        (hidden, kv_heads * head_dim, full),
        (heads * head_dim, hidden, full),
    ]
    if family == "qwen3_next":  # q, k, v, z in one projection, b and a in another
        projections = [(hidden, 2 * key_dim + 2 * value_dim, delta), (hidden, 2 * nv, delta)]
    else:
        projections = [(hidden, 2 * key_dim + value_dim, delta), (hidden, value_dim, delta)]
        projections += [(hidden, nv, delta), (hidden, nv, delta)]
    mats = [m for m in [*attention, *projections, (value_dim, hidden, delta)] if m[2]]
    num_mixer_mats = len(mats)
    num_experts = int(config.get("num_experts") or 1)
    ffn = int(_get(config, "moe_intermediate_size")) if num_experts > 1 else 0
    step, dense_only = int(config.get("decoder_sparse_step") or 1), set(config.get("mlp_only_layers") or [])
    moe = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0) if num_experts > 1 else 0
    if moe:
        shared = int(config.get("shared_expert_intermediate_size") or 0)
        mats += [(hidden, shared, moe), (hidden, shared, moe), (shared, hidden, moe), (hidden, 1, moe)]
    if layers - moe:
        inter = int(_get(config, "intermediate_size"))
        mats += [(hidden, inter, layers - moe), (hidden, inter, layers - moe), (inter, hidden, layers - moe)]
    biases = _bias_params(attention) if config.get("attention_bias") else 0
    delta_params = (2 * key_dim + value_dim) * conv + 2 * nv + dv
    norms = layers * 2 * hidden + full * 2 * head_dim + delta * delta_params + hidden + biases
    shape, tied = _Shape(hidden, layers, heads, head_dim, vocab), bool(config.get("tie_word_embeddings", False))
    layout: dict[str, Any] = {
        "num_moe": moe,
        "num_experts": num_experts,
        "ffn": ffn,
        "num_attention_mats": num_mixer_mats,
    }
    arch = _decoder_arch(family, mats, shape, tied=tied, embedding_params=vocab * hidden, norm_params=norms, **layout)
    return dataclasses.replace(
        arch,
        num_attention_layers=full,
        num_delta_layers=delta,
        delta_key_heads=nk,
        delta_value_heads=nv,
        delta_key_dim=dk,
        delta_value_dim=dv,
        delta_conv_kernel=conv,
    )


def granite_hybrid_arch(config: dict[str, Any], family: str) -> Arch:
    """Granite 4.0's hybrid (`granitemoehybrid`) as transformers 5.23 builds it: per `layer_types`, Mamba2 layers
    (in_proj: hidden -> 2 x inner + 2 x groups x state + heads; a depthwise conv over x, B and C; dt_bias, A_log,
    D; a gated RMSNorm over inner; out_proj) or attention layers (q, k, v, o, no rotary under
    `position_embedding_type` nope), every layer with GraniteMoeShared's routed experts (none when
    `num_local_experts` is 0) and its shared MLP (`input_linear` hidden -> 2 x shared, `output_linear`)."""
    hidden = int(_get(config, "hidden_size"))
    layers = int(_get(config, "num_hidden_layers"))
    heads = int(_get(config, "num_attention_heads"))
    kv_heads = int(_get(config, "num_key_value_heads", default=heads))
    vocab = int(_get(config, "vocab_size"))
    types = list(config.get("layer_types") or ["mamba"] * layers)
    attention_layers = sum(1 for t in types[:layers] if t in ("attention", "full_attention"))
    ssd_layers = layers - attention_layers
    inner = int(config.get("mamba_expand") or 2) * hidden
    ssd_heads, groups = int(_get(config, "mamba_n_heads")), int(config.get("mamba_n_groups") or 1)
    state, conv = int(_get(config, "mamba_d_state")), int(config.get("mamba_d_conv") or 4)
    head_dim = hidden // heads
    conv_dim = inner + 2 * groups * state
    attention = [
        (hidden, heads * head_dim, attention_layers),
        (hidden, kv_heads * head_dim, attention_layers),
        (hidden, kv_heads * head_dim, attention_layers),
        (heads * head_dim, hidden, attention_layers),
    ]
    mamba = [(hidden, inner + conv_dim + ssd_heads, ssd_layers), (inner, hidden, ssd_layers)]
    mats = [m for m in (*attention, *mamba) if m[2]]
    num_mixer_mats = len(mats)
    shared = int(_get(config, "shared_intermediate_size"))
    mats += [(hidden, 2 * shared, layers), (shared, hidden, layers)]
    num_experts = int(config.get("num_local_experts") or 0)
    biases = _bias_params(attention) if config.get("attention_bias") else 0
    biases += _bias_params(mamba) if config.get("mamba_proj_bias") else 0
    ssd_params = conv_dim * conv + (conv_dim if config.get("mamba_conv_bias", True) else 0) + 3 * ssd_heads + inner
    norms = layers * 2 * hidden + hidden + ssd_layers * ssd_params + biases
    shape, tied = _Shape(hidden, layers, heads, head_dim, vocab), bool(config.get("tie_word_embeddings", False))
    layout: dict[str, Any] = {"num_attention_mats": num_mixer_mats}
    if num_experts:
        layout |= {"num_moe": layers, "num_experts": num_experts, "ffn": int(_get(config, "intermediate_size"))}
    arch = _decoder_arch(family, mats, shape, tied=tied, embedding_params=vocab * hidden, norm_params=norms, **layout)
    chunk = int(config.get("mamba_chunk_size") or 256)
    return dataclasses.replace(
        arch,
        num_attention_layers=attention_layers,
        num_ssd_layers=ssd_layers,
        ssd_heads=ssd_heads,
        ssd_head_dim=inner // ssd_heads,
        ssd_state=state,
        ssd_groups=groups,
        ssd_chunk=chunk,
        ssd_conv_kernel=conv,
    )
