"""What the Hugging Face stack's readers share: flags read as transformers reads them, its FSDP settings (`fsdp`,
`fsdp_config`), and the torch.compile, Liger and 8-bit keys the Trainer, LLaMA-Factory and axolotl have."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from tunecost.workload.frameworks import COMPILE_NOTE, LIGER_DEFAULTS, LIGER_NOTE, ConfigFile

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


INT8 = MappingProxyType({"method": "qlora", "quant_type": "int8"})  # 8-bit LoRA (load_in_8bit), as options


def compile_options(cfg: ConfigFile, whose: str) -> Part:
    """torch_compile (the HF Trainer's, axolotl's and LLaMA-Factory's key; a compile backend or mode set turns it
    on in TrainingArguments.__post_init__, and axolotl's "auto" on the torch it pins)."""
    value = cfg.get("torch_compile")
    if value == "auto":
        return {"torch_compile": True}, [
            f"torch_compile auto: on ({whose} compiles with torch >= 2.5.1); {COMPILE_NOTE}"
        ]
    on = bool(cfg.typed("torch_compile", bool))
    mode = next((k for k in ("torch_compile_backend", "torch_compile_mode") if cfg.typed(k, str)), None)
    if mode is not None and not on:
        return {"torch_compile": True}, [f"torch_compile on: {mode} is set ({whose} turns it on); {COMPILE_NOTE}"]
    return ({"torch_compile": True}, [f"torch_compile: {COMPILE_NOTE}"]) if on else ({}, [])


def liger_options(cfg: ConfigFile, key: str) -> Part:
    """Liger's kernels (`key`: use_liger_kernel, LLaMA-Factory's enable_liger_kernel) with the default kernel set;
    a liger_kernel_config that changes it stays among the keys not modelled, and the step is counted without."""
    if not cfg.typed(key, bool):
        return {}, []
    config = cfg.data.get("liger_kernel_config")
    if isinstance(config, Mapping) and any(config.get(k, on) != on for k, on in LIGER_DEFAULTS.items()):
        return {}, [f"{key} with liger_kernel_config {dict(config)}: only Liger's default kernels are modelled; "
                    "counted without Liger"]  # fmt: skip
    cfg.get("liger_kernel_config")
    return {"liger_kernel": True}, [f"{key}: {LIGER_NOTE}"]


def int8_options(cfg: ConfigFile, key: str) -> Part:
    """8-bit LoRA (`key`, load_in_8bit, set): method qlora on bitsandbytes LLM.int8 base weights. 16-bit weights
    kept beside the codes (llm_int8_has_fp16_weight) are not modelled."""
    if cfg.typed("llm_int8_has_fp16_weight", bool):
        raise cfg.error("llm_int8_has_fp16_weight", "16-bit weights kept beside the int8 codes are not modelled")
    return dict(INT8), [f"{key}: LLM.int8 base weights (--quant-type int8)"]
