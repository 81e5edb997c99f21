"""LLaMA-Factory's Megatron-Core backends (USE_MCA=1 mcore_adapter, USE_MEGATRON_BRIDGE=1): the layout its keys set."""

from __future__ import annotations

from typing import Any

from tunecost.errors import TunecostError
from tunecost.workload.frameworks import ConfigFile
from tunecost.workload.frameworks.model_parallel import (
    catalog_shape,
    check_layout,
    config_expert_parallel,
    megatron_split,
    positive,
)

TITLE = "LLaMA-Factory's Megatron backend"
# hparams/megatron_bridge_args.py MegatronBridgeArguments (hiyouga/LLaMA-Factory@ff6d4d12): keys the default
# HfArgumentParser refuses, so a file that sets one runs under USE_MCA or USE_MEGATRON_BRIDGE
KEYS = {  # key: the job option it sets
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
    "context_parallel_size": "cp",
    "virtual_pipeline_model_parallel_size": "virtual_stages",
    "sequence_parallel": "sequence_parallel",
    "expert_model_parallel_size": "expert_parallel",
    "recompute_granularity": "gradient_checkpointing",
    "use_distributed_optimizer": "strategy",
}
# Megatron Core's embedding and loss counted as layers of the pipeline split: the stages need not divide the layers
SPLIT_KEYS = ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
_DEFAULT = f"{TITLE}'s default (MegatronBridgeArguments; mcore_adapter's not read)"


def megatron_options(cfg: ConfigFile, model: str | None, notes: list[str]) -> dict[str, Any]:
    """The Megatron layout of a file that sets any of `KEYS` (else {}): TP (Megatron's column/row-parallel layers,
    sequence parallelism off by default), pipeline stages over the accumulated micro-batches, context parallelism,
    recomputation by `recompute_granularity` (none by default), the distributed optimizer (on by default: ZeRO-1's
    layout), expert parallelism where tunecost models it (`config_expert_parallel`)."""
    if not any(k in cfg.data for k in KEYS):
        return {}
    tp, pp, cp, vp = (positive(cfg, key, cfg.typed(key, int)) for key in list(KEYS)[:4])
    sp = bool(cfg.typed("sequence_parallel", bool)) and tp > 1
    options: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "sequence_parallel": sp, "stack": "tunecost"}
    options["tp_impl"] = "megatron" if tp > 1 else None
    config_expert_parallel(cfg, options, "expert_model_parallel_size", None, etp_default=None)  # experts split as TP
    if vp > 1:
        options |= {"virtual_stages": vp, "pipeline_schedule": "interleaved-1f1b"}
    if pp > 1:  # Megatron's micro-batches per step: the accumulation the Trainer arguments state
        options["micro_batches"] = cfg.typed("gradient_accumulation_steps", int) or 1
    recompute = cfg.typed("recompute_granularity", str)
    if recompute not in (None, "full", "selective"):
        raise cfg.error("recompute_granularity", f"{recompute!r}: full, selective or null")
    options["gradient_checkpointing"] = recompute == "full"
    options["selective_recompute"] = recompute == "selective"
    if recompute is None:
        notes.append(f"recompute_granularity null: no recomputation, {_DEFAULT}")
    distributed = cfg.typed("use_distributed_optimizer", bool)
    if distributed is None:
        notes.append(f"use_distributed_optimizer true: {_DEFAULT}")
    options["strategy"] = "ddp" if distributed is False else "zero1"
    zero1 = "; the distributed optimizer modelled as zero1" if options["strategy"] == "zero1" else ""
    notes.append(f"{TITLE}: Megatron Core's layers and Adam, not transformers' (stack tunecost{zero1})")
    keys = {option: key for key, option in KEYS.items()}
    try:
        shape = catalog_shape(model) if model else None
    except TunecostError:
        shape = None
    on = [cfg.typed(k, bool) for k in SPLIT_KEYS]
    uneven = pp > 1 and megatron_split(options, SPLIT_KEYS, on, notes)
    check_layout(cfg, options, keys, shape=shape, seq_len=0, even_layers=not uneven)
    return options
