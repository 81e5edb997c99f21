"""`Arch` of the decoders whose MLP is two matrices with a GELU between them: StarCoder2 and Falcon.

Module shapes follow transformers 5.23's `modeling_starcoder2.py` and `modeling_falcon.py`:
- starcoder2: Llama's q, k, v, o (grouped-query) and an MLP `c_fc` (hidden -> intermediate) / `c_proj` (back), every
  linear with a bias under `use_bias` (the default), two LayerNorms with biases per layer and a final one, rotary
  positions, the head tied to the embedding unless the config says otherwise, and every layer attending over the
  config's `sliding_window` when it gives one;
- falcon: one fused `query_key_value` of (heads + 2 x key/value heads) x head_dim outputs, where the key/value
  heads are `num_kv_heads` under `new_decoder_architecture` (Falcon-40B), else one (`multi_query`, Falcon-7B) or
  one per head; the attention output `dense`; an MLP `dense_h_to_4h` / `dense_4h_to_h` of width `ffn_hidden_size`
  (4 x hidden by default); biases on those four only under `bias`; LayerNorms with biases: one per layer read by
  attention and MLP alike (`parallel_attn`, Falcon-7B), two (`ln_attn`, `ln_mlp`: the new decoder architecture's
  default) or two in sequence (no `parallel_attn`), then `ln_f`; the head tied to the embedding by default. LoRA on
  the attention adapts the fused `query_key_value` and `dense` (2 matrices per layer), as PEFT's Falcon targets do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tunecost.estimate.throughput.arch import Arch, _bias_params, _decoder_arch, _get, _Shape

_LAYER_NORM_PARAMS_PER_HIDDEN = 2  # a LayerNorm's weight and bias


def _starcoder2_arch(config: dict[str, Any]) -> Arch:
    hidden = int(_get(config, "hidden_size"))
    layers = int(_get(config, "num_hidden_layers"))
    heads = int(_get(config, "num_attention_heads"))
    kv_heads = int(_get(config, "num_key_value_heads", default=heads))
    head_dim = int(config.get("head_dim") or hidden // heads)
    inter = int(_get(config, "intermediate_size"))
    vocab = int(_get(config, "vocab_size"))
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    mats = [(hidden, q_out, layers), (hidden, kv_out, layers), (hidden, kv_out, layers), (q_out, hidden, layers)]
    mats += [(hidden, inter, layers), (inter, hidden, layers)]  # c_fc, c_proj
    biases = _bias_params(mats) if config.get("use_bias", True) else 0
    layer_norms = 2 * _LAYER_NORM_PARAMS_PER_HIDDEN * hidden  # input_layernorm, post_attention_layernorm
    window = int(config.get("sliding_window") or 0)
    return _decoder_arch(
        "starcoder2",
        mats,
        _Shape(hidden, layers, heads, head_dim, vocab),
        tied=bool(config.get("tie_word_embeddings", True)),
        embedding_params=vocab * hidden,
        norm_params=layers * layer_norms + biases + _LAYER_NORM_PARAMS_PER_HIDDEN * hidden,  # + the final norm
        window=(layers, window) if window else (0, 0),
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


def _falcon_arch(config: dict[str, Any]) -> Arch:
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
        "falcon",
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


GELU_MLP_ARCHES: dict[str, Callable[[dict[str, Any]], Arch]] = {
    "starcoder2": _starcoder2_arch,
    "falcon": _falcon_arch,
}
