"""transformers' FSDP settings (`fsdp`, `fsdp_config`) read as tunecost's strategy, offload and checkpointing, and
the flag reading the Hugging Face readers share."""

from __future__ import annotations

from typing import Any

from tunecost.workload.frameworks import ConfigFile

Part = tuple[dict[str, Any], list[str]]  # options and assumption lines
SHARDS = ("full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2", "no_shard")


def truthy(value: Any) -> bool:
    """A flag written as a bool or as text ("true", "yes"), as transformers' and accelerate's str_to_bool read it."""
    return str(value).strip().lower() in ("true", "1", "yes", "y", "t", "on")


def fsdp_options(cfg: ConfigFile) -> Part:
    """strategy, offload (and checkpointing) of `fsdp` (True, or the older "full_shard auto_wrap") and fsdp_config,
    as transformers 5's _process_fsdp_args reads them (FSDP2 unless fsdp_config says version 1)."""
    fsdp, raw = cfg.get("fsdp"), cfg.get("fsdp_config")
    if not fsdp:
        return {}, []
    items = fsdp.split() if isinstance(fsdp, str) else fsdp if isinstance(fsdp, list) else []
    items = [str(i).lower() for i in items]
    fcfg = {k.removeprefix("fsdp_"): v for k, v in raw.items()} if isinstance(raw, dict) else {}
    notes = (
        [f"fsdp_config {raw}: a file tunecost does not read; put its keys in fsdp_config"] if raw and not fcfg else []
    )
    version = str(fcfg.get("version", 2))
    notes += [] if "version" in fcfg else ["FSDP version 2 (fsdp_config.version): transformers' default"]
    reshard = str(fcfg.get("reshard_after_forward", "")).lower()
    shard = next((i for i in items if i in SHARDS), "")
    shard = shard or {"false": "shard_grad_op", "true": "full_shard", "": "full_shard"}.get(reshard, reshard)
    strategies = {"full_shard": f"fsdp{version}", "shard_grad_op": "fsdp2-shard-grad-op"}
    strategies.update({"hybrid_shard": "hsdp", "no_shard": "ddp"} if version == "1" else {})
    if version not in ("1", "2") or shard not in strategies:
        raise cfg.error(
            "fsdp",
            f"{shard} with FSDP version {version} is not modelled (full_shard, shard_grad_op; "
            "FSDP1 also hybrid_shard, no_shard)",
        )
    out: dict[str, Any] = {"strategy": strategies[shard]}
    if shard != "full_shard" and version == "1":
        notes.append(f"FSDP1 {shard}: tunecost models it as {strategies[shard]}")
    if "offload" in items or truthy(fcfg.get("cpu_offload", False)):
        out["offload"] = "params"
    if truthy(fcfg.get("activation_checkpointing", False)):
        out.update(gradient_checkpointing=True, reentrant=False)
        notes.append("fsdp_config activation_checkpointing: FSDP's own, non-reentrant (torch checkpoint_wrapper)")
    return out, notes
