"""BlackMamba's architecture config, with the field names of Zyphra's `config.json`.

Sources and derivations: docs/models.md, section `tunecost.models.blackmamba.config`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunecost.errors import TunecostError
from tunecost.models.catalog import resolve_model

MAMBA_LAYER = "mamba"
MOE_LAYER = "moe"
TINY_LAYOUT_MODEL = "blackmamba-1.5b"  # the catalog model whose layout `tiny_blackmamba_config` shrinks


@dataclass(frozen=True, kw_only=True)
class BlackMambaConfig:
    """A BlackMamba architecture. Field names and meanings are Zyphra's (see docs/models.md)."""

    num_layers: int
    hidden_size: int
    state_size: int  # d_state of the selective scan
    conv_dimension: int  # width of Mamba's causal depthwise conv
    vocab_size: int
    expansion_factor: int  # d_inner = expansion_factor * hidden_size
    mamba_moe_layers: tuple[str, ...]  # per layer: "r" (Mamba) or an expert count ("8")
    ffn_hidden_size: int  # expert MLP width (fc1 is twice this when swiglu)
    add_bias_linear: bool = False  # biases on in/out projections and expert linears (router always has one)
    swiglu: bool = True  # gated expert MLP: gelu(fc1_a) * fc1_b, as Zyphra's `mlp.py` with F.gelu
    max_sequence_length: int = 2048
    layernorm_epsilon: float = 1e-5
    experts_per_token: int = 1  # top-k routing; the released models route top-1
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)  # other config.json keys

    def __post_init__(self) -> None:
        object.__setattr__(self, "mamba_moe_layers", tuple(str(x) for x in self.mamba_moe_layers))
        typed = [(f.name, f.type) for f in dataclasses.fields(self)]  # every int field is a positive size or count
        for name in [name for name, kind in typed if kind == "int"]:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TunecostError(f"BlackMamba config: {name} must be a positive integer, got {value!r}")
        for name in [name for name, kind in typed if kind == "bool"]:
            if not isinstance(getattr(self, name), bool):
                raise TunecostError(f"BlackMamba config: {name} must be true or false, got {getattr(self, name)!r}")
        if len(self.mamba_moe_layers) != self.num_layers:
            raise TunecostError(
                f"BlackMamba config: mamba_moe_layers has {len(self.mamba_moe_layers)} entries for "
                f"num_layers={self.num_layers}; it needs one per layer"
            )
        counts = {self._experts_in(entry) for entry in self.mamba_moe_layers} - {0}
        if len(counts) > 1:
            raise TunecostError(f"BlackMamba config: MoE layers must share one expert count, got {sorted(counts)}")
        if counts and not 1 <= self.experts_per_token <= self.num_experts:
            raise TunecostError(
                f"BlackMamba config: experts_per_token must be in 1..{self.num_experts}, got {self.experts_per_token}"
            )

    @staticmethod
    def _experts_in(entry: str) -> int:
        """0 for a Mamba layer ("r"), else the expert count of an MoE layer; anything else is refused."""
        if entry == "r":
            return 0
        if entry.isdigit() and int(entry) >= 2:
            return int(entry)
        raise TunecostError(
            f"BlackMamba config: unsupported mamba_moe_layers entry {entry!r}; tunecost supports 'r' (Mamba) "
            "and an expert count >= 2 (MoE), the only kinds in Zyphra's released models"
        )

    # Derived sizes (Zyphra `mamba_layer.py`: d_inner = expand * d_model, dt_rank = ceil(d_model / 16)).
    @property
    def d_inner(self) -> int:
        return self.expansion_factor * self.hidden_size

    @property
    def dt_rank(self) -> int:
        return math.ceil(self.hidden_size / 16)

    @property
    def layer_types(self) -> tuple[str, ...]:
        return tuple(MAMBA_LAYER if e == "r" else MOE_LAYER for e in self.mamba_moe_layers)

    @property
    def num_experts(self) -> int:
        """Experts per MoE layer (0 if the model has no MoE layer)."""
        return max((self._experts_in(e) for e in self.mamba_moe_layers), default=0)

    @property
    def num_moe_layers(self) -> int:
        return self.layer_types.count(MOE_LAYER)

    @property
    def num_mamba_layers(self) -> int:
        return self.layer_types.count(MAMBA_LAYER)

    @property
    def fc1_output_size(self) -> int:
        """Rows of an expert's linear_fc1: both halves of the gated unit when swiglu."""
        return 2 * self.ffn_hidden_size if self.swiglu else self.ffn_hidden_size

    def with_experts_per_token(self, k: int) -> BlackMambaConfig:
        return dataclasses.replace(self, experts_per_token=k)

    # (De)serialisation with Zyphra's key names.
    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, where: str = "config") -> BlackMambaConfig:
        if not isinstance(raw, Mapping):
            raise TunecostError(f"{where}: a BlackMamba config must be a JSON object, got {type(raw).__name__}")
        no_default = dataclasses.MISSING
        required = [
            f.name for f in dataclasses.fields(cls) if f.default is no_default and f.default_factory is no_default
        ]
        missing = [k for k in required if k not in raw]
        if missing:
            raise TunecostError(f"{where}: not a BlackMamba config; missing {', '.join(missing)}")
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        layers = raw["mamba_moe_layers"]
        if not isinstance(layers, (list, tuple)):
            raise TunecostError(f"{where}: mamba_moe_layers must be a list, got {type(layers).__name__}")
        known = {k: v for k, v in raw.items() if k in names}
        extra = {k: v for k, v in raw.items() if k not in names}
        try:
            return cls(**known, extra=extra)
        except TunecostError as exc:
            raise TunecostError(f"{where}: {exc}") from None
        except TypeError as exc:  # a wrong type that the dataclass itself rejects
            raise TunecostError(f"{where}: bad BlackMamba config ({exc})") from None

    @classmethod
    def from_json_file(cls, path: str | Path) -> BlackMambaConfig:
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise TunecostError(f"no BlackMamba config at {path}") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TunecostError(f"{path}: not a readable JSON file ({exc})") from None
        return cls.from_dict(raw, where=str(path))

    def to_dict(self) -> dict[str, Any]:
        """Zyphra's keys (plus `experts_per_token` and any extra keys that came in), JSON-ready."""
        out = dict(self.extra)
        for f in dataclasses.fields(self):
            if f.name != "extra":
                value = getattr(self, f.name)
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


def _with_depth(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Apply overrides; a new `num_layers` (or transformers' `num_hidden_layers`) without a new
    `mamba_moe_layers` repeats the existing layer pattern to the new depth."""
    overrides = dict(overrides)
    if "num_hidden_layers" in overrides:
        overrides["num_layers"] = overrides.pop("num_hidden_layers")
    if "num_layers" in overrides and "mamba_moe_layers" not in overrides:
        pattern = list(raw["mamba_moe_layers"])
        overrides["mamba_moe_layers"] = [pattern[i % len(pattern)] for i in range(int(overrides["num_layers"]))]
    return {**raw, **overrides}


def config_from_spec(spec: Any, *, experts_per_token: int | None = None, **overrides: Any) -> BlackMambaConfig:
    """The BlackMambaConfig of a catalog `ModelSpec` (whose `config` is Zyphra's config.json); keyword
    overrides win (e.g. num_layers=4 keeps the r/8 alternation at 4 layers)."""
    raw = _with_depth(dict(spec.config), overrides)
    if experts_per_token is not None:
        raw["experts_per_token"] = experts_per_token
    return BlackMambaConfig.from_dict(raw, where=str(getattr(spec, "name", "config")))


def tiny_blackmamba_config(**overrides: Any) -> BlackMambaConfig:
    """A CPU-sized BlackMamba: the family's layout as the catalog gives it (state 16, conv 4, expansion 2, gated
    experts, no linear biases, the real vocabulary of 50304 so real text works) at hidden 128, 4 layers (Mamba, MoE,
    Mamba, MoE), 8 experts of width 256, top-2; override anything by keyword."""
    cpu_size = {"num_layers": 4, "hidden_size": 128, "ffn_hidden_size": 256, "experts_per_token": 2}
    base = _with_depth(dict(resolve_model(TINY_LAYOUT_MODEL).config), cpu_size)
    return BlackMambaConfig(**_with_depth(base, overrides))
