"""The model catalog: architecture facts (a Hugging Face style config per model), each with its source.

Data lives in `catalog/data/models/*.json`. A model can also be named by a local `config.json` (or a folder holding
one) or by a hub id whose config is in the local Hugging Face cache; nothing is downloaded.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from tunecost.errors import TunecostError, unknown_name_error
from tunecost.models.anatomy import get_top_k, learned_positions, num_experts
from tunecost.models.families import FAMILIES, SUPPORTED_FAMILIES
from tunecost.models.hub import hub_file

MODEL_CATALOG_DIR = Path(__file__).parents[1] / "catalog" / "data" / "models"

# Config keys that name the expert count or the top-k in some family (validated as positive integers below)
_EXPERT_KEYS = tuple(dict.fromkeys(k for f in FAMILIES.values() for k in (*f.num_experts_keys, *f.top_k_keys)))
# GPT-2 style config.json names of the same sizes (GPTBigCode's `attribute_map` in transformers).
_LAYERS_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
_HIDDEN_KEYS = ("hidden_size", "n_embd")
_HEADS_KEYS = ("num_attention_heads", "n_head")


def _first_int(config: dict[str, Any], keys: tuple[str, ...]) -> int:
    value = next((config[k] for k in keys if config.get(k) is not None), None)
    if value is None:
        raise TunecostError(f"model config lacks {' / '.join(keys)}")
    return int(value)


@dataclass(frozen=True, kw_only=True)
class GptqCheckpoint:
    """A GPTQ int4 checkpoint of a catalog model: its base model's architecture, int4 linear layers in auto-gptq's
    layout, with the group size and act-order flag of its quantize_config."""

    hub_id: str
    group_size: int  # -1: one group over all inputs
    desc_act: bool
    bits: int = 4
    source: str = ""


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """One model: its architecture config (facts) and where they came from. Derived sizes are properties."""

    name: str
    family: str  # transformers model_type, or "blackmamba"
    config: dict[str, Any] = field(repr=False)
    hub_id: str | None = None
    aliases: tuple[str, ...] = ()  # other hub ids with the same config (re-uploads, chat/instruct variants)
    source: str = ""
    as_of: str = ""
    published_total_params: float | None = None
    published_active_params: float | None = None
    published_params_source: str | None = None
    local_path: str | None = None  # where weights may live (a local folder), when named by path
    gptq_checkpoints: tuple[GptqCheckpoint, ...] = ()  # GPTQ int4 checkpoints with this architecture
    not_modelled: str = ""  # what of the checkpoint the config leaves out (e.g. a vision tower), said with results

    @property
    def not_modelled_notes(self) -> tuple[str, ...]:
        """The assumption line results carry for `not_modelled` (none when the config is the whole checkpoint)."""
        return (f"{self.name}: {self.not_modelled}",) if self.not_modelled else ()

    @property
    def num_experts(self) -> int:
        """Routed experts per MoE layer (1 for a dense model)."""
        return num_experts({**self.config, "model_type": self.family})

    @property
    def default_experts_per_token(self) -> int:
        return get_top_k({**self.config, "model_type": self.family})

    def top_k(self, experts_per_token: int | None) -> int:
        """The experts per token a job runs: its own choice, or the model's (None)."""
        return self.default_experts_per_token if experts_per_token is None else experts_per_token

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def num_layers(self) -> int:
        return _first_int(self.config, _LAYERS_KEYS)

    @property
    def hidden_size(self) -> int:
        return _first_int(self.config, _HIDDEN_KEYS)

    @property
    def num_heads(self) -> int:
        """Attention heads (0: no attention, e.g. Mamba layers)."""
        return _first_int(self.config, _HEADS_KEYS) if any(k in self.config for k in _HEADS_KEYS) else 0

    @property
    def num_kv_heads(self) -> int:
        """Key-value heads (grouped-query attention); the attention heads when the config gives none."""
        keys = ("num_key_value_heads", "num_kv_heads")
        return _first_int(self.config, keys) if any(self.config.get(k) for k in keys) else self.num_heads

    @property
    def head_dim(self) -> int:
        return int(self.config.get("head_dim") or self.hidden_size // max(1, self.num_heads))

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model can take: its learned position embeddings (None: rotary, no limit)."""
        return learned_positions({**self.config, "model_type": self.family})

    def check_seq_len(self, seq_len: int) -> None:
        """A one-line error when `seq_len` tokens exceed the model's learned positions."""
        limit = self.max_positions
        if limit is not None and seq_len > limit:
            raise TunecostError(
                f"{self.name}: a sequence of {seq_len} tokens exceeds its {limit} learned position embeddings "
                f"(config n_positions); give --seq-len {limit} or less"
            )


def _spec_from_catalog_file(path: Path) -> ModelSpec:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TunecostError(f"{path}: not valid JSON ({exc})") from None
    try:
        return ModelSpec(
            name=raw["name"],
            family=raw["family"],
            config=raw["config"],
            hub_id=raw.get("hub_id"),
            aliases=tuple(raw.get("aliases", ())),
            source=raw.get("source", ""),
            as_of=raw.get("as_of", ""),
            published_total_params=raw.get("published_total_params"),
            published_active_params=raw.get("published_active_params"),
            published_params_source=raw.get("published_params_source"),
            gptq_checkpoints=tuple(GptqCheckpoint(**c) for c in raw.get("gptq_checkpoints", ())),
            not_modelled=raw.get("not_modelled", ""),
        )
    except (KeyError, TypeError) as exc:
        raise TunecostError(f"{path}: missing key {exc}") from None


@lru_cache(maxsize=1)
def model_catalog() -> dict[str, ModelSpec]:
    specs = [_spec_from_catalog_file(p) for p in sorted(MODEL_CATALOG_DIR.glob("*.json"))]
    return {s.name: s for s in specs}


def _family_of(config: dict[str, Any], where: str) -> str:
    if "mamba_moe_layers" in config:
        return "blackmamba"
    family = config.get("model_type")
    if family not in SUPPORTED_FAMILIES:
        raise TunecostError(
            f"{where}: unsupported architecture model_type={family!r}; "
            f"tunecost supports: {', '.join(SUPPORTED_FAMILIES)}"
        )
    return family


# Architecture sizes a config must give as positive integers (transformers accepts e.g. a negative hidden size).
_POSITIVE_SIZES = (
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "n_embd",
    "n_layer",
    "n_head",
    "n_inner",
    "num_kv_heads",  # Falcon's key/value heads (new decoder architecture)
    "ffn_hidden_size",  # Falcon's MLP width
    *_EXPERT_KEYS,
)
# transformers' bookkeeping keys, not architecture facts: never filled in from its defaults.
_NOT_DEFAULTED = frozenset(
    {
        "_name_or_path",
        "architectures",
        "dtype",
        "torch_dtype",
        "transformers_version",
        "id2label",
        "label2id",
        "model_type",
    }
)


def _with_transformers_defaults(config: dict[str, Any], family: str, where: str) -> dict[str, Any]:
    """A user's config as transformers will read it: each missing key takes transformers' default (a minimal
    {"model_type": "mixtral"} has 8 experts there too), and a value transformers rejects is a one-line error here
    rather than a traceback later. BlackMamba configs are checked by tunecost's own BlackMambaConfig."""
    if family == "blackmamba":
        return config
    from transformers import CONFIG_MAPPING

    raw = {k: v for k, v in config.items() if k not in _NOT_DEFAULTED}
    try:
        defaults = CONFIG_MAPPING[family](**raw).to_dict()
    except Exception as exc:
        reason = str(exc).strip().splitlines() or [type(exc).__name__]
        raise TunecostError(f"{where}: transformers rejects this {family} config: {' '.join(reason[:3])}") from None
    filled = {k: v for k, v in defaults.items() if k not in config and k not in _NOT_DEFAULTED and v is not None}
    merged = {**config, **filled}
    dense_hybrid = family == "granitemoehybrid" and merged.get("num_local_experts") == 0  # Granite 4.0's dense models
    bad = [
        f"{k}={merged[k]!r}"
        for k in _POSITIVE_SIZES
        if merged.get(k) is not None and not (isinstance(merged[k], int) and merged[k] > 0)
        if not (dense_hybrid and k in ("num_local_experts", "num_experts_per_tok"))
    ]
    if bad:
        raise TunecostError(f"{where}: sizes must be positive integers: {', '.join(bad)}")
    return merged


def spec_from_config_file(path: Path) -> ModelSpec:
    """A model named by a local config.json (or a folder holding one)."""
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.is_file():
        raise TunecostError(f"no config.json at {path}")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TunecostError(f"{config_path}: not valid JSON ({exc})") from None
    except UnicodeDecodeError:
        raise TunecostError(f"{config_path}: not a text file (a model config.json is UTF-8 JSON)") from None
    if not isinstance(config, dict):
        raise TunecostError(f"{config_path}: a model config is a JSON object, found a {type(config).__name__}")
    text = _text_model_config(config)
    family = _family_of(text or config, str(config_path))
    return ModelSpec(
        name=str(path),
        family=family,
        config=_with_transformers_defaults(text or config, family, str(config_path)),
        source=f"{config_path} (its text_config)" if text else str(config_path),
        local_path=str(config_path.parent),
        not_modelled=TEXT_MODEL_NOT_MODELLED if text else "",
    )


# Vision-language checkpoints whose text fine-tune tunecost models as their text model: model_type -> the
# model_type of their `text_config` (transformers 5.23: Gemma3Config builds a Gemma3TextConfig from it; None: the
# text_config's own, as Mistral3Config takes it: ministral3 in Ministral 3, mistral in Mistral Small 3.1; Qwen3.5's
# checkpoints are all Qwen3_5(Moe)ForConditionalGeneration)
_TEXT_MODEL_OF: dict[str, str | None] = {"gemma3": "gemma3_text", "mistral3": None}
_TEXT_MODEL_OF |= {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
# the checkpoint class's tie_word_embeddings default (transformers 5.23), where a config.json leaves it out
_TIED_BY_DEFAULT = {"gemma3": True, "mistral3": True, "qwen3_5": False, "qwen3_5_moe": False}
TEXT_MODEL_NOT_MODELLED = (
    "a vision-language checkpoint modelled as its text model: the vision tower and projector are not counted"
)


def _text_model_config(config: dict[str, Any]) -> dict[str, Any] | None:
    """The text model's config of a vision-language config.json (None for any other config)."""
    model_type = str(config.get("model_type"))
    text = config.get("text_config")
    if model_type not in _TEXT_MODEL_OF or not isinstance(text, dict):
        return None
    text_family = _TEXT_MODEL_OF[model_type] or text.get("model_type")
    if not text_family:
        return None
    # the checkpoint's own tie_word_embeddings ties its head
    text = {**text, "tie_word_embeddings": bool(config.get("tie_word_embeddings", _TIED_BY_DEFAULT[model_type]))}
    return {**text, "model_type": text_family}


def gptq_checkpoint(name: str) -> GptqCheckpoint | None:
    """The GPTQ checkpoint a hub id names (any case), or None."""
    key = name.strip().lower()
    for spec in model_catalog().values():
        for checkpoint in spec.gptq_checkpoints:
            if checkpoint.hub_id.lower() == key:
                return checkpoint
    return None


# Namespaces that re-upload models under their original repository names, config.json unchanged (unsloth also
# adds -unsloth / -bnb-4bit); docs/models.md, "Re-uploads".
_MIRROR = re.compile(
    r"^(?:unsloth|nousresearch|mistral-community|huggyllama)/(?P<model>.+?)(?:-unsloth)?(?:-bnb-4bit)?$"
)


def _mirror_original(key: str, catalog: dict[str, ModelSpec]) -> ModelSpec | None:
    """The catalog model a re-upload (`key`, lower case: unsloth, NousResearch, mistral-community, huggyllama)
    copies: its name is the model's catalog name or the last part of its hub id or of an alias."""
    match = _MIRROR.match(key)
    if match is None:
        return None
    model = match["model"]
    for spec in catalog.values():
        names = (spec.name, spec.hub_id or "", *spec.aliases)
        if model in (n.rsplit("/", 1)[-1].lower() for n in names if n):
            return spec
    return None


def _repository_name_match(key: str, catalog: dict[str, ModelSpec]) -> ModelSpec | None:
    """The catalog model a hub id without its namespace names (`key`, lower case: "llama-2-7b-hf",
    "qwen2.5-7b-instruct"), when exactly one model has a hub id or alias of that repository name."""
    if "/" in key:
        return None
    found = {
        spec.name: spec
        for spec in catalog.values()
        for hub_id in (spec.hub_id or "", *spec.aliases)
        if hub_id and hub_id.rsplit("/", 1)[-1].lower() == key
    }
    return next(iter(found.values())) if len(found) == 1 else None


_NAMES: list = [None, {}]  # [the catalog indexed, its index]


def _names_of(catalog: dict[str, ModelSpec]) -> dict[str, ModelSpec]:
    """Lower-case name, hub id, alias or GPTQ checkpoint -> the first catalog model with it."""
    if _NAMES[0] is not catalog:
        index: dict[str, ModelSpec] = {}
        for spec in catalog.values():
            for n in (spec.name, spec.hub_id or "", *spec.aliases, *(c.hub_id for c in spec.gptq_checkpoints)):
                if n:
                    index.setdefault(n.lower(), spec)
        _NAMES[:] = [catalog, index]
    return _NAMES[1]


def _spelled_without_punctuation(key: str, catalog: dict[str, ModelSpec]) -> ModelSpec | None:
    """The one catalog model whose name or alias matches `key` with punctuation dropped ("llama2-70b" for
    llama-2-70b, MLPerf's spelling); a path or hub id is not such a spelling."""
    if "/" in key or key.endswith((".json", ".yaml", ".yml")):
        return None
    compact = re.sub(r"[^0-9a-z]+", "", key)
    hits = {
        id(spec): spec
        for name, spec in _names_of(catalog).items()
        if "/" not in name and re.sub(r"[^0-9a-z]+", "", name) == compact
    }
    return next(iter(hits.values())) if len(hits) == 1 else None


def catalog_model(name: str) -> ModelSpec | None:
    """The catalog model a name, hub id or alias names exactly (any case), looked up without the hub; else None."""
    return _names_of(model_catalog()).get(name.strip().lower())


def resolve_model(name: str) -> ModelSpec:
    """A catalog name (any case, or its hub id), a GPTQ checkpoint's hub id (its base model), a hub id without its
    namespace (when one catalog model has it), a re-upload of a catalog model (unsloth, NousResearch, ...), a local
    config path, or a hub id in the local cache."""
    named = catalog_model(name)
    if named is not None:
        return named
    catalog = model_catalog()
    key = name.strip().lower()
    by_repository = _repository_name_match(key, catalog)
    if by_repository is not None:
        return by_repository
    original = _mirror_original(key, catalog) or _spelled_without_punctuation(key, catalog)
    if original is not None:
        return original
    path = Path(name).expanduser()
    if path.exists():
        return spec_from_config_file(path)
    if name.strip().endswith(".json") or name.count("/") > 1:  # a path, not a hub id (namespace/name)
        raise TunecostError(f"no model config at {name!r}: no such file or folder")
    if "/" in name and not name.startswith((".", "/")):
        try:
            spec = spec_from_config_file(hub_file(name))
        except TunecostError as exc:
            raise TunecostError(f"model {name!r} is not in the catalog: {exc}") from None
        return ModelSpec(**{**spec.__dict__, "name": name, "hub_id": name})
    raise unknown_name_error("model", name, catalog.keys())
