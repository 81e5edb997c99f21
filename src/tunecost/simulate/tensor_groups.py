"""Which module group and memory category each tensor of a prepared model belongs to, for the breakdowns."""

from __future__ import annotations

import re
from typing import cast

import torch
from torch import nn

from tunecost.models.anatomy import FEED_FORWARD_NAMES, LAYER_PATH
from tunecost.simulate.quant4bit import Quantized4bit

# bitsandbytes 4-bit codes, GPTQ codes, LLM.int8 codes
_QUANT_BUFFERS = {"packed": "weights_4bit", "qweight": "weights_4bit", "CB": "weights_8bit"}


def module_group(path: str, module: nn.Module, parent_group: str | None) -> str | None:
    """The reporting group of a module (None: inherit the parent's)."""
    name = path.rsplit(".", 1)[-1]
    cls = type(module).__name__
    if path == "":
        return "lm_head/loss"
    if name in ("embed_tokens", "word_embeddings", "embedding", "wte", "wpe"):
        return "embedding"
    if name in ("lm_head", "output_layer"):
        return "lm_head/loss"
    if name == "rotary_emb":
        return "other"
    if parent_group != "router" and (name in ("gate", "router", "shared_expert_gate") or "Router" in cls):
        return "router"
    if name in ("experts", "local_experts"):
        return "experts"
    if name in ("shared_expert", "shared_experts", "shared_mlp"):
        return "shared_experts"
    if parent_group in ("attention", "router", "experts", "shared_experts", "mlp", "mamba"):
        return None  # everything inside those belongs to them (q_norm, LoRA factors, ...)
    if "Norm" in cls or name.endswith("norm") or name.endswith("layernorm"):
        return "norms"
    if name in ("self_attn", "attention") or "Attention" in cls:
        return "attention"
    if name in FEED_FORWARD_NAMES:
        return "experts" if hasattr(module, "experts") else "mlp"
    if name == "mixer":
        return "experts" if hasattr(module, "router") else "mamba"
    if LAYER_PATH.search(path) and re.fullmatch(r"\d+", name):
        return "residual"
    if path in ("model", "decoder", "backbone", "transformer"):
        return "other"
    return None


def module_info(model: nn.Module) -> dict[int, tuple[str, int | None]]:
    info: dict[int, tuple[str, int | None]] = {}
    groups: dict[str, str] = {}
    for path, module in model.named_modules():
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        parent_group = groups.get(parent) if path else None
        group = module_group(path, module, parent_group) or parent_group or "other"
        groups[path] = group
        m = LAYER_PATH.search(path)
        info[id(module)] = (group, int(m.group(1)) if m else None)
    return info


def static_layers(model: nn.Module, info: dict[int, tuple[str, int | None]], optimizer) -> dict[int, int]:
    """id of each parameter, buffer and optimizer state inside a decoder layer -> that layer (a state is its
    parameter's)."""
    out: dict[int, int] = {}
    for module in model.modules():
        layer = info.get(id(module), ("", None))[1]
        if layer is not None:
            out.update((id(t), layer) for t in (*module.parameters(), *module.buffers()))
    inner = getattr(optimizer, "optimizers", None)  # `step.OptimizerInBackward`: one optimizer per parameter
    for opt in inner.values() if inner is not None else (optimizer,):
        for param, state in opt.state.items():
            if id(param) in out:
                out.update((id(v), out[id(param)]) for v in state.values() if isinstance(v, torch.Tensor))
    return out


def static_tensors(model: nn.Module, info: dict[int, tuple[str, int | None]]) -> list[tuple[torch.Tensor, str, str]]:
    """Every parameter and buffer with its memory category and module group (tied tensors once)."""
    out: list[tuple[torch.Tensor, str, str]] = []
    seen: set[int] = set()
    for module in model.modules():
        group = info[id(module)][0]
        for p in module.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                out.append((p, "trainable_params" if p.requires_grad else "frozen_weights", group))
        for name, b in module.named_buffers(recurse=False):
            if b is not None and id(b) not in seen:
                seen.add(id(b))
                if isinstance(module, Quantized4bit):
                    out.append((b, _QUANT_BUFFERS.get(name, "quant_constants"), group))
                else:
                    out.append((b, "buffers", group))
    return out


def to_fake(model: nn.Module, fake_mode) -> None:
    """Replace every meta parameter and buffer with an empty fake CPU tensor (ties kept)."""
    memo: dict[int, torch.Tensor] = {}

    def fake(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in memo:
            with fake_mode:
                new = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
            memo[id(t)] = nn.Parameter(new, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else new
        return memo[id(t)]

    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = cast(nn.Parameter, fake(p))  # a parameter's copy is one
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = fake(b)
