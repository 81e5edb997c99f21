"""Tensor, pipeline and context degrees read from a framework's config, checked by `ParallelPlan` as the command
line's would be, with the config's own keys named in the error instead of tunecost's flags."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from tunecost.errors import TunecostError
from tunecost.models.catalog import resolve_model
from tunecost.workload.frameworks import ConfigFile
from tunecost.workload.parallel import ModelParallel, ParallelPlan, split_note

# the plan's model-parallel options a config may set (job options of the same names)
MODEL_PARALLEL_OPTIONS = tuple(f.name for f in fields(ModelParallel))
PLAN_OPTIONS = ("num_gpus", "gpus_per_node", "strategy", "offload", "expert_parallel", *MODEL_PARALLEL_OPTIONS)
# the flags ParallelPlan's errors name
_FLAG = re.compile(r"--(tp|pp|cp|sequence-parallel|micro-batches|pp-(?:first|last)-stage-layers)\b(?!-)")


def soft_capped(model: str | None) -> bool:
    """Whether the model soft-caps its attention logits (Gemma-2), which SDPA cannot take."""
    try:
        return bool(model) and resolve_model(str(model)).family == "gemma2"
    except TunecostError:
        return False


def own_attention(title: str, model: str | None) -> tuple[str, str]:
    """The attention of a framework whose own model code calls torch's SDPA: eager for a soft-capped model (full
    L x L scores, as torchtune's and litgpt's Gemma-2 attention compute them)."""
    if soft_capped(model):
        return "eager", f"attention eager: {title}'s Gemma-2 attention soft-caps its logits, which SDPA cannot take"
    return "sdpa", f"attention sdpa: {title}'s model calls torch's scaled_dot_product_attention"


@dataclass(frozen=True)
class ModelShape:
    """What `ParallelPlan.check_model` splits: attention heads, key-value heads, decoder layers."""

    num_heads: int
    num_kv_heads: int
    num_layers: int


def catalog_shape(hub_id: str) -> ModelShape:
    """The heads and layers of a catalog model (its config.json)."""
    spec = resolve_model(hub_id)
    heads = int(spec.config["num_attention_heads"])
    return ModelShape(heads, int(spec.config.get("num_key_value_heads") or heads), spec.num_layers)


def plan_error(flat: ConfigFile, exc: TunecostError, keys: Mapping[str, str]) -> TunecostError:
    """The plan's error with each flag replaced by the config key it came from (`keys`: option -> key)."""
    message = str(exc)
    named = _FLAG.sub(lambda m: keys.get(m.group(1).replace("-", "_"), m.group(0)), message)
    if "virtual" in message and "virtual_stages" in keys:  # the stage count came from this key
        named = f"{keys['virtual_stages']}: {message}" if named == message else f"{named} ({keys['virtual_stages']})"
    return TunecostError(f"{flat.path}: {named}")


def check_layout(
    flat: ConfigFile,
    options: Mapping[str, Any],
    keys: Mapping[str, str],
    *,
    shape: ModelShape | None,
    seq_len: int,
    even_layers: bool = True,
) -> None:
    """Build the plan the options describe and check the model against it; one error naming the config's keys.
    `shape` None: the config does not name the model (only the sequence is checked); `seq_len` 0: no sequence is
    checked (a framework that pads each batch to a multiple of the degrees); `even_layers` False: a framework
    that deals layers the stages do not divide (torchtitan)."""
    values = {k: options[k] for k in PLAN_OPTIONS if options.get(k) is not None and k != "expert_parallel"}
    values.setdefault("num_gpus", max(1, int(values.get("tp", 1)) * values.get("pp", 1) * values.get("cp", 1)))
    if values.get("strategy") is None and values["num_gpus"] > 1:
        values["strategy"] = "fsdp2"  # the data-parallel group's strategy does not change these checks
    try:
        plan = ParallelPlan(**values)
        if shape is None:  # counts the degrees divide: only the sequence is checked
            fixed = (plan.first_stage_layers, plan.last_stage_layers)
            others = plan.pp - sum(n is not None for n in fixed)
            layers = sum(n or 0 for n in fixed) + others if any(n is not None for n in fixed) else plan.pp
            shape = ModelShape(plan.tp, plan.tp, layers * plan.virtual_stages)
        plan.check_model(
            num_heads=shape.num_heads,
            num_kv_heads=shape.num_kv_heads,
            num_layers=shape.num_layers,
            seq_len=seq_len,
            even_layers=even_layers,
        )
    except TunecostError as exc:
        raise plan_error(flat, exc, keys) from None


def config_expert_parallel(
    flat: ConfigFile, options: dict[str, Any], ep_key: str, etp_key: str | None, *, etp_default: int | None
) -> None:
    """The expert-parallel degree at `ep_key` as tunecost models it (`options["expert_parallel"]`): the routed
    experts split over the data-parallel ranks, each expert split as TP splits it (the expert tensor parallelism at
    `etp_key` equal to TP; `etp_default` None: TP's, Megatron Core's default). One error naming the key where the
    framework would spread the experts over other ranks (expert TP other than TP, context-parallel ranks)."""
    ep = positive(flat, ep_key, flat.typed(ep_key, int))
    if ep == 1:
        return
    tp, cp = options.get("tp", 1), options.get("cp", 1)
    etp = flat.typed(etp_key, int) if etp_key else None
    etp = etp if etp is not None else tp if etp_default is None else etp_default
    if etp != tp:
        key = etp_key if etp_key and etp_key in flat.data else ep_key
        raise flat.error(
            key, f"expert tensor parallelism {etp} beside tensor parallelism {tp}: experts split other than TP splits "
            "them are not modelled"
        )  # fmt: skip
    if cp > 1:
        raise flat.error(
            ep_key, f"{ep} beside context parallelism {cp}: experts spread over context-parallel ranks are not modelled"
        )
    gpus, degree = options.get("num_gpus"), tp * options.get("pp", 1) * cp
    if gpus and gpus % degree == 0 and (gpus // degree) % ep:
        raise flat.error(ep_key, f"{ep} does not divide the {gpus // degree} data-parallel ranks")
    options["expert_parallel"] = ep


def positive(flat: ConfigFile, key: str, value: int | None, default: int = 1) -> int:
    """A degree or size of at least 1 (`default` when the key is absent); else one error naming the key."""
    value = default if value is None else value
    if value < 1:
        raise flat.error(key, f"must be at least 1, got {value}")
    return value


def megatron_split(options: dict[str, Any], keys: Sequence[str], on: Sequence[bool], notes: list[str]) -> bool:
    """Megatron Core's account_for_embedding/loss_in_pipeline_split (`keys`, whether each is `on`) as the stages'
    embedding and head weights (0 each by default), said in `notes` where one is on; True then (the stages need
    not divide the decoder layers)."""
    first, last = (int(bool(o)) for o in on)
    options.update(first_stage_less_layers=first, last_stage_less_layers=last)
    if first or last:
        notes.append(
            f"{' and '.join(k for k, o in zip(keys, (first, last), strict=True) if o)}: {split_note(first, last)}"
        )
    return bool(first or last)
