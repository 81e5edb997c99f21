"""Switch the experts (and router LoRA) of every MoE block of a loaded model, on the instance.

An MoE block here is transformers 5's Mixtral-style block: `block.gate` a `MixtralTopKRouter` (weight (E, H),
`top_k`) and `block.experts` fused experts (`gate_up_proj` (E, 2I, H), `down_proj` (E, H, I)); the block's own
forward (`gate` -> `experts`) is untouched, so jitter noise, router-logit capture for the aux loss and gradient
checkpointing keep working. Nothing in transformers or PEFT is patched: submodules are replaced with `setattr`,
and hooks registered on a replaced module are carried over to its replacement.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from tunecost.errors import TunecostError, unknown_name_error
from tunecost.models.anatomy import MoeBlock, moe_blocks
from tunecost.models.anatomy import unwrap_peft as _unwrap
from tunecost.models.blackmamba.layers import MoEMixer
from tunecost.moe.blackmamba import install_blackmamba, uninstall_blackmamba
from tunecost.moe.fast import FastExperts
from tunecost.moe.linear4bit import Linear4bitExperts
from tunecost.moe.spec import EXPERT_IMPLS, LoraSpec, peft_lora_config

_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)
_STATE_ATTR = "_tunecost_experts"  # on the model: {"impl": name, "lora": LoraSpec | None, "quantize_4bit": bool}
_ACTIVATIONS = {  # config.hidden_act -> our activation names
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
}


def _is_moe_block(block: MoeBlock) -> bool:
    """A Mixtral-style block with transformers' fused experts (or ours) and a top-k router, or a BlackMamba MoE
    mixer."""
    if isinstance(block.block, MoEMixer):
        return True
    gate, experts = getattr(block.block, "gate", None), block.experts
    if gate is None:
        return False
    inner = _unwrap(experts)
    stock = hasattr(inner, "gate_up_proj") and hasattr(inner, "down_proj")
    return (stock or hasattr(inner, "dense_weights")) and hasattr(_unwrap(gate), "top_k")


def _blackmamba_mixers(model: nn.Module) -> list[tuple[str, Any]]:
    try:
        from tunecost.moe.blackmamba import moe_mixers
    except ImportError:  # the BlackMamba model package is optional here
        return []
    return moe_mixers(model)


def moe_layers(model: nn.Module) -> list[MoeBlock]:
    """Every MoE block of `model` (or `model` itself if it is one), in module order.

    Mixtral-style blocks: router = `block.gate`, experts = `block.experts`. BlackMamba mixers: router =
    `mixer.router`, experts = `mixer.experts` (fast impls) or `mixer.local_experts` (a ModuleList the stock loop
    calls expert by expert, so time it as mixer minus router). Found by `tunecost.models.anatomy.moe_blocks`."""
    layers = [block for block in moe_blocks(model) if _is_moe_block(block)]
    if not layers:
        raise TunecostError(
            f"no Mixtral-style MoE block (gate + fused experts) or BlackMamba MoE mixer found in "
            f"{type(model).__name__}; real runs with tunecost's experts (profile, bench) support transformers 5 "
            "Mixtral-style models (Mixtral, OLMoE, Qwen MoE) and BlackMamba; `tunecost memory` and `estimate` "
            "simulate the others"
        )
    return layers


def installed_impl(model: nn.Module) -> str:
    """The experts implementation installed by `install_experts` ("stock" if none)."""
    return getattr(model, _STATE_ATTR, {}).get("impl", "stock")


def _copy_hooks(old: nn.Module, new: nn.Module) -> None:
    for module in {id(old): old, id(_unwrap(old)): _unwrap(old)}.values():
        for attr in _HOOK_DICTS:
            if hasattr(module, attr) and hasattr(new, attr):
                getattr(new, attr).update(getattr(module, attr))


def _stock_config(experts: nn.Module, router: nn.Module, intermediate: int):
    """The config stock modules were built from (kept on our modules so uninstall can rebuild them)."""
    config = getattr(experts, "config", None) or getattr(experts, "_stock_config", None)
    if config is not None:
        return config
    return SimpleNamespace(
        num_local_experts=router.num_experts,
        hidden_size=router.hidden_dim,
        intermediate_size=intermediate,
        num_experts_per_tok=router.top_k,
        hidden_act="silu",
        _experts_implementation="grouped_mm",
    )


@dataclass(frozen=True)
class _DenseState:
    gate_up: torch.Tensor  # (E, 2I, H)
    down: torch.Tensor  # (E, H, I)
    router_weight: torch.Tensor  # (E, H)
    top_k: int
    config: Any  # the block's transformers config (what MixtralExperts / MixtralTopKRouter are built from)
    experts_trainable: bool  # base expert weights were trainable (a full fine-tune)
    router_trainable: bool


def _dense_state(block: Any, merge_lora: bool = False) -> _DenseState:
    """The plain weights of a block in any installed state (de-quantized, LoRA merged if asked)."""
    router, experts = _unwrap(block.gate), _unwrap(block.experts)
    if hasattr(experts, "dense_weights"):
        gate_up, down = experts.dense_weights(merge_lora=merge_lora)
        config = experts._stock_config
        experts_trainable = bool(getattr(experts, "gate_up_proj", gate_up).requires_grad)
    else:
        gate_up, down = experts.gate_up_proj.detach(), experts.down_proj.detach()
        config = _stock_config(experts, router, down.shape[-1])
        experts_trainable = bool(experts.gate_up_proj.requires_grad)
    weight = router.merged_weight() if (merge_lora and hasattr(router, "merged_weight")) else router.weight.detach()
    return _DenseState(
        gate_up=gate_up,
        down=down,
        router_weight=weight,
        top_k=router.top_k,
        config=config,
        experts_trainable=experts_trainable,
        router_trainable=bool(router.weight.requires_grad),
    )


def _restore_stock(block: Any, *, merge_lora: bool) -> None:
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts, MixtralTopKRouter

    experts, router = block.experts, block.gate
    if experts.__class__.__name__ == "ParamWrapper" or router.__class__.__name__ == "ParamWrapper":
        for name in ("experts", "gate"):
            module = getattr(block, name)
            if module.__class__.__name__ == "ParamWrapper":
                setattr(block, name, module.unload_and_optionally_merge_module(merge_lora, False, None))
        return
    if not hasattr(experts, "dense_weights") and not hasattr(router, "merged_weight"):
        return  # already stock
    state = _dense_state(block, merge_lora=merge_lora)
    with torch.device("meta"):  # no throw-away full-size allocation; the real tensors are assigned below
        new_experts = MixtralExperts(state.config)
        new_router = MixtralTopKRouter(state.config)
    new_experts.gate_up_proj = nn.Parameter(state.gate_up.detach().clone(), requires_grad=state.experts_trainable)
    new_experts.down_proj = nn.Parameter(state.down.detach().clone(), requires_grad=state.experts_trainable)
    new_router.weight = nn.Parameter(state.router_weight.detach().clone(), requires_grad=state.router_trainable)
    new_router.top_k = state.top_k
    _copy_hooks(experts, new_experts)
    _copy_hooks(router, new_router)
    block.experts, block.gate = new_experts, new_router


def _activation(config) -> str:
    act = getattr(config, "hidden_act", "silu")
    if act not in _ACTIVATIONS:
        raise TunecostError(f"expert activation {act!r} is not supported (supported: {', '.join(_ACTIVATIONS)})")
    return _ACTIVATIONS[act]


def _install_ours(block: Any, impl: str, lora: LoraSpec | None, *, quantize_4bit: bool, keep: bool | None) -> None:
    from tunecost.moe.router import LoraRouter

    state = _dense_state(block)
    gate_up, down, weight, config = state.gate_up, state.down, state.router_weight, state.config
    trainable_base = state.experts_trainable and lora is None and not quantize_4bit
    rank = lora.rank if lora is not None and lora.on_experts else None
    alpha = lora.alpha if lora is not None else 32
    if impl == "qlora-linear4bit":
        if lora is not None and lora.expert_layout == "fused":
            raise TunecostError("qlora-linear4bit has per-projection LoRA (w1, w3, w2); use fast for the fused layout")
        experts: nn.Module = Linear4bitExperts(gate_up, down, activation=_activation(config), lora=lora)
    else:
        layout = (lora.expert_layout if lora is not None else None) or "fused"
        experts = FastExperts(
            gate_up,
            down,
            activation=_activation(config),
            lora_rank=rank,
            lora_alpha=alpha,
            lora_layout=layout,
            quantize_4bit=quantize_4bit,
            keep_dequantized=keep,
            trainable_base=trainable_base,
        )
    experts._stock_config = config
    _copy_hooks(block.experts, experts)
    block.experts = experts
    if lora is not None and lora.on_router:
        router_config = SimpleNamespace(
            num_experts_per_tok=state.top_k, num_local_experts=weight.shape[0], hidden_size=weight.shape[1]
        )
        router = LoraRouter(router_config, weight, rank=lora.rank, alpha=lora.alpha)
        _copy_hooks(block.gate, router)
        block.gate = router


def _install_peft(model: nn.Module, layers: list[MoeBlock], lora: LoraSpec) -> None:
    from peft import inject_adapter_in_model

    if lora.expert_layout == "per-projection":
        raise TunecostError("peft-fused has PEFT's fused LoRA layout; use fast or qlora-linear4bit for per-projection")
    targets = []
    for layer in layers:
        prefix = f"{layer.name}." if layer.name else ""
        if lora.on_experts:
            targets += [f"{prefix}experts.gate_up_proj", f"{prefix}experts.down_proj"]
        if lora.on_router:
            targets.append(f"{prefix}gate.weight")
    requires_grad = {id(p): p.requires_grad for p in model.parameters()}
    had_config = hasattr(model, "peft_config")
    config = peft_lora_config(lora, target_modules=[], target_parameters=targets)
    inject_adapter_in_model(config, model)
    if not had_config and hasattr(model, "peft_config"):
        del model.peft_config  # PEFT leaves its config on the model; we keep ours in _STATE_ATTR
    for p in model.parameters():  # PEFT froze everything; install_experts decides that itself
        if id(p) in requires_grad:
            p.requires_grad_(requires_grad[id(p)])


def install_experts(
    model: nn.Module,
    impl: str,
    lora: LoraSpec | None = None,
    *,
    quantize_4bit: bool = False,
    keep_dequantized: bool | None = None,
    freeze_base: bool = True,
) -> nn.Module:
    """Install experts implementation `impl` (one of `EXPERT_IMPLS`) with optional LoRA in every MoE block.

    Weights are taken from the blocks as they are (whatever was installed before is removed first, without
    merging its LoRA). With `lora` and `freeze_base`, every parameter whose name lacks "lora_" is frozen (as
    PEFT's `get_peft_model` does); without `lora` the trainability of the weights is left as it was (4-bit
    weights are always frozen). `keep_dequantized` (fast-4bit only): True keeps the de-quantized weights of the
    experts hit from forward to backward (one de-quantization per step, but each layer holds them until its
    backward); False de-quantizes again in the backward; None (default) keeps them only in a gradient-
    checkpointing recomputation, where one layer at a time holds them. Returns `model` (changed in place).
    """
    if impl not in EXPERT_IMPLS:
        raise unknown_name_error("experts implementation", impl, EXPERT_IMPLS)
    if impl == "fast-4bit":
        impl, quantize_4bit = "fast", True
    blackmamba = bool(_blackmamba_mixers(model))
    if impl == "stock" and lora is not None and not blackmamba:
        impl = "peft-fused"  # transformers' experts with LoRA means PEFT's ParamWrapper
    if impl == "peft-fused" and lora is None:
        raise TunecostError("peft-fused is PEFT LoRA on the fused experts: give a LoRA spec (or use stock)")
    if impl in ("stock", "peft-fused") and quantize_4bit:
        raise TunecostError(
            f"{impl} cannot hold experts in 4-bit (transformers 5 + bitsandbytes do not quantize fused experts); "
            "use qlora-linear4bit or fast-4bit"
        )
    layers = moe_layers(model)
    if blackmamba:
        install_blackmamba(model, impl, lora, quantize_4bit=quantize_4bit, keep_dequantized=keep_dequantized)
    else:
        uninstall_experts(model)
        if impl == "peft-fused":
            assert lora is not None  # refused above
            _install_peft(model, layers, lora)
        elif impl != "stock":
            for layer in layers:
                _install_ours(layer.block, impl, lora, quantize_4bit=quantize_4bit, keep=keep_dequantized)
    if lora is not None and freeze_base:
        for name, p in model.named_parameters():
            p.requires_grad_("lora_" in name)
    stored = "qlora-linear4bit" if impl == "qlora-linear4bit" else ("fast-4bit" if quantize_4bit else impl)
    quantized = quantize_4bit or impl == "qlora-linear4bit"
    setattr(model, _STATE_ATTR, {"impl": stored, "lora": lora, "quantize_4bit": quantized})
    return model


def uninstall_experts(model: nn.Module, *, merge_lora: bool = False) -> nn.Module:
    """Put transformers' own router and fused experts back in every MoE block (de-quantized weights if they were
    4-bit; with `merge_lora` the LoRA update s·B·A is added into them, otherwise the adapters are dropped)."""
    if _blackmamba_mixers(model):
        return uninstall_blackmamba(model, merge_lora=merge_lora)
    for layer in moe_layers(model):
        _restore_stock(layer.block, merge_lora=merge_lora)
    if hasattr(model, _STATE_ATTR):
        delattr(model, _STATE_ATTR)
    return model


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """Every parameter that requires a gradient, by name (after install_experts with LoRA: the LoRA factors)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}
