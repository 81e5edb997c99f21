"""Attention as a fused kernel runs it on fake tensors (causal SDPA without a mask, no dropout probabilities), and
the core attention recomputed in backward (selective recomputation)."""

from __future__ import annotations

import sys
from typing import Any

from torch import nn

from tunecost.models.anatomy import ATTENTION_NAMES, decoder_layers, layer_part
from tunecost.models.catalog import ModelSpec

MASK_FREE_SDPA = "tunecost_sdpa"


def mask_free_sdpa() -> str:
    """Register (once) transformers' SDPA attention under a name with no mask function, so no 4-D mask is built
    and SDPA runs causal without one, on real and fake tensors alike: what flash-attention / SDPA do for a batch
    without padding. (For fake tensors transformers cannot prove the mask is all ones, so its own `sdpa` path would
    materialize a (B, 1, L, L) mask that a real run skips.)"""
    from transformers import AttentionInterface

    if MASK_FREE_SDPA not in AttentionInterface._global_mapping:
        AttentionInterface.register(MASK_FREE_SDPA, _fused_attention)
    return MASK_FREE_SDPA


def _fused_attention(*args: Any, **kwargs: Any) -> Any:
    """transformers' SDPA attention, standing for a fused kernel. Gemma 2's attention-logit soft-capping (`softcap`)
    and gpt-oss's attention sinks (`s_aux`, one logit per head), which SDPA refuses, are dropped: the fused kernels
    that support them (FlashAttention-2's softcap, FlashAttention-3's sinks) apply them inside the kernel, with the
    same tensors kept."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    kwargs.pop("softcap", None)
    kwargs.pop("s_aux", None)
    return sdpa_attention_forward(*args, **kwargs)


def recomputed_attention(base_name: str) -> str:
    """Register (once) the attention function `base_name` run under non-re-entrant checkpointing: the core
    attention (scores, softmax, the kernel's saved output and log-sum-exp) recomputed in backward from its saved
    query, key and value, as Megatron's selective recomputation runs it. The base's mask function comes along."""
    from torch.utils.checkpoint import checkpoint
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.models.llama import modeling_llama

    name = f"{base_name}_recomputed"
    if name not in AttentionInterface._global_mapping:
        base = AttentionInterface._global_mapping.get(base_name)

        def forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            # "eager" is no registered function: each model's modeling file has its own
            own = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
            fn = base or own or modeling_llama.eager_attention_forward
            return checkpoint(fn, module, *args, use_reentrant=False, **kwargs)

        AttentionInterface.register(name, forward)
        if base_name in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
            ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base_name])
    return name


def falcon_fused_attention(model: nn.Module) -> None:
    """Falcon as a fused attention kernel runs it: causal SDPA, no mask. transformers 5.23's `FalconAttention` calls
    torch SDPA itself when its config says "sdpa" (else it adds a mask to explicit scores), and `FalconModel` builds
    a 4-D mask for it whatever the batch (`allow_is_causal_skip=False`). So the attention modules get a config copy
    that says "sdpa" (with no mask SDPA runs `is_causal`), while the model's own config keeps the mask-free name and
    builds no mask: what FlashAttention-2 (`FalconFlashAttention2`) does for a batch without padding. (A real SDPA run
    also keeps that (B, 1, L, L) boolean mask: B x L^2 bytes, not counted.)"""
    import copy

    for layer in decoder_layers(model):
        attention = layer_part(layer, ATTENTION_NAMES)
        own = copy.copy(attention.config)
        own._attn_implementation = "sdpa"
        attention.config = own


# Config keys of the attention-probability dropout (GPT-2 style `attn_pdrop`, transformers' `attention_dropout`).
_ATTENTION_DROPOUT_KEYS = ("attention_dropout", "attn_pdrop")


def fused_attention_dropout(spec: ModelSpec) -> dict[str, float]:
    """Config overrides that turn off attention-probability dropout for a fused attention kernel. FlashAttention-2
    (and SDPA's flash / memory-efficient CUDA kernels) apply that dropout inside the kernel and keep only its RNG
    state for backward, so the memory is that of the kernel without dropout; on CPU fake tensors SDPA with dropout
    would instead fall back to the math path and materialize the (B, heads, L, L) probabilities. Residual and
    embedding dropout (separate `nn.Dropout` modules, whose masks are kept) are left as they are."""
    return {key: 0.0 for key in _ATTENTION_DROPOUT_KEYS if spec.config.get(key)}
