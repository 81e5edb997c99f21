"""Save and load the MoE LoRA adapters in PEFT's on-disk layouts (adapter_config.json + adapter_model.safetensors).

Sources and derivations: docs/moe-layer.md, section `tunecost.moe.adapters`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from tunecost.errors import TunecostError
from tunecost.io import atomic_write_json
from tunecost.models.anatomy import unwrap_peft as _unwrap
from tunecost.moe.install import _STATE_ATTR, moe_layers
from tunecost.moe.spec import LoraSpec, peft_lora_config

PREFIX = "base_model.model."
_PER_PROJECTION = {"w1": "gate", "w3": "up", "w2": "down"}


def _block_key(name: str, layout: str) -> str:
    if layout == "per-projection" and (name == "mlp" or name.endswith(".mlp")):
        name = name[: -len("mlp")] + "block_sparse_moe"
    return PREFIX + (f"{name}." if name else "")


def _slots(block, layout: str) -> dict[str, tuple[Callable[[], torch.Tensor], Callable[[torch.Tensor], None]]]:
    """key suffix -> (read the tensor in the saved layout, write a saved tensor into the module)."""
    slots: dict = {}
    experts, router = block.experts, block.gate

    def direct(param: torch.Tensor):
        def write(value: torch.Tensor) -> None:
            with torch.no_grad():
                param.copy_(value.reshape(param.shape))

        return (lambda: param.detach()), write

    def expert_stack(param: torch.Tensor, kind: str):
        # FastExperts keeps A as (E, r, in) and B as (E, out, r); PEFT flattens them to (E*r, in) and (out, r*E).
        num_experts, rows, cols = param.shape
        if kind == "A":
            return (lambda: param.detach().reshape(num_experts * rows, cols)), direct(param)[1]

        def write(value: torch.Tensor) -> None:
            with torch.no_grad():
                param.copy_(value.reshape(rows, cols, num_experts).permute(2, 0, 1))

        return (lambda: param.detach().permute(1, 2, 0).reshape(rows, cols * num_experts)), write

    if router.__class__.__name__ == "ParamWrapper":
        slots["gate.lora_A.weight"] = direct(router.lora_A["default"].weight)
        slots["gate.lora_B.weight"] = direct(router.lora_B["default"].weight)
    elif hasattr(router, "lora_A"):
        slots["gate.lora_A.weight"] = direct(router.lora_A.weight)
        slots["gate.lora_B.weight"] = direct(router.lora_B.weight)

    if experts.__class__.__name__ == "ParamWrapper":
        for wrapper in (experts, experts.base_layer):
            if wrapper.__class__.__name__ != "ParamWrapper":
                continue
            where = "experts.base_layer" if wrapper.parameter_name == "gate_up_proj" else "experts"
            slots[f"{where}.lora_A.weight"] = direct(wrapper.lora_A["default"].weight)
            slots[f"{where}.lora_B.weight"] = direct(wrapper.lora_B["default"].weight)
    elif getattr(experts, "lora_rank", None) is not None and hasattr(experts, "lora_layout"):  # FastExperts
        r = experts.lora_rank
        if layout == "fused":
            slots["experts.base_layer.lora_A.weight"] = expert_stack(experts.lora_A_gate_up, "A")
            slots["experts.base_layer.lora_B.weight"] = expert_stack(experts.lora_B_gate_up, "B")
            slots["experts.lora_A.weight"] = expert_stack(experts.lora_A_down, "A")
            slots["experts.lora_B.weight"] = expert_stack(experts.lora_B_down, "B")
        else:
            for e in range(experts.num_experts):
                views = {
                    "w1": (experts.lora_A_gate_up[e, :r], experts.lora_B_gate[e]),
                    "w3": (experts.lora_A_gate_up[e, r:], experts.lora_B_up[e]),
                    "w2": (experts.lora_A_down[e], experts.lora_B_down[e]),
                }
                for proj, (a, b) in views.items():
                    slots[f"experts.{e}.{proj}.lora_A.weight"] = direct(a)
                    slots[f"experts.{e}.{proj}.lora_B.weight"] = direct(b)
    elif getattr(experts, "lora_rank", None) is not None:  # Linear4bitExperts
        for e, expert in enumerate(experts.experts):
            for proj in _PER_PROJECTION:
                module = getattr(expert, proj)
                slots[f"experts.{e}.{proj}.lora_A.weight"] = direct(module.lora_A.weight)
                slots[f"experts.{e}.{proj}.lora_B.weight"] = direct(module.lora_B.weight)
    return slots


def _installed(model) -> tuple[str, LoraSpec]:
    state = getattr(model, _STATE_ATTR, None)
    if not state or state.get("lora") is None:
        raise TunecostError("no MoE LoRA installed: call install_experts(model, impl, LoraSpec(...)) first")
    if not all(hasattr(layer.block, "gate") for layer in moe_layers(model)):
        raise TunecostError(
            "saving MoE adapters is implemented for Mixtral-style models; for BlackMamba use "
            "PEFT's own save on impl 'stock', or torch.save(trainable_parameters(model))"
        )
    lora: LoraSpec = state["lora"]
    layout = lora.expert_layout or ("per-projection" if state["impl"] == "qlora-linear4bit" else "fused")
    return layout, lora


def adapter_state_dict(model) -> tuple[str, dict[str, torch.Tensor]]:
    """(layout, {key: tensor}) of the installed MoE LoRA factors in the saved layout (see docs/moe-layer.md)."""
    layout, _ = _installed(model)
    tensors = {}
    for layer in moe_layers(model):
        prefix = _block_key(layer.name, layout)
        for suffix, (read, _) in _slots(layer.block, layout).items():
            tensors[prefix + suffix] = read().contiguous().clone()
    return layout, tensors


def _adapter_config(lora: LoraSpec, layout: str) -> dict:
    if layout == "fused":
        targets = (["mlp.experts.gate_up_proj", "mlp.experts.down_proj"] if lora.on_experts else []) + (
            ["mlp.gate.weight"] if lora.on_router else []
        )
        config = peft_lora_config(lora, target_modules=[], target_parameters=targets)
    else:
        modules = (["w1", "w2", "w3"] if lora.on_experts else []) + (["gate"] if lora.on_router else [])
        config = peft_lora_config(lora, target_modules=modules)
    out = config.to_dict()
    out["tunecost_layout"] = layout
    return out


def save_adapter(model, directory: str | Path) -> Path:
    """Write adapter_config.json and adapter_model.safetensors of the installed MoE LoRA to `directory`."""
    from safetensors.torch import save_file

    layout, lora = _installed(model)
    _, tensors = adapter_state_dict(model)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)

    def plain(value):  # LoraConfig.to_dict holds sets and enums
        return sorted(value) if isinstance(value, set) else str(value)

    config = json.loads(json.dumps(_adapter_config(lora, layout), default=plain))
    tmp = directory / "adapter_model.safetensors.tmp"
    save_file({k: v.cpu() for k, v in tensors.items()}, str(tmp))
    tmp.replace(directory / "adapter_model.safetensors")
    atomic_write_json(directory / "adapter_config.json", config)
    return directory


def load_adapter(model, directory: str | Path) -> None:
    """Copy a saved MoE adapter (either layout) into the LoRA factors installed by `install_experts`.

    The installed implementation must have the same layout and rank (e.g. fused -> fast or peft-fused,
    per-projection -> qlora-linear4bit or fast with expert_layout="per-projection")."""
    from safetensors.torch import load_file

    layout, lora = _installed(model)
    directory = Path(directory)
    config = json.loads((directory / "adapter_config.json").read_text())
    saved_layout = config.get("tunecost_layout") or ("fused" if config.get("target_parameters") else "per-projection")
    if saved_layout != layout:
        raise TunecostError(f"adapter in {directory} has the {saved_layout} layout; the model has {layout} LoRA")
    if int(config["r"]) != lora.rank:
        raise TunecostError(f"adapter in {directory} has rank {config['r']}; the installed LoRA has rank {lora.rank}")
    tensors = load_file(str(directory / "adapter_model.safetensors"))
    expected = set()
    for layer in moe_layers(model):
        prefix = _block_key(layer.name, layout)
        for suffix, (_, write) in _slots(layer.block, layout).items():
            key = prefix + suffix
            expected.add(key)
            if key not in tensors:
                raise TunecostError(f"adapter in {directory} lacks {key}")
            write(tensors[key].to(device=_device_of(layer.block)))
    unused = sorted(set(tensors) - expected)
    if unused:
        raise TunecostError(
            f"adapter in {directory} has {len(unused)} tensors this model has no slot for, e.g. {unused[0]}"
        )


def _device_of(block) -> torch.device:
    return next(_unwrap(block.gate).parameters()).device
