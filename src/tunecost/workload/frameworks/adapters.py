"""Readers for PEFT's adapter_config.json (LoraConfig) and transformers' BitsAndBytesConfig: each reports its own
file and its own library's defaults only; `--config` merges them with the Trainer's arguments (`hf`)."""

# Defaults filled (installed peft 0.21.2, transformers 5.23.0):
#   LoraConfig r 8, lora_alpha 8, lora_dropout 0.0, target_modules None (the architecture's): peft tuners/lora/config.py
#   BitsAndBytesConfig bnb_4bit_quant_type fp4, double quant off, compute float32: transformers quantization_config.py
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tunecost.workload.frameworks import ConfigFile, ConfigJob, Framework, KnownKeys
from tunecost.workload.frameworks.hf import BNB, FILES, PEFT, TORCH_DTYPES, job, lora_options, qlora_options
from tunecost.workload.frameworks.hf_common import int8_options, modules_to_save

LORA_KEYS, BNB_KEYS = KnownKeys("PEFT's LoraConfig", ("peft_lora",)), KnownKeys("BitsAndBytesConfig", ("bnb",))


def _read_lora(cfg: ConfigFile) -> ConfigJob:
    peft_type = cfg.typed("peft_type", str) or ""
    if peft_type.upper() != "LORA":
        raise cfg.error("peft_type", f"{peft_type!r} is not modelled; tunecost estimates LoRA (full, LoRA, QLoRA)")
    cfg.check_keys(LORA_KEYS)
    task = cfg.typed("task_type", str)
    if task not in (None, "CAUSAL_LM"):
        raise cfg.error("task_type", f"{task}: tunecost estimates supervised fine-tuning of causal LMs only")
    for key, name in (("use_dora", "DoRA"), ("use_qalora", "QA-LoRA")):
        if cfg.typed(key, bool):
            raise cfg.error(key, f"{name} is not modelled; tunecost estimates full, LoRA and QLoRA fine-tuning")
    model = cfg.typed("base_model_name_or_path", str)
    out, notes = lora_options(cfg, ("r", "lora_alpha", "target_modules", "target_parameters"), (8, 8, 0.0), PEFT, model)
    out.update(
        method="lora", stack="hf-peft", **({"model": model} if model else {}), **modules_to_save(cfg, "modules_to_save")
    )
    return job(cfg, FRAMEWORK_PEFT_LORA.name, out, notes)


def _read_bnb(cfg: ConfigFile) -> ConfigJob:
    cfg.check_keys(BNB_KEYS)
    if cfg.typed("quant_method", str) not in (None, "bitsandbytes"):
        raise cfg.error("quant_method", "this reader takes a BitsAndBytesConfig (quant_method bitsandbytes)")
    # to_dict() writes each flag twice (load_in_4bit and _load_in_4bit): read both (a list, not a short circuit)
    four, eight = (any([cfg.typed(k, bool), cfg.typed(f"_{k}", bool)]) for k in ("load_in_4bit", "load_in_8bit"))
    if not (four or eight):
        raise cfg.error("load_in_4bit", "false, and load_in_8bit too: this config quantizes nothing")
    if eight and not four:  # the model's dtype is not in a BitsAndBytesConfig: tunecost's default applies
        out, notes = int8_options(cfg, "load_in_8bit")
        return job(cfg, FRAMEWORK_BNB.name, {**out, "stack": "hf-peft"}, notes)
    out, notes = qlora_options(cfg, ("bnb_4bit_quant_type", "bnb_4bit_use_double_quant"), ("fp4", False), BNB)
    compute = (cfg.typed("bnb_4bit_compute_dtype", str) or "").removeprefix("torch.")
    if compute and compute not in TORCH_DTYPES:
        raise cfg.error("bnb_4bit_compute_dtype", f"{compute!r} is not modelled (bfloat16, float16, float32)")
    out.update(dtype=TORCH_DTYPES[compute or "float32"], stack="hf-peft")
    notes += [] if compute else [f"dtype fp32 (bnb_4bit_compute_dtype float32): {BNB} default"]
    if cfg.data.get("bnb_4bit_quant_storage", "uint8") == "uint8":  # another storage type stays "not modelled"
        cfg.get("bnb_4bit_quant_storage")
    return job(cfg, FRAMEWORK_BNB.name, out, notes)


def detect_lora(data: Mapping[str, Any]) -> bool:
    return "peft_type" in data and "per_device_train_batch_size" not in data


def detect_bnb(data: Mapping[str, Any]) -> bool:
    """quant_method bitsandbytes, or only keys named like BitsAndBytesConfig's, load_in_4bit or load_in_8bit too."""
    only_bnb = all(str(k).startswith(("load_in_", "_load_in_", "bnb_4bit_", "llm_int8_", "quant_method")) for k in data)
    loads = any(k in data for k in ("load_in_4bit", "load_in_8bit"))
    return data.get("quant_method") == "bitsandbytes" or (only_bnb and loads)


FRAMEWORK_PEFT_LORA = Framework(
    name="peft-lora", title="PEFT LoraConfig", suffixes=(".json",), detect=detect_lora, read=_read_lora
)
FRAMEWORK_BNB = Framework(
    name="bitsandbytes", title="BitsAndBytesConfig", suffixes=FILES, detect=detect_bnb, read=_read_bnb
)
FRAMEWORKS = (FRAMEWORK_PEFT_LORA, FRAMEWORK_BNB)
