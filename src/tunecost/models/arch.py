"""The few architecture numbers the throughput model needs, read from a model's config (no torch).

Sources and derivations: docs/throughput-model.md, section `tunecost.models.arch`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal, NamedTuple

from tunecost.errors import TunecostError
from tunecost.models.projections import PROJECTIONS

# Gemma 3's default pattern: every sixth layer attends over the whole sequence, the others over the window
_GEMMA3_SLIDING_WINDOW_PATTERN = 6


@dataclass(frozen=True, kw_only=True)
class Decoder:
    """How a Llama-layout family's decoder departs from Llama's (a `models.families.Family` field), with
    transformers 5.23's config-class defaults where a config.json may leave the key out."""

    head_dim: int | None = None  # when the config gives none (else hidden / heads)
    tied: bool = False  # `tie_word_embeddings` when the config gives none
    norms_per_layer: int = 2  # RMSNorms of `hidden` width per layer (input, post-attention)
    parameter_free_norms: bool = False  # OLMo's LayerNorm without affine parameters
    fused_gate_up: bool = False  # the MLP's gate and up are one `gate_up_proj`
    qk_norm: Literal["none", "per_head", "all_heads"] = "none"  # norms on q and k: one head's width, or all heads'
    # none; q, k, v always (Qwen2); q, k, v when `attention_bias` (GLM); attention when `attention_bias` and MLP
    # when `mlp_bias` (Llama); every linear but the head when `use_bias` (ERNIE 4.5); Seed-OSS's three flags
    biases: Literal["none", "qkv", "qkv_flag", "flags", "use_bias", "seed_oss"] = "none"
    # the layers attending over `sliding_window` only, where the config's `layer_types` does not list them:
    # alternate ones (0, 2, ...), all but every `sliding_window_pattern`-th, all, those from `max_window_layers` on
    window: Literal["none", "alternate", "all_but_every_nth", "all", "from_max_window_layers"] = "none"
    window_switch: str | None = None  # a config flag without which no layer has a window (Qwen3's)


@dataclass(frozen=True, kw_only=True)
class Arch:
    """Matmul parameter counts (weights, not bytes) and shapes of one model."""

    family: str
    hidden: int
    num_layers: int  # decoder blocks (BlackMamba: Mamba and MoE blocks together)
    num_moe_layers: int
    num_experts: int  # routed experts per MoE layer (1: dense model)
    expert_params: int  # one routed expert of one layer (gate/up + down, or fc1 + fc2; gpt-oss: with biases)
    expert_ffn: int  # the expert's intermediate width (where the activation and gating run)
    expert_in_out: int  # sum of (in + out) over the expert's matrices: LoRA rank-r work per token is r * this
    num_expert_matrices: int  # GEMMs per expert call (3: gate, up, down; BlackMamba: fc1, fc2 = 2)
    router_params_per_layer: int
    # every other matmul weight over all layers: attention / Mamba projections, shared experts, dense MLPs
    dense_params: int
    dense_in_out: int  # sum of (in + out) over the dense matrices (for LoRA on them)
    num_dense_matrices: int  # GEMMs per step through `dense_params` (one forward)
    attention_in_out: int  # the q, k, v, o part of `dense_in_out` (0 without attention)
    num_attention_matrices: int  # the q, k, v, o part of `num_dense_matrices`
    lm_head_params: int
    tied_embedding: bool
    embedding_params: int
    norm_params: int  # norms, biases, conv, A/D: trained under full fine-tuning, no GEMM
    num_attention_layers: int
    num_heads: int
    head_dim: int
    num_mamba_layers: int
    mamba_inner: int  # d_inner
    mamba_state: int  # d_state
    num_layer_norms: int = 2  # norms of `hidden` width per attention layer (element-wise work)
    num_window_layers: int = 0  # of the attention layers, those attending over a sliding window only
    attention_window_tokens: int = 0  # that window (keys a query sees at most)
    # gated DeltaNet layers (Qwen3.5's linear attention; `num_attention_layers` counts the others)
    num_delta_layers: int = 0
    delta_key_heads: int = 0
    delta_value_heads: int = 0
    delta_key_dim: int = 0  # per head
    delta_value_dim: int = 0
    delta_conv_kernel: int = 0
    # Mamba2 (SSD) layers (Granite 4.0's hybrid; `num_attention_layers` counts the others)
    num_ssd_layers: int = 0
    ssd_heads: int = 0
    ssd_head_dim: int = 0
    ssd_state: int = 0
    ssd_groups: int = 0
    ssd_chunk: int = 0
    # (name, sum of in + out over its copies, copies) of the Llama-style projections LoRA may target one by one
    projection_in_out: tuple[tuple[str, int, int], ...] = ()
    ssd_conv_kernel: int = 0

    @property
    def routed_expert_params(self) -> int:
        return self.num_moe_layers * self.num_experts * self.expert_params

    @property
    def total_params(self) -> int:
        lm_head = 0 if self.tied_embedding else self.lm_head_params
        return (
            self.routed_expert_params
            + self.num_moe_layers * self.router_params_per_layer
            + self.dense_params
            + self.embedding_params
            + lm_head
            + self.norm_params
        )

    def active_params(self, experts_per_token: int) -> int:
        k = min(experts_per_token, self.num_experts)
        return self.total_params - self.routed_expert_params + self.num_moe_layers * k * self.expert_params


def _get(config: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    if default is not None:
        return default
    raise TunecostError(f"model config lacks {' / '.join(keys)}")


def blackmamba_arch(config: dict[str, Any], family: str) -> Arch:
    hidden = int(_get(config, "hidden_size"))
    pattern = config.get("mamba_moe_layers") or (["r", "8"] * (int(_get(config, "num_layers")) // 2))
    num_mamba = sum(1 for t in pattern if str(t) == "r")
    num_moe = len(pattern) - num_mamba
    num_experts = int(_get(config, "num_experts", default=max(int(t) for t in pattern if str(t) != "r")))
    ffn = int(_get(config, "ffn_hidden_size", "intermediate_size"))
    inner = int(_get(config, "expansion_factor", default=2)) * hidden
    state = int(_get(config, "state_size", "d_state", default=16))
    conv = int(_get(config, "conv_dimension", "d_conv", default=4))
    dt_rank = int(_get(config, "time_step_rank", "dt_rank", default=math.ceil(hidden / 16)))
    vocab = int(_get(config, "vocab_size"))
    # Mamba mixer: in_proj H->2D, x_proj D->(R+2S), dt_proj R->D, out_proj D->H (stack-facts.md).
    mamba_mats = [(hidden, 2 * inner), (inner, dt_rank + 2 * state), (dt_rank, inner), (inner, hidden)]
    mamba_params = sum(i * o for i, o in mamba_mats)
    # conv weight + bias, dt bias, A_log, D, one RMSNorm per block, final LayerNorm (weight + bias).
    mamba_other = inner * conv + inner + inner + inner * state + inner
    norm_params = num_mamba * mamba_other + len(pattern) * hidden + 2 * hidden + num_moe * num_experts  # + router bias
    return Arch(
        family=family,
        hidden=hidden,
        num_layers=len(pattern),
        num_moe_layers=num_moe,
        num_experts=num_experts,
        expert_params=hidden * 2 * ffn + ffn * hidden,
        expert_ffn=ffn,
        expert_in_out=(hidden + 2 * ffn) + (ffn + hidden),
        num_expert_matrices=2,
        router_params_per_layer=hidden * num_experts,
        dense_params=num_mamba * mamba_params,
        dense_in_out=num_mamba * sum(i + o for i, o in mamba_mats),
        num_dense_matrices=num_mamba * len(mamba_mats),
        attention_in_out=0,
        num_attention_matrices=0,
        lm_head_params=vocab * hidden,
        tied_embedding=True,
        embedding_params=vocab * hidden,
        norm_params=norm_params,
        num_attention_layers=0,
        num_heads=0,
        head_dim=0,
        num_mamba_layers=num_mamba,
        mamba_inner=inner,
        mamba_state=state,
    )


def transformer_arch(config: dict[str, Any], family: str, decoder: Decoder, fused_qkv: bool = False) -> Arch:
    hidden = int(_get(config, "hidden_size"))
    layers = int(_get(config, "num_hidden_layers"))
    heads = int(_get(config, "num_attention_heads"))
    kv_heads = int(_get(config, "num_key_value_heads", default=heads))
    head_dim = int(config.get("head_dim") or decoder.head_dim or hidden // heads)
    vocab = int(_get(config, "vocab_size"))
    num_experts = int(_get(config, "num_local_experts", "num_experts", default=1))
    # (in, out, how many of them in the model): q, k, v, o in every layer (or qkv fused, o), then the
    # non-routed MLP work.
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    if fused_qkv:
        mats = [(hidden, q_out + 2 * kv_out, layers), (q_out, hidden, layers)]
    else:
        mats = [(hidden, q_out, layers), (hidden, kv_out, layers), (hidden, kv_out, layers), (q_out, hidden, layers)]
    num_attention_mats = len(mats)
    ffn, num_moe = 0, 0
    if num_experts > 1:
        ffn = int(_get(config, "moe_intermediate_size", "intermediate_size"))
        num_moe = layers
        if family == "qwen3_moe":
            step = int(config.get("decoder_sparse_step") or 1)
            dense_only = set(config.get("mlp_only_layers") or [])
            num_moe = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        shared = int(config.get("shared_expert_intermediate_size") or 0)
        if shared:  # qwen2_moe: an always-on shared expert and its scalar gate in every MoE layer
            mats += [
                (hidden, shared, num_moe),
                (hidden, shared, num_moe),
                (shared, hidden, num_moe),
                (hidden, 1, num_moe),
            ]
        shared = int(config.get("shared_intermediate_size") or 0) if family == "granitemoeshared" else 0
        if shared:  # GraniteMoeShared: an always-on MLP beside the experts, gate and up fused in `input_linear`
            mats += [(hidden, 2 * shared, layers), (shared, hidden, layers)]
    num_mlp_layers = layers - num_moe
    if num_mlp_layers:
        inter = int(_get(config, "intermediate_size"))
        if decoder.fused_gate_up:
            mats += [(hidden, 2 * inter, num_mlp_layers), (inter, hidden, num_mlp_layers)]
        else:
            mats += [(hidden, inter, num_mlp_layers), (hidden, inter, num_mlp_layers), (inter, hidden, num_mlp_layers)]
    qk_norm = {"none": 0, "per_head": 2 * head_dim, "all_heads": (heads + kv_heads) * head_dim}[decoder.qk_norm]
    biases = _biases(decoder, config, mats, num_attention_mats, layers * (heads + 2 * kv_heads) * head_dim)
    num_norms = decoder.norms_per_layer
    norm_width = 0 if decoder.parameter_free_norms else hidden  # weights per norm (the final norm's too)
    expert_bias, router_bias, sinks = _gpt_oss_extras(family, hidden, ffn, heads, layers)
    arch = _decoder_arch(
        family,
        mats,
        _Shape(hidden, layers, heads, head_dim, vocab),
        tied=bool(config.get("tie_word_embeddings", decoder.tied)),
        embedding_params=vocab * hidden,
        norm_params=layers * (num_norms * norm_width + qk_norm) + biases + norm_width + sinks,
        expert_bias_params=expert_bias,
        router_bias_params=router_bias,
        num_moe=num_moe,
        num_experts=num_experts,
        ffn=ffn,
        num_attention_mats=num_attention_mats,
        num_layer_norms=num_norms,
        window=_attention_window(decoder, config, layers),
    )
    attention = [] if fused_qkv else list(zip(PROJECTIONS["attention"], mats[:4]))  # not a fused qkv
    mlp = list(zip(PROJECTIONS["mlp"], mats[-3:])) if num_mlp_layers and not decoder.fused_gate_up else []
    return replace(arch, projection_in_out=tuple((name, (i + o) * n, n) for name, (i, o, n) in attention + mlp))


def _biases(decoder: Decoder, config: dict[str, Any], mats: list, num_attention_mats: int, qkv_outputs: int) -> int:
    """Bias parameters of the decoder's matmuls as `decoder.biases` and the config's flags set them (`qkv_outputs`:
    q, k and v's outputs over all layers, Qwen2's fixed biases)."""
    attention, mlp = mats[:num_attention_mats], mats[num_attention_mats:]
    if decoder.biases == "qkv":
        return qkv_outputs
    if decoder.biases == "qkv_flag":
        return _bias_params(mats[:3]) if config.get("attention_bias") else 0
    if decoder.biases == "use_bias":
        return _bias_params(mats) if config.get("use_bias") else 0
    if decoder.biases == "seed_oss":  # q, k, v follow attention_bias, o attention_out_bias, the MLP mlp_bias
        flags = (("attention_bias", mats[:3]), ("attention_out_bias", mats[3:4]), ("mlp_bias", mlp))
        return sum(_bias_params(m) for key, m in flags if config.get(key))
    if decoder.biases == "flags":
        return sum(_bias_params(m) for key, m in (("attention_bias", attention), ("mlp_bias", mlp)) if config.get(key))
    return 0


def _bias_params(mats: list[tuple[int, int, int]]) -> int:
    """Bias parameters of these matmuls (one per output, in every copy)."""
    return sum(out * n for _, out, n in mats)


def _attention_window(decoder: Decoder, config: dict[str, Any], layers: int) -> tuple[int, int]:
    """(layers attending over a sliding window only, that window in tokens), as transformers 5.23 picks them: the
    config's `layer_types` when given, else `decoder.window`'s layers; (0, 0) for a family without windows."""
    window = int(config.get("sliding_window") or 0)
    if decoder.window == "none" or not window:
        return 0, 0
    if decoder.window_switch is not None and not config.get(decoder.window_switch):
        return 0, 0
    types = config.get("layer_types")
    if types:
        num = sum(1 for t in types if t == "sliding_attention")
    elif decoder.window == "alternate":
        num = (layers + 1) // 2
    elif decoder.window == "all_but_every_nth":
        num = layers - layers // int(config.get("sliding_window_pattern") or _GEMMA3_SLIDING_WINDOW_PATTERN)
    elif decoder.window == "all":
        num = layers
    else:
        num = max(0, layers - int(config.get("max_window_layers") or layers))
    return num, window


def _gpt_oss_extras(family: str, hidden: int, ffn: int, heads: int, layers: int) -> tuple[int, int, int]:
    """gpt-oss's parameters beyond the Mixtral layout: (per routed expert: its gate/up and down biases, per
    router: its bias, per model: one attention-sink logit per head and layer); zeros for other families."""
    if family != "gpt_oss":
        return 0, 0, 0
    return 2 * ffn + hidden, 1, heads * layers


class _Shape(NamedTuple):
    hidden: int
    layers: int
    heads: int
    head_dim: int
    vocab: int


def _decoder_arch(
    family: str,
    mats: list[tuple[int, int, int]],  # (in, out, how many in the model) of every non-routed matmul
    shape: _Shape,
    *,
    tied: bool,
    embedding_params: int,
    norm_params: int,
    num_moe: int = 0,
    num_experts: int = 1,
    ffn: int = 0,  # a routed expert's intermediate width (gate, up, down)
    num_attention_mats: int = 4,  # the first entries of `mats` that are attention projections (q, k, v, o)
    num_layer_norms: int = 2,  # norms of `hidden` width per layer
    window: tuple[int, int] = (0, 0),  # (layers attending over a sliding window only, the window in tokens)
    expert_bias_params: int = 0,  # biases of one routed expert (gpt-oss), counted with its parameters
    router_bias_params: int = 0,  # biases per expert of the router (gpt-oss: 1)
) -> Arch:
    """The `Arch` of an attention decoder (every layer attends), dense or with Mixtral-style routed experts."""
    hidden, layers, heads, head_dim, vocab = shape
    attention = mats[:num_attention_mats]
    return Arch(
        family=family,
        hidden=hidden,
        num_layers=layers,
        num_moe_layers=num_moe,
        num_experts=num_experts,
        expert_params=3 * hidden * ffn + expert_bias_params,
        expert_ffn=ffn,
        expert_in_out=3 * (hidden + ffn),
        num_expert_matrices=3,
        router_params_per_layer=(hidden + router_bias_params) * num_experts if num_experts > 1 else 0,
        dense_params=sum(i * o * n for i, o, n in mats),
        dense_in_out=sum((i + o) * n for i, o, n in mats),
        num_dense_matrices=sum(n for _, _, n in mats),
        attention_in_out=sum((i + o) * n for i, o, n in attention),
        num_attention_matrices=sum(n for _, _, n in attention),
        lm_head_params=vocab * hidden,
        tied_embedding=tied,
        embedding_params=embedding_params,
        norm_params=norm_params,
        num_attention_layers=layers,
        num_heads=heads,
        head_dim=head_dim,
        num_mamba_layers=0,
        mamba_inner=0,
        mamba_state=0,
        num_layer_norms=num_layer_norms,
        num_window_layers=window[0],
        attention_window_tokens=window[1],
    )
