"""Experts implementations for BlackMamba's MoE mixers (`tunecost.models.blackmamba.MoEMixer`).

Sources and derivations: docs/moe-layer.md, section `tunecost.moe.blackmamba`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tunecost.errors import TunecostError
from tunecost.models.anatomy import moe_blocks
from tunecost.models.blackmamba.layers import BlackMambaExpert, MoEMixer
from tunecost.moe.fast import FastExperts
from tunecost.moe.linear4bit import LoraLinear, make_linear4bit
from tunecost.moe.spec import LoraSpec, peft_lora_config

_STATE_ATTR = "_tunecost_experts"


def moe_mixers(model: nn.Module) -> list[tuple[str, Any]]:
    """(name, mixer) of every BlackMamba MoE mixer, stock or fast (`tunecost.models.anatomy.moe_blocks`)."""
    return [(b.name, b.block) for b in moe_blocks(model) if isinstance(b.block, MoEMixer)]


class FastMoEMixer(MoEMixer):
    """BlackMamba's MoE mixer with `FastExperts` (GELU-gated) behind the same forward contract."""

    def __init__(self, *, layer_idx: int, experts_per_token: int, router: nn.Module, experts: FastExperts) -> None:
        nn.Module.__init__(self)  # MoEMixer.__init__ would allocate E expert modules we do not use
        self.layer_idx = layer_idx
        self.num_experts = experts.num_experts
        self.experts_per_token = experts_per_token
        self.router = router
        self.experts = experts

    def forward(self, hidden_states: torch.Tensor, output_router_logits: bool = False):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        router_logits = self.router(x)
        scores, chosen = torch.sigmoid(router_logits).topk(self.experts_per_token, dim=-1)
        out = self.experts(x, chosen, scores.to(x.dtype)).reshape(shape)
        if not output_router_logits:
            return out
        return out, (router_logits, self.experts.last_tokens_per_expert)


def _unwrap_linear(module: nn.Module) -> Any:
    return module.base_layer if isinstance(module, LoraLinear) else module


def _linear_weight(module: nn.Module, merge_lora: bool) -> torch.Tensor:
    base = _unwrap_linear(module)
    if hasattr(base.weight, "quant_state"):
        import bitsandbytes.functional as bnbf

        weight = bnbf.dequantize_4bit(base.weight.data, base.weight.quant_state)
    else:
        weight = base.weight.detach()
    if merge_lora and isinstance(module, LoraLinear):
        weight = weight + module.scaling * (module.lora_B.weight @ module.lora_A.weight)
    return weight


def _stacked(mixer: Any, merge_lora: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(mixer, FastMoEMixer):
        return mixer.experts.dense_weights(merge_lora=merge_lora)
    experts = mixer.local_experts
    if any(_unwrap_linear(e.linear_fc1).bias is not None for e in experts) or not experts[0].swiglu:
        raise TunecostError("tunecost's BlackMamba experts need gated (swiglu) experts without linear biases")
    fc1 = torch.stack([_linear_weight(e.linear_fc1, merge_lora) for e in experts])
    fc2 = torch.stack([_linear_weight(e.linear_fc2, merge_lora) for e in experts])
    return fc1, fc2


def _lora_router(router: Any, lora: LoraSpec | None) -> nn.Module:
    if lora is None or not lora.on_router:
        return router
    return LoraLinear(router, rank=lora.rank, alpha=lora.alpha, dtype=router.weight.dtype)


def _plain_linear(module: Any, merge_lora: bool) -> nn.Linear:
    base = _unwrap_linear(module)
    weight = _linear_weight(module, merge_lora)
    bias = getattr(base, "bias", None)
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    layer.requires_grad_(not isinstance(module, LoraLinear) and base.weight.dtype.is_floating_point)
    return layer


def uninstall_blackmamba(model: nn.Module, *, merge_lora: bool = False) -> nn.Module:
    for name, module in list(model.named_modules()):  # PEFT lora.Linear layers (stock + LoRA)
        if hasattr(module, "get_base_layer") and module.__class__.__module__.startswith("peft."):
            parent_name, _, child = name.rpartition(".")
            if merge_lora:
                module.merge()
            setattr(model.get_submodule(parent_name) if parent_name else model, child, module.get_base_layer())
    for name, mixer in moe_mixers(model):
        parent_name, _, child = name.rpartition(".")
        if isinstance(mixer, FastMoEMixer):
            fc1, fc2 = _stacked(mixer, merge_lora)
            config: Any = model.config  # a BlackMambaConfig, also when reached through a PEFT wrapper
            restored = MoEMixer(config, mixer.layer_idx)
            restored.experts_per_token = mixer.experts_per_token
            restored.router = _plain_linear(mixer.router, merge_lora)
            restored.to(device=fc1.device, dtype=fc1.dtype)
            trainable = bool(getattr(mixer.experts, "gate_up_proj", fc1).requires_grad)
            with torch.no_grad():
                for e, expert in enumerate(restored.local_experts):
                    assert isinstance(expert, BlackMambaExpert)
                    expert.linear_fc1.weight.copy_(fc1[e])
                    expert.linear_fc2.weight.copy_(fc2[e])
                    expert.requires_grad_(trainable)
            model.get_submodule(parent_name).__setattr__(child, restored)
            continue
        mixer.router = _plain_linear(mixer.router, merge_lora) if isinstance(mixer.router, LoraLinear) else mixer.router
        for expert in mixer.local_experts:
            assert isinstance(expert, BlackMambaExpert)
            for proj in ("linear_fc1", "linear_fc2"):
                layer = getattr(expert, proj)
                if isinstance(layer, LoraLinear) or hasattr(layer.weight, "quant_state"):
                    setattr(expert, proj, _plain_linear(layer, merge_lora))
    if hasattr(model, _STATE_ATTR):
        delattr(model, _STATE_ATTR)
    return model


def install_blackmamba(
    model: nn.Module, impl: str, lora: LoraSpec | None, *, quantize_4bit: bool, keep_dequantized: bool | None
) -> None:
    """The BlackMamba half of `install_experts` (same arguments; impl already normalised, LoRA not frozen yet)."""
    mixers = moe_mixers(model)
    uninstall_blackmamba(model)
    if impl == "peft-fused":
        raise TunecostError(
            "BlackMamba has per-expert Linear layers, no fused experts: use stock (PEFT lora.Linear), "
            "fast or qlora-linear4bit"
        )
    if impl == "stock":
        if lora is not None:
            _install_peft_linear(model, mixers, lora)
        return
    if lora is not None and lora.expert_layout == "per-projection" and impl != "qlora-linear4bit":
        raise TunecostError("BlackMamba's linear_fc1 is one fused projection: use the fused LoRA layout")
    expert_lora = lora if lora is not None and lora.on_experts else None
    for name, mixer in mixers:
        if impl == "qlora-linear4bit":
            for expert in mixer.local_experts:
                for proj in ("linear_fc1", "linear_fc2"):
                    weight = getattr(expert, proj).weight
                    layer = make_linear4bit(weight)
                    if expert_lora is not None:
                        layer = LoraLinear(layer, rank=expert_lora.rank, alpha=expert_lora.alpha, dtype=weight.dtype)
                    setattr(expert, proj, layer)
            mixer.router = _lora_router(mixer.router, lora)
            continue
        fc1, fc2 = _stacked(mixer)
        experts = FastExperts(
            fc1,
            fc2,
            activation="gelu",
            lora_rank=expert_lora.rank if expert_lora is not None else None,
            lora_alpha=lora.alpha if lora is not None else 32,
            quantize_4bit=quantize_4bit,
            keep_dequantized=keep_dequantized,
            gate_up_quant_parts=1,  # linear_fc1 is one Linear4bit in qlora
            trainable_base=lora is None
            and not quantize_4bit
            and bool(mixer.local_experts[0].linear_fc1.weight.requires_grad),
        )
        fast = FastMoEMixer(
            layer_idx=mixer.layer_idx,
            experts_per_token=mixer.experts_per_token,
            router=_lora_router(mixer.router, lora),
            experts=experts,
        )
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, fast)


def _install_peft_linear(model: nn.Module, mixers, lora: LoraSpec) -> None:
    from peft import inject_adapter_in_model

    targets = []
    for name, mixer in mixers:
        if lora.on_experts:
            targets += [
                f"{name}.local_experts.{e}.{proj}"
                for e in range(len(mixer.local_experts))
                for proj in ("linear_fc1", "linear_fc2")
            ]
        if lora.on_router:
            targets.append(f"{name}.router")
    requires_grad = {id(p): p.requires_grad for p in model.parameters()}
    had_config = hasattr(model, "peft_config")
    inject_adapter_in_model(peft_lora_config(lora, target_modules=targets), model)
    if not had_config and hasattr(model, "peft_config"):
        del model.peft_config
    for p in model.parameters():
        if id(p) in requires_grad:
            p.requires_grad_(requires_grad[id(p)])
