"""Model anatomy: where the decoder layers, MoE blocks, routers and experts of a supported model are, how many
experts it has and how many each token uses.

Sources and derivations: docs/models.md, section `tunecost.models.anatomy`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tunecost.errors import TunecostError
from tunecost.models.families import FAMILIES

if TYPE_CHECKING:
    from tunecost.models.catalog import ModelSpec


_ROUTER_NAMES = ("gate", "router")
# A decoder layer's attention and feed-forward (dense MLP or MoE block) by attribute name, across families.
# token mixers: Falcon's `self_attention`, Qwen3.5's gated DeltaNet `linear_attn`, Granite 4.0's Mamba2 `mamba`
ATTENTION_NAMES = ("self_attn", "attn", "self_attention", "linear_attn", "mamba")
FEED_FORWARD_NAMES = ("mlp", "block_sparse_moe")
_EXPERTS_NAMES = ("experts", "local_experts")
_LAYERS_NAME = re.compile(r"(^|\.)layers$")
_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# a decoder layer's module path: `...layers.<i>` (most families) or GPT-2 style `transformer.h.<i>`
LAYER_PATH = re.compile(r"(?:^|\.)(?:layers|transformer\.h)\.(\d+)(?:\.|$)")
_MAX_WRAPPERS = 16


@dataclass(frozen=True)
class MoeBlock:
    """One MoE block: its decoder layer index, module path, and the router and experts the block calls (possibly
    PEFT-wrapped: `unwrap_peft` gives the original modules)."""

    layer_index: int
    name: str
    block: Any
    router: Any
    experts: Any

    @property
    def num_experts(self) -> int:
        """Routed experts of this block: the router's `num_experts`, else the rows of its weight, else the
        length of an expert ModuleList."""
        router = unwrap_peft(self.router)
        value = getattr(router, "num_experts", None)
        if isinstance(value, int) and value > 0:
            return value
        value = getattr(self.block, "num_experts", None)
        if isinstance(value, int) and value > 0:
            return value
        weight = getattr(router, "weight", None)
        if weight is not None and weight.dim() == 2:
            return int(weight.shape[0])
        experts = unwrap_peft(self.experts)
        if hasattr(experts, "__len__"):
            return len(experts)
        raise TunecostError(f"cannot tell the number of experts of MoE block {self.name or type(self.block).__name__}")

    @property
    def top_k(self) -> int | None:
        for obj in (unwrap_peft(self.router), self.block):
            value = getattr(obj, "top_k", None)
            if isinstance(value, int) and value > 0:
                return value
        return None


def unwrap_peft(module: Any) -> Any:
    """The module under PEFT wrappers: LoRA layers and `lora.ParamWrapper`s keep the wrapped module as
    `base_layer` (ParamWrappers nest, one per targeted parameter); a `PeftModel` gives its base model."""
    get_base_model = getattr(module, "get_base_model", None)
    if callable(get_base_model) and type(module).__module__.startswith("peft"):
        module = get_base_model()
    for _ in range(_MAX_WRAPPERS):
        inner = getattr(module, "base_layer", None)
        if inner is None or inner is module:
            break
        module = inner
    return module


def model_family(model: Any) -> str | None:
    """The supported family of a model (through PEFT), or None for anything else (e.g. a bare MoE block)."""
    model = unwrap_peft(model)
    from tunecost.models.blackmamba.model import BlackMambaForCausalLM

    if isinstance(model, BlackMambaForCausalLM):
        return "blackmamba"
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    if family in FAMILIES and _attr_path(model, FAMILIES[family].layers) is not None:
        return family
    return None


def _attr_path(obj: Any, path: str) -> Any:
    for attr in path.split("."):
        obj = getattr(obj, attr, None)
        if obj is None:
            return None
    return obj


def _child(module: Any, names: tuple[str, ...]) -> Any:
    import torch

    for name in names:
        child = getattr(module, name, None)
        if isinstance(child, torch.nn.Module):
            return child
    return None


def layer_part(layer: Any, names: tuple[str, ...]) -> Any:
    """A decoder layer's child module of the first of `names` it has (`ATTENTION_NAMES`, `FEED_FORWARD_NAMES`),
    else None."""
    return _child(layer, names)


def router_name(block: Any) -> str | None:
    """The attribute of an MoE block holding its router (`gate` in most families, `router` in GraniteMoe)."""
    return next((name for name in _ROUTER_NAMES if _child(block, (name,)) is not None), None)


def decoder_layers(model: Any) -> list[Any]:
    """The decoder layers of a causal LM (through PEFT wrappers), in order. For a model of no known family: the
    longest ModuleList named `layers`."""
    import torch

    family = model_family(model)
    if family is not None:
        return list(_attr_path(unwrap_peft(model), FAMILIES[family].layers))
    best: list[Any] = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and _LAYERS_NAME.search(name) and len(module) > len(best):
            best = list(module)
    if not best:
        raise TunecostError(f"{type(model).__name__}: no decoder layers found (expected a `layers` ModuleList)")
    return best


def _block_of(module: Any, router_names: tuple[str, ...], experts_names: tuple[str, ...]) -> tuple[Any, Any] | None:
    router, experts = _child(module, router_names), _child(module, experts_names)
    return (router, experts) if router is not None and experts is not None else None


def router_and_experts(module: Any) -> tuple[Any, Any] | None:
    """(router, experts) of a module that is an MoE block of any supported family, else None."""
    return _block_of(module, _ROUTER_NAMES, _EXPERTS_NAMES)


def moe_blocks(model: Any) -> list[MoeBlock]:
    """Every MoE block of `model` in layer order (none for a dense model). A model of no known family is searched
    for modules with a router (`gate` / `router`) and experts (`experts` / `local_experts`), itself included."""
    family = model_family(model)
    if family is not None:
        spec = FAMILIES[family]
        if spec.block is None:
            return []
        names = {id(module): name for name, module in model.named_modules()}  # paths as `model` names them
        found = []
        for index, layer in enumerate(_attr_path(unwrap_peft(model), spec.layers)):
            block = getattr(layer, spec.block, None)
            parts = _block_of(block, (spec.router,), spec.experts) if block is not None else None
            if parts is not None:
                name = names.get(id(block), f"{spec.layers}.{index}.{spec.block}")
                found.append(MoeBlock(index, name, block, *parts))
        return found
    found = []
    for name, module in model.named_modules():
        parts = router_and_experts(module)
        if parts is not None and not type(module).__module__.startswith("peft"):
            match = _LAYER_INDEX.search(name + ".")
            found.append(MoeBlock(int(match.group(1)) if match else len(found), name, module, *parts))
    return found


def _config_of(model_or_config: Any) -> tuple[str | None, Any]:
    """(family, config) of a model, a transformers / BlackMamba config, or a config.json dict."""
    if isinstance(model_or_config, Mapping):
        if "mamba_moe_layers" in model_or_config:  # Zyphra's config.json has no model_type
            return "blackmamba", model_or_config
        return model_or_config.get("model_type"), model_or_config
    from tunecost.models.blackmamba.config import BlackMambaConfig

    if isinstance(model_or_config, BlackMambaConfig):
        return "blackmamba", model_or_config
    if hasattr(model_or_config, "model_type") and not hasattr(model_or_config, "named_modules"):
        return model_or_config.model_type, model_or_config
    family = model_family(model_or_config)
    return family, getattr(unwrap_peft(model_or_config), "config", None)


def _config_value(config: Any, keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value or 1  # 0 experts: Granite 4.0's dense hybrids, one MLP every token uses
    return None


def _from_config(model_or_config: Any, keys: str) -> tuple[str | None, Any, int | None]:
    """(family, config, value): the value of the family's `keys` (a `Family` field naming config keys) in the
    config, 1 for a dense family, None where the config does not say."""
    family, config = _config_of(model_or_config)
    spec = FAMILIES.get(family or "")
    if spec is None:
        return family, config, None
    return family, config, 1 if spec.block is None else _config_value(config, getattr(spec, keys))


def _from_first_block(model_or_config: Any, attr: str) -> int | None:
    """`attr` of the model's first MoE block (1 for a model without one); None for a config."""
    if not hasattr(model_or_config, "named_modules"):
        return None
    blocks = moe_blocks(model_or_config)
    return getattr(blocks[0], attr) if blocks else 1


def num_experts(model_or_config: Any) -> int:
    """Routed experts per MoE layer; 1 for a dense model (its feed-forward is the one expert every token uses)."""
    family, config, value = _from_config(model_or_config, "num_experts_keys")
    if value is None and family == "blackmamba" and isinstance(config, Mapping) and "mamba_moe_layers" in config:
        counts = [int(e) for e in config["mamba_moe_layers"] if str(e).isdigit()]  # "r" (Mamba) or an expert count
        value = max(counts) if counts else None
    value = _from_first_block(model_or_config, "num_experts") if value is None else value
    if value is None:
        raise TunecostError(f"cannot tell the number of experts of a {family or type(model_or_config).__name__} config")
    return value


def learned_positions(model_or_config: Any) -> int | None:
    """Rows of the model's learned absolute position embeddings: the longest sequence it can take. None for a
    family whose positions are computed (rotary), where any length runs."""
    family, config = _config_of(model_or_config)
    spec = FAMILIES.get(family or "")
    if spec is None or not spec.learned_positions_keys:
        return None
    return _config_value(config, spec.learned_positions_keys)


def get_top_k(model_or_config: Any) -> int:
    """Experts each token is routed to (1 for a dense model)."""
    family, _, value = _from_config(model_or_config, "top_k_keys")
    if value is None and family == "blackmamba":
        value = 1  # the released BlackMamba models route top-1 and their config may not say so
    value = _from_first_block(model_or_config, "top_k") if value is None else value
    if value is None:
        raise TunecostError(f"cannot tell the top-k of a {family or type(model_or_config).__name__} config")
    return value


def set_top_k(model: Any, k: int) -> None:
    """Route every token to its top-`k` experts from now on (k = number of experts: dense), in the config, every
    router and MoE block, and the top-k the load-balancing loss reads (`model.num_experts_per_tok`)."""
    total = num_experts(model)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= total:
        raise TunecostError(f"experts per token must be between 1 and {total}, got {k!r}")
    base = unwrap_peft(model)
    family = model_family(base)
    if family == "blackmamba":
        base.set_experts_per_token(k)  # frozen config replaced; every MoE mixer's experts_per_token
        return
    config = getattr(base, "config", None)
    if config is not None and hasattr(config, "num_experts_per_tok"):
        config.num_experts_per_tok = k
    if isinstance(getattr(base, "num_experts_per_tok", None), int):
        base.num_experts_per_tok = k
    for block in moe_blocks(model):
        for obj in (unwrap_peft(block.router), block.block):
            if isinstance(getattr(obj, "top_k", None), int):
                obj.top_k = k


def layer_pattern(spec: ModelSpec) -> tuple[int, int, int]:
    """(prefix, period, num_units) of the decoder stack: layers that repeat identically can be traced a few at a
    time and scaled (the family's `pattern`)."""
    cfg = spec.config
    n = spec.num_layers
    pattern = FAMILIES[spec.family].pattern if spec.family in FAMILIES else "uniform"
    if pattern == "dense_prefix":
        prefix = min(int(cfg.get("first_k_dense_replace") or 0), n)
        return prefix, 1, n - prefix
    if pattern == "alternating":
        return 0, 2, n // 2
    if pattern == "hybrid":  # the period of each layer's (token mixer, MoE or not)
        step, dense = int(cfg.get("decoder_sparse_step") or 1), set(cfg.get("mlp_only_layers") or [])
        kinds = [(t, i not in dense and (i + 1) % step == 0) for i, t in enumerate(cfg.get("layer_types") or [])]
        repeats = (p for p in range(1, n + 1) if all(kinds[i] == kinds[i % p] for i in range(len(kinds))))
        period = next(p for p in repeats if n % p == 0)
        return 0, period, n // period
    if pattern == "sparse_step":
        if cfg.get("mlp_only_layers"):
            return n, 1, 0  # irregular: trace every layer
        step = int(cfg.get("decoder_sparse_step") or 1)
        return 0, step, n // step
    return 0, 1, n
