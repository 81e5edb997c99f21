"""Parameter counts from a model's config: total, and active per token at a given top-k.

Counted on the real model class built on the meta device (no memory), so the numbers follow the code rather
than a hand formula. Routed-expert parameters are those under a module path containing `.experts.`
(shared experts, e.g. Qwen's `shared_expert` or DeepSeek's `shared_experts`, are always active).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from tunecost import __version__
from tunecost.io import atomic_write_json, cache_root
from tunecost.models.build import build_model
from tunecost.models.catalog import ModelSpec

PARAMS_VERSION = "1"  # of the counts kept on disk; bump when `_count` changes


@dataclass(frozen=True, kw_only=True)
class ParamCounts:
    total: int
    active: int  # parameters used per token at `experts_per_token`
    routed_experts: int  # all routed-expert parameters (every expert, every layer)
    embedding: int  # input embedding (+ output head when untied)
    experts_per_token: int
    num_experts: int
    largest_module: int  # the most parameters one module holds itself (DeepSpeed's "largest layer")


def _is_routed_expert(param_name: str) -> bool:
    return ".experts." in param_name or ".local_experts." in param_name


def _is_embedding(param_name: str) -> bool:
    return any(k in param_name for k in ("embed_tokens", "word_embeddings", "wte", "wpe", "lm_head", "output_layer"))


_CACHE: dict[tuple[str, str, int], ParamCounts] = {}


def _count(spec: ModelSpec, experts_per_token: int) -> ParamCounts:
    model = build_model(spec, device="meta", experts_per_token=experts_per_token if spec.is_moe else None)
    seen: set[int] = set()
    total = routed = embedding = 0
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:  # tied weights count once
            continue
        seen.add(id(param))
        n = param.numel()
        total += n
        if _is_routed_expert(name):
            routed += n
        elif _is_embedding(name):
            embedding += n
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    num_experts = spec.num_experts
    active = total - routed + routed * experts_per_token // num_experts
    return ParamCounts(
        total=total,
        active=active,
        routed_experts=routed,
        embedding=embedding,
        experts_per_token=experts_per_token,
        num_experts=num_experts,
        largest_module=largest,
    )


def count_parameters(spec: ModelSpec, experts_per_token: int | None = None) -> ParamCounts:
    """Counts of `spec` at top-k `experts_per_token` (default: the model's); kept on disk, as building a large
    model on the meta device takes seconds."""
    k = spec.top_k(experts_per_token)
    key = (spec.name, json.dumps(spec.config, sort_keys=True), k)
    if key not in _CACHE:
        digest = hashlib.sha256(json.dumps([*key, __version__, PARAMS_VERSION]).encode()).hexdigest()[:32]
        path = cache_root() / "params" / f"{digest}.json"
        try:
            _CACHE[key] = ParamCounts(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            _CACHE[key] = _count(spec, k)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_json(path, dataclasses.asdict(_CACHE[key]))
            except OSError:  # a cache that cannot be written is no error
                pass
    return _CACHE[key]
