"""Tiny, randomly initialised models of the paper's architectures, for CPU runs and tests.

Same code paths as the real models (transformers' Mixtral classes), only smaller: hidden 256, 4 layers,
8 experts, top-2, and the real Mixtral vocabulary (32000) so the real tokenizer works with them.
"""

from __future__ import annotations

from typing import Any

from tunecost.models.catalog import model_catalog


def _tiny_defaults() -> dict[str, Any]:
    """The tiny Mixtral's config, from the model catalog entry `tiny-mixtral` (one source of truth)."""
    config = dict(model_catalog()["tiny-mixtral"].config)
    config.pop("architectures", None)
    config.pop("model_type", None)
    return {**config, "output_router_logits": False, "attn_implementation": "sdpa"}


def tiny_mixtral_config(**overrides: Any):
    """A transformers `MixtralConfig` for a tiny Mixtral (see module docstring); keyword overrides win."""
    from transformers import MixtralConfig

    kwargs = {**_tiny_defaults(), **overrides}
    attn = kwargs.pop("attn_implementation")
    config = MixtralConfig(**kwargs)
    config._attn_implementation = attn
    return config


def build_tiny_mixtral(seed: int = 0, **overrides: Any):
    """A randomly initialised tiny `MixtralForCausalLM` in fp32 on CPU (deterministic for a seed)."""
    import torch
    from transformers import MixtralForCausalLM

    config = tiny_mixtral_config(**overrides)
    torch.manual_seed(seed)
    model = MixtralForCausalLM(config)
    return model.float()
