"""`Arch` of the decoders whose MLP is two matrices with an activation between them: StarCoder2 and Falcon (GELU),
Nemotron (squared ReLU).

Sources and derivations: docs/throughput-model.md, section `tunecost.models.arch_gelu_mlp`.
"""

from __future__ import annotations

from typing import Any

from tunecost.models.arch import Arch, _bias_params, _decoder_arch, _get, _Shape

_LAYER_NORM_PARAMS_PER_HIDDEN = 2  # a LayerNorm's weight and bias


def _two_matrix_mlp(config: dict[str, Any]) -> tuple[_Shape, list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """(shape, attention q/k/v/o, MLP in/out) of a Llama-layout config whose MLP is two matrices."""
    hidden = int(_get(config, "hidden_size"))
    layers = int(_get(config, "num_hidden_layers"))
    heads = int(_get(config, "num_attention_heads"))
    kv_heads = int(_get(config, "num_key_value_heads", default=heads))
    head_dim = int(config.get("head_dim") or hidden // heads)
    inter = int(_get(config, "intermediate_size"))
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    attention = [(hidden, q_out, layers), (hidden, kv_out, layers), (hidden, kv_out, layers), (q_out, hidden, layers)]
    shape = _Shape(hidden, layers, heads, head_dim, int(_get(config, "vocab_size")))
    return shape, attention, [(hidden, inter, layers), (inter, hidden, layers)]


def starcoder2_arch(config: dict[str, Any], family: str) -> Arch:
    shape, attention, mlp = _two_matrix_mlp(config)  # mlp: c_fc, c_proj
    hidden, layers, _, _, vocab = shape
    mats = attention + mlp
    biases = _bias_params(mats) if config.get("use_bias", True) else 0
    layer_norms = 2 * _LAYER_NORM_PARAMS_PER_HIDDEN * hidden  # input_layernorm, post_attention_layernorm
    window = int(config.get("sliding_window") or 0)
    return _decoder_arch(
        family,
        mats,
        shape,
        tied=bool(config.get("tie_word_embeddings", True)),
        embedding_params=vocab * hidden,
        norm_params=layers * layer_norms + biases + _LAYER_NORM_PARAMS_PER_HIDDEN * hidden,  # + the final norm
        window=(layers, window) if window else (0, 0),
    )


def nemotron_arch(config: dict[str, Any], family: str) -> Arch:
    """Nemotron: StarCoder2's shape with the biases' own flags (`attention_bias`, `mlp_bias`) and an untied head."""
    shape, attention, mlp = _two_matrix_mlp(config)  # mlp: up_proj, down_proj
    hidden, layers, _, _, vocab = shape
    biases = (_bias_params(attention) if config.get("attention_bias") else 0) + (
        _bias_params(mlp) if config.get("mlp_bias") else 0
    )
    return _decoder_arch(
        family,
        attention + mlp,
        shape,
        tied=bool(config.get("tie_word_embeddings", False)),
        embedding_params=vocab * hidden,
        norm_params=(2 * layers + 1) * _LAYER_NORM_PARAMS_PER_HIDDEN * hidden + biases,  # two per layer, the final
    )


def falcon_kv_heads(config: dict[str, Any]) -> int:
    """Key/value heads of a Falcon config, as `FalconAttention` sizes its fused `query_key_value`."""
    heads = int(_get(config, "num_attention_heads"))
    if config.get("new_decoder_architecture"):
        return int(config.get("num_kv_heads") or heads)
    return 1 if config.get("multi_query", True) else heads


def falcon_layer_norms(config: dict[str, Any]) -> int:
    """LayerNorms per Falcon decoder layer (`FalconDecoderLayer.__init__`): two in sequence without
    `parallel_attn`; with it, `ln_attn` and `ln_mlp` when `num_ln_in_parallel_attn` is 2 (the new decoder
    architecture's default), else one `input_layernorm` for both branches."""
    if not config.get("parallel_attn", True):
        return 2
    num_ln = config.get("num_ln_in_parallel_attn")
    if num_ln is None and config.get("new_decoder_architecture"):
        num_ln = 2
    return 2 if num_ln == 2 else 1


def falcon_arch(config: dict[str, Any], family: str) -> Arch:
    hidden = int(_get(config, "hidden_size"))
    layers = int(_get(config, "num_hidden_layers"))
    heads = int(_get(config, "num_attention_heads"))
    head_dim = hidden // heads
    ffn = int(config.get("ffn_hidden_size") or 4 * hidden)
    vocab = int(_get(config, "vocab_size"))
    qkv_out = (heads + 2 * falcon_kv_heads(config)) * head_dim
    mats = [(hidden, qkv_out, layers), (hidden, hidden, layers), (hidden, ffn, layers), (ffn, hidden, layers)]
    biases = _bias_params(mats) if config.get("bias") else 0
    num_norms = falcon_layer_norms(config)
    return _decoder_arch(
        family,
        mats,
        _Shape(hidden, layers, heads, head_dim, vocab),
        tied=bool(config.get("tie_word_embeddings", True)),
        embedding_params=vocab * hidden,
        # per layer its LayerNorms, then every linear's bias and ln_f
        norm_params=layers * num_norms * _LAYER_NORM_PARAMS_PER_HIDDEN * hidden
        + biases
        + _LAYER_NORM_PARAMS_PER_HIDDEN * hidden,
        num_attention_mats=2,  # the fused query_key_value and dense; dense_h_to_4h and dense_4h_to_h are the MLP
        num_layer_norms=num_norms,
    )
