"""The model families tunecost supports, one record each: where a model's layers, MoE blocks, routers and experts
are, which config keys give its experts, top-k and position table, its token mixer, how its layers repeat, and the
builder of the throughput model's counts. Sources: docs/models.md, section `tunecost.models.anatomy`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from tunecost.errors import TunecostError
from tunecost.models.arch import Arch, Decoder, blackmamba_arch, transformer_arch
from tunecost.models.arch_deepseek import deepseek_v2_arch, glm4_moe_arch
from tunecost.models.arch_gelu_mlp import falcon_arch, nemotron_arch, starcoder2_arch
from tunecost.models.arch_hybrid import granite_hybrid_arch, qwen3_5_arch
from tunecost.models.arch_phi_bigcode import gpt_bigcode_arch, phi_arch

if TYPE_CHECKING:
    from tunecost.models.catalog import ModelSpec

Mixer = Literal["attention", "mamba", "mamba2", "gated_delta"]
# how the decoder's layers repeat (`anatomy.layer_pattern`): all alike, a dense prefix then MoE layers (DeepSeek,
# GLM-4.5), Mamba and MoE alternating (BlackMamba), a period of (token mixer, MoE or not), an MoE every n-th layer
Pattern = Literal["uniform", "dense_prefix", "alternating", "hybrid", "sparse_step"]


@dataclass(frozen=True)
class Family:
    layers: str  # attribute path of the decoder layers' ModuleList
    block: str | None  # attribute of an MoE layer holding the MoE block (None: dense family)
    # (config, family) -> the throughput model's counts; None: Llama's layout as `decoder` varies it
    arch: Callable[[dict[str, Any], str], Arch] | None
    router: str = "gate"
    experts: tuple[str, ...] = ("experts",)
    num_experts_keys: tuple[str, ...] = ()  # config attributes / config.json keys, first present wins
    top_k_keys: tuple[str, ...] = ("num_experts_per_tok",)
    # config keys of a table of learned absolute position embeddings (GPT-2's `wpe`): a sequence longer than it
    # has no position to look up. Empty: positions are computed (rotary), so any length runs.
    learned_positions_keys: tuple[str, ...] = ()
    mixer: Mixer = "attention"  # the token mixer of its layers besides attention (hybrids) or instead of it
    fused_qkv: bool = False  # transformers' attention fuses q, k and v into one linear
    pattern: Pattern = "uniform"
    decoder: Decoder = field(default_factory=Decoder)


def _dense(arch: Callable[[dict[str, Any], str], Arch] | None = None, **kw: Any) -> Family:
    return Family("model.layers", None, arch, **kw)


def _moe(keys: tuple[str, ...], arch: Callable[[dict[str, Any], str], Arch] | None = None, **kw: Any) -> Family:
    return Family("model.layers", "mlp", arch, num_experts_keys=keys, **kw)


# GraniteMoe: the MoE block is `block_sparse_moe` with a `router` (a `*TopKRouter`) and fused experts
_GRANITE_MOE = Family(
    "model.layers", "block_sparse_moe", None, router="router", num_experts_keys=("num_local_experts",)
)
_DEEPSEEK = _moe(("n_routed_experts", "num_experts"), deepseek_v2_arch, pattern="dense_prefix")
_GATED_DELTA_MOE = _moe(("num_experts",), qwen3_5_arch, mixer="gated_delta", pattern="hybrid")
# Llama-layout decoders (`arch.Decoder`) several families share
_FLAGS = Decoder(biases="flags")  # Llama's attention_bias / mlp_bias
_QWEN3 = replace(
    _FLAGS, head_dim=128, qk_norm="per_head", window="from_max_window_layers", window_switch="use_sliding_window"
)
_GEMMA = replace(_FLAGS, head_dim=256, tied=True)
_GEMMA3 = replace(_GEMMA, norms_per_layer=4, qk_norm="per_head", window="all_but_every_nth")
_GLM = Decoder(head_dim=128, fused_gate_up=True, biases="qkv_flag")
FAMILIES: dict[str, Family] = {
    "mixtral": _moe(("num_local_experts",)),
    "olmoe": _moe(("num_experts", "num_local_experts"), decoder=Decoder(qk_norm="all_heads")),
    "qwen2_moe": _moe(("num_experts",), pattern="sparse_step", decoder=Decoder(biases="qkv")),
    "qwen3_moe": _moe(("num_experts",), pattern="sparse_step", decoder=Decoder(qk_norm="per_head")),
    "deepseek_v2": _DEEPSEEK,
    # DeepSeek-V3 (Kimi K2, Moonlight): V2's modules; its router's group-limited sigmoid scoring adds a buffer only
    "deepseek_v3": _DEEPSEEK,
    # GLM-4.5 / 4.6: DeepSeek-V3's MoE layout (dense prefix, shared experts, biased sigmoid router) under GQA attention
    "glm4_moe": _moe(("n_routed_experts",), glm4_moe_arch, pattern="dense_prefix"),
    # tunecost's BlackMamba: `experts_per_token` on BlackMambaConfig; Zyphra's config.json says `mlp_router_topk`
    # (Megatron's `moe_top_k` in some exports)
    "blackmamba": Family(
        "decoder.layers",
        "mixer",
        blackmamba_arch,
        router="router",
        experts=("experts", "local_experts"),
        num_experts_keys=("num_experts",),
        top_k_keys=("experts_per_token", "mlp_router_topk", "moe_top_k"),
        mixer="mamba",
        pattern="alternating",
    ),
    "llama": _dense(decoder=_FLAGS),
    "mistral": _dense(),
    "qwen2": _dense(decoder=Decoder(biases="qkv")),
    # dense families with the same layout (`self_attn`, `mlp` under `model.layers`); Phi-3 fuses q/k/v into
    # `qkv_proj` and gate/up into `gate_up_proj`, Phi's MLP is `fc1`/`fc2` and its attention output `dense`
    "qwen3": _dense(decoder=_QWEN3),
    "gemma": _dense(decoder=_GEMMA),
    "gemma2": _dense(decoder=replace(_GEMMA, norms_per_layer=4, window="alternate")),
    "gemma3_text": _dense(decoder=_GEMMA3),
    "phi": _dense(phi_arch),
    "phi3": _dense(fused_qkv=True, decoder=Decoder(fused_gate_up=True, window="all")),
    "granite": _dense(decoder=_FLAGS),  # dense Granite: Llama's layout with scaling multipliers
    "granitemoe": _GRANITE_MOE,
    # gpt-oss: a `router` with a bias, fused experts with biases (`gate_up_proj` (E, H, 2I), gate and up interleaved)
    "gpt_oss": _moe(
        ("num_local_experts",),
        router="router",
        top_k_keys=("num_experts_per_tok", "experts_per_token"),
        decoder=replace(_FLAGS, head_dim=64, window="alternate"),
    ),
    # GraniteMoeShared: GraniteMoe plus an always-on `shared_mlp` (fused `input_linear`, `output_linear`) in the layer
    "granitemoeshared": _GRANITE_MOE,
    # GPTBigCode (SantaCoder, StarCoder): GPT-2 layout, blocks at `transformer.h`, attention `attn`
    # and learned absolute positions (`wpe`, `n_positions` rows; transformers' GPTBigCodeModel)
    "gpt_bigcode": Family(
        "transformer.h", None, gpt_bigcode_arch, learned_positions_keys=("n_positions", "max_position_embeddings")
    ),
    # OLMo (parameter-free LayerNorms, optional q/k/v clipping) and OLMo 2 (post-norms, q/k RMSNorms over all heads):
    # Llama's layout and projection names
    "olmo": _dense(decoder=replace(_FLAGS, parameter_free_norms=True)),
    "olmo2": _dense(decoder=replace(_FLAGS, qk_norm="all_heads")),
    # OLMo 3: OLMo 2 with sliding-window layers; SmolLM3: Llama with some layers without rotary; EXAONE 4: per-head
    # q/k norms and post-norms; ERNIE 4.5 (dense): Llama's layout; GLM and GLM-4: q/k/v biases and a fused
    # `gate_up_proj` (GLM-4: two more norms per layer)
    "olmo3": _dense(decoder=replace(_FLAGS, qk_norm="all_heads", window="from_max_window_layers")),
    "smollm3": _dense(decoder=replace(_FLAGS, tied=True)),
    "exaone4": _dense(decoder=Decoder(qk_norm="per_head", window="from_max_window_layers")),
    "ernie4_5": _dense(decoder=Decoder(head_dim=128, tied=True, biases="use_bias")),
    "glm": _dense(decoder=_GLM),
    "glm4": _dense(decoder=replace(_GLM, norms_per_layer=4)),
    # Ministral (8B, 2410): Mistral with `layer_types` windows; Ministral 3: Llama's layout; Seed-OSS: q/k/v biases
    # (`attention_bias`), o's own flag; Hunyuan dense: per-head q/k norms
    "ministral": _dense(decoder=Decoder(window="from_max_window_layers")),
    "ministral3": _dense(decoder=Decoder(head_dim=128)),
    "seed_oss": _dense(decoder=Decoder(head_dim=128, biases="seed_oss")),
    "hunyuan_v1_dense": _dense(decoder=replace(_FLAGS, qk_norm="per_head")),
    # Qwen3.5: gated DeltaNet (`linear_attn`) and gated attention (`self_attn`) layers; the MoE adds a shared expert
    "qwen3_5_text": _dense(qwen3_5_arch, mixer="gated_delta", pattern="hybrid"),
    "qwen3_5_moe_text": _GATED_DELTA_MOE,
    "qwen3_next": _GATED_DELTA_MOE,  # fused in_proj_qkvz, in_proj_ba
    # Granite 4.0 hybrid: Mamba2 (`mamba`) or attention layers, each with GraniteMoeShared's experts and shared MLP
    "granitemoehybrid": replace(_GRANITE_MOE, arch=granite_hybrid_arch, mixer="mamba2", pattern="hybrid"),
    # StarCoder2: Llama's layout, q/k/v/o with biases, a two-matrix GELU MLP `c_fc` / `c_proj`, LayerNorms
    "starcoder2": _dense(starcoder2_arch),
    # Falcon: blocks at `transformer.h`, attention `self_attention` (fused `query_key_value`, `dense`), MLP `mlp`
    # (`dense_h_to_4h`, `dense_4h_to_h`); rotary positions (ALiBi variants have no position table either)
    "falcon": Family("transformer.h", None, falcon_arch, fused_qkv=True),
    "nemotron": _dense(nemotron_arch),  # Nemotron-4: Llama's layout, a squared-ReLU up_proj / down_proj MLP
}
SUPPORTED_FAMILIES = tuple(FAMILIES)
FUSED_QKV_FAMILIES = tuple(name for name, f in FAMILIES.items() if f.fused_qkv)
GATED_DELTA_FAMILIES = tuple(name for name, f in FAMILIES.items() if f.mixer == "gated_delta")  # linear-time layers
MAMBA2_FAMILIES = tuple(name for name, f in FAMILIES.items() if f.mixer == "mamba2")
HYBRID_FAMILIES = tuple(name for name, f in FAMILIES.items() if f.pattern == "hybrid")


def arch_of(spec: ModelSpec) -> Arch:
    """The throughput model's counts of a catalog model (or any `ModelSpec` of a supported family)."""
    family = FAMILIES.get(spec.family)
    if family is None:
        raise TunecostError(
            f"{spec.name}: the throughput model reads {', '.join(FAMILIES)} configs, not {spec.family!r}"
        )
    if family.arch is None:
        return transformer_arch(spec.config, spec.family, family.decoder, family.fused_qkv)
    return family.arch(spec.config, spec.family)
