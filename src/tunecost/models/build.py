"""Build a model from a catalog `ModelSpec`: transformers classes for HF families, tunecost's own
BlackMamba. On `device="meta"` nothing is allocated, which is how parameter counts and the step
simulator see full-size models without weights."""

from __future__ import annotations

import copy
from typing import Any

from tunecost.errors import TunecostError
from tunecost.models.catalog import ModelSpec


def hf_config(spec: ModelSpec, experts_per_token: int | None = None, **overrides: Any):
    """A transformers config object for `spec` (top-k overridden when given)."""
    from transformers import CONFIG_MAPPING

    if spec.family not in CONFIG_MAPPING:
        raise TunecostError(f"{spec.name}: family {spec.family!r} is not a transformers architecture")
    # a deep copy: transformers writes into nested dicts it is given (rope_scaling gains rope_theta), which would
    # change the catalog's config, and with it the simulation cache's key, for the rest of the process
    raw = copy.deepcopy(
        {k: v for k, v in spec.config.items() if k not in ("model_type", "architectures", "torch_dtype")}
    )
    if experts_per_token is not None:
        if not spec.is_moe:
            raise TunecostError(f"{spec.name} is a dense model: --experts-per-token does not apply")
        if not 1 <= experts_per_token <= spec.num_experts:
            raise TunecostError(
                f"{spec.name}: experts per token must be between 1 and {spec.num_experts}, got {experts_per_token}"
            )
        raw["num_experts_per_tok"] = experts_per_token
    raw.update(overrides)
    layer_types = raw.get("layer_types")
    if "num_hidden_layers" in overrides and isinstance(layer_types, list):
        # a per-layer list (attention kinds) follows the traced depth: its first layers
        raw["layer_types"] = layer_types[: int(overrides["num_hidden_layers"])]
    return CONFIG_MAPPING[spec.family](**raw)


# Families whose transformers 5.23 class refuses `attn_implementation="sdpa"` at construction (Gemma 2: attention
# logit soft-capping; gpt-oss: attention sinks); they are built with eager attention.
SDPA_REFUSED_FAMILIES = frozenset({"gemma2", "gpt_oss"})


def build_model(
    spec: ModelSpec,
    *,
    device: Any = "cpu",
    dtype: Any = None,
    experts_per_token: int | None = None,
    seed: int | None = 0,
    attn_implementation: str | None = "sdpa",
    **overrides: Any,
):
    """A randomly initialised causal LM of `spec`'s architecture (weights are NOT loaded; see loading code)."""
    import torch

    if spec.family == "blackmamba":
        from tunecost.models.blackmamba import build_blackmamba, config_from_spec

        config = config_from_spec(spec, experts_per_token=experts_per_token, **overrides)
        with torch.device(device):
            return build_blackmamba(config, dtype=dtype)
    from transformers import AutoModelForCausalLM

    config = hf_config(spec, experts_per_token=experts_per_token, **overrides)
    if attn_implementation == "sdpa" and spec.family in SDPA_REFUSED_FAMILIES:
        attn_implementation = "eager"  # same parameters; a caller may install its own attention function after
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    if seed is not None and str(device) != "meta":
        torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)
    return model


# The tokenizer a model was trained with, where it is not the model's own hub repository. "mistral" is the
# Mixtral/Mistral v1 SentencePiece model that ships offline with mistral-common (tunecost.workload.tokenizers);
# BlackMamba uses GPT-NeoX-20B's (Zyphra's README; its hub repository has no tokenizer files).
BLACKMAMBA_TOKENIZER = "EleutherAI/gpt-neox-20b"
_MISTRAL_V1_VOCAB = 32000


def default_tokenizer(spec: ModelSpec) -> str:
    """The tokenizer name (for `tokenizer_by_name`) that belongs to `spec`."""
    if spec.family == "blackmamba":
        return BLACKMAMBA_TOKENIZER
    if spec.family in ("mixtral", "mistral") and int(spec.config.get("vocab_size", 0)) == _MISTRAL_V1_VOCAB:
        return "mistral"
    return spec.local_path or spec.hub_id or "mistral"


def load_pretrained(
    spec: ModelSpec,
    where: str | None = None,
    *,
    dtype: Any = None,
    device: Any = "cpu",
    allow_download: bool = False,
    **overrides: Any,
):
    """Real weights of `spec` from `where` (a local folder or a hub id; default: the spec's folder or hub id):
    transformers' `from_pretrained` (no remote code; the local cache only unless `allow_download`), or
    tunecost's strict loader for BlackMamba checkpoints in Zyphra's layout. `overrides` change the config
    (e.g. fewer layers); BlackMamba's strict loader takes none."""
    where = where or spec.local_path or spec.hub_id
    if where is None:
        raise TunecostError(f"{spec.name} is a built-in architecture with no weights anywhere; build it instead")
    if spec.family == "blackmamba":
        if overrides:
            raise TunecostError(
                f"{spec.name}: real BlackMamba weights load strictly, without config changes "
                f"({', '.join(sorted(overrides))}); use random weights for a smaller model"
            )
        from tunecost.models.blackmamba import load_blackmamba

        return load_blackmamba(where, dtype=dtype, device=device, allow_download=allow_download)
    from transformers import AutoModelForCausalLM

    # transformers 5.23's Auto classes do not pass `local_files_only` on to their PEFT adapter lookup, which then
    # asks the hub (five retries, ~25 s offline) for adapter_config.json; `adapter_kwargs` reaches that lookup.
    offline = {} if allow_download else {"adapter_kwargs": {"local_files_only": True}}
    try:
        return AutoModelForCausalLM.from_pretrained(
            where,
            dtype=dtype,
            device_map=device,
            local_files_only=not allow_download,
            trust_remote_code=False,
            **offline,
            **overrides,
        )
    except (OSError, ValueError) as exc:
        raise TunecostError(f"cannot load {where}: {str(exc).splitlines()[0]}") from None
