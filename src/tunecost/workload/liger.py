"""What Liger's kernels change in a step, per transformers model type, as `use_liger_kernel` applies them
(liger-kernel 0.8.5's `_apply_liger_kernel_to_instance` and each model type's defaults); torch-free.

Sources: docs/memory-model.md, section `tunecost.simulate.liger`.
"""

from __future__ import annotations

# model types `_apply_liger_kernel_to_instance` patches (liger-kernel 0.8.5) among those tunecost simulates
LIGER_MODEL_TYPES = frozenset(
    {
        "deepseek_v2",
        "deepseek_v3",
        "exaone4",
        "gemma",
        "gemma2",
        "gemma3_text",
        "glm4",
        "gpt_oss",
        "granite",
        "hunyuan_v1_dense",
        "llama",
        "ministral",
        "mistral",
        "mixtral",
        "olmo2",
        "olmo3",
        "phi3",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "qwen3_5_text",
        "qwen3_5_moe_text",
        "qwen3_next",
        "smollm3",
    }
)
GEMMA_NORMS = frozenset(
    {"gemma", "gemma2", "gemma3_text", "qwen3_5_text", "qwen3_5_moe_text"}
)  # weight stored as w - 1 (offset 1), fp32 casting
NORMS_NOT_IN_PLACE = frozenset(
    {"exaone4", "gemma2", "gemma3_text", "glm4", "olmo2", "olmo3", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"}
)  # dX a new tensor
NO_GLU = frozenset({"gpt_oss"})  # swiglu=False by default
NO_FLCE = frozenset({"granite"})  # fused_linear_cross_entropy=False by default: transformers' loss on the logits
MOE_TYPES = frozenset(
    {"mixtral", "deepseek_v2", "deepseek_v3", "gpt_oss", "qwen3_moe", "qwen3_5_moe_text", "qwen3_next"}
)
CHUNK_MEM_CONST = 1  # fused_linear_cross_entropy's _CHUNK_MEM_CONST: a logits chunk of about BT x H elements


def liger_patches(family: str) -> bool:
    """Whether `use_liger_kernel` patches a model of this transformers model type (else it warns and runs the
    model's own code)."""
    return family in LIGER_MODEL_TYPES


def liger_loss_applies(family: str) -> bool:
    """Whether the patched model computes its loss with the fused linear cross-entropy."""
    return liger_patches(family) and family not in NO_FLCE


def flce_chunk_rows(tokens: int, hidden: int, vocab: int) -> int:
    """Rows of one logits chunk in Liger's fused linear cross-entropy: next_power_of_2(ceil(BT / ceil(V / H)))."""
    inc_factor = -(-vocab // (CHUNK_MEM_CONST * hidden))
    rows = -(-tokens // inc_factor)
    return min(1 << max(rows - 1, 0).bit_length(), tokens)


def liger_note(family: str) -> str:
    """What the simulated step runs of Liger for a model of this type."""
    if not liger_patches(family):
        return f"use_liger_kernel: Liger does not patch model type {family}; the step runs the model's own code"
    glu = "" if family in NO_GLU else "gated dense MLPs keep gate and up only, "
    loss = (
        "the fused linear cross-entropy keeps no logits (chunks of about tokens x hidden elements, dX and dW "
        "computed in the forward)"
        if liger_loss_applies(family)
        else "the loss on the logits as transformers computes it"
    )
    experts = "; routed experts as simulated without Liger" if family in MOE_TYPES else ""
    return (
        f"Liger kernels (use_liger_kernel): RMSNorms keep their input and the fp32 inverse RMS per row, {glu}{loss}; "
        f"rotary keeps cos and sin as eager does{experts}"
    )
