"""MoE layers for fine-tuning: switchable experts implementations, LoRA/QLoRA on experts and router, a benchmark.

Sources and derivations: docs/moe-layer.md, section `tunecost.moe`.
"""

from __future__ import annotations

import importlib
from typing import Any

from tunecost.moe.spec import EXPERT_IMPLS, EXPERT_LORA_LAYOUTS, LoraSpec
from tunecost.workload.job import MOE_LORA_TARGETS

_LAZY = {
    "install_experts": "tunecost.moe.install",
    "uninstall_experts": "tunecost.moe.install",
    "installed_impl": "tunecost.moe.install",
    "trainable_parameters": "tunecost.moe.install",
    "moe_layers": "tunecost.moe.install",
    "save_adapter": "tunecost.moe.adapters",
    "load_adapter": "tunecost.moe.adapters",
    "adapter_state_dict": "tunecost.moe.adapters",
    "FastExperts": "tunecost.moe.fast",
    "Linear4bitExperts": "tunecost.moe.linear4bit",
    "LoraRouter": "tunecost.moe.router",
    "NF4ExpertWeights": "tunecost.moe.nf4",
    "bench_moe_layer": "tunecost.moe.bench",
    "MoeBenchRow": "tunecost.moe.bench",
    "BENCH_IMPLS": "tunecost.moe.bench",
}

__all__ = ["EXPERT_IMPLS", "EXPERT_LORA_LAYOUTS", "MOE_LORA_TARGETS", "LoraSpec", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tunecost.moe' has no attribute {name!r}")
