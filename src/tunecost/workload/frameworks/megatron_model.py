"""The catalog model a NeMo / Megatron-LM file trains, which it names only through its Hugging Face tokenizer or its
architecture keys: the tokenizer's model where its architecture is the file's, else the one catalog model of that
architecture; several or none leave the model to --model, naming the candidates."""

from __future__ import annotations

from dataclasses import dataclass

from tunecost.errors import TunecostError
from tunecost.models.catalog import ModelSpec, model_catalog, resolve_model


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """A decoder's sizes as Megatron's keys state them (ffn: the FFN's, per expert in an MoE; None: unstated)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int | None
    experts: int

    def of(self, spec: ModelSpec) -> bool:
        """Whether `spec` has this architecture."""
        try:
            sizes = (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.num_experts)
        except TunecostError:  # a config without one of the sizes (a Mamba model's heads)
            return False
        same = sizes == (self.layers, self.hidden, self.heads, self.kv_heads, self.experts)
        return same and (self.ffn is None or spec.config.get("intermediate_size") == self.ffn)

    @property
    def text(self) -> str:
        ffn = f", FFN {self.ffn}" if self.ffn else ""
        experts = f", {self.experts} experts" if self.experts > 1 else ""
        return f"{self.layers} layers, hidden {self.hidden}, {self.heads} heads, {self.kv_heads} KV heads{ffn}{experts}"


def file_model(
    tokenizer: str | None, tokenizer_key: str, arch: Architecture | None, title: str
) -> tuple[str | None, str]:
    """(the catalog model the file trains, or None, and the note saying how it was found or what to give)."""
    named = _catalog_model(tokenizer)
    if named is not None and (arch is None or arch.of(named)):
        return _hub_name(named), f"model {_hub_name(named)}: the file's {tokenizer_key} {tokenizer}"
    if arch is None:
        return None, f"model: {title} restores a checkpoint or builds from its architecture keys (give --model)"
    found = [s for s in model_catalog().values() if arch.of(s)]
    if len(found) == 1:
        return _hub_name(found[0]), f"model {_hub_name(found[0])}: the catalog's one model of {arch.text}"
    which = f"that of {', '.join(_hub_name(s) for s in found)}" if found else "no catalog model's"
    return None, f"model: the file's architecture ({arch.text}) is {which} (give --model)"


def _catalog_model(name: str | None) -> ModelSpec | None:
    if not name:
        return None
    try:
        return resolve_model(name)
    except TunecostError:
        return None


def _hub_name(spec: ModelSpec) -> str:
    return spec.hub_id or spec.name
