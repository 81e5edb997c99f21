"""LLaMA-Factory v1 training YAML (USE_V1=1, examples/v1: `model`, `micro_batch_size`, plugin configs) as a job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tunecost.workload.frameworks import (
    PASS_DEEPSPEED,
    SFT_ONLY,
    ConfigFile,
    ConfigJob,
    Framework,
    KnownKeys,
    accumulation_of,
    dotted_keys,
)
from tunecost.workload.frameworks.accelerate import section
from tunecost.workload.frameworks.hf_common import VISION_MODEL, name_list, peft_targets
from tunecost.workload.job import targets_text
from tunecost.workload.known_datasets import catalog_dataset

TITLE = "LLaMA-Factory v1"
KEYS = KnownKeys(f"{TITLE}'s config", ("llamafactory_v1",))
# key: (default, as tunecost reads it); read at hiyouga/LLaMA-Factory ff6d4d12 (Aug 2026), src/llamafactory/v1:
# config/{model,training}_args.py, plugins/model_plugins/{peft,quantization}.py (LoraParams, BnbParams)
_DEFAULTS: dict[str, tuple[Any, str]] = {
    "micro_batch_size": (1, "batch_size 1"),
    "cutoff_len": (2048, "seq_len 2048"),
    "num_train_epochs": (3, "epochs 3"),
    "enable_activation_checkpointing": (True, "gradient_checkpointing on (BaseTrainer: use_reentrant false)"),
    "flash_attn": ("sdpa", "attention sdpa"),
    "r": (8, "lora_rank 8"),
    "lora_alpha": (16, "lora_alpha 16"),
    "lora_dropout": (0.05, "lora_dropout 0.05"),
    "quantization_bit": (4, "quantization_bit 4 (the bnb plugin's default)"),
    "quantization_type": ("nf4", "quant_type nf4"),
    "double_quantization": (True, "double_quant on"),
}  # fmt: skip
_ATTENTION = {"sdpa": "sdpa", "flash_attention_2": "flash", "eager": "eager"}  # utils/types.py AttentionFunction


def _get(cfg: ConfigFile, notes: list[str], key: str, kind: Any) -> Any:
    default, said = _DEFAULTS[key]
    return cfg.or_default(key, kind, default, notes, f"{said}: {TITLE}'s default")


def _method(cfg: ConfigFile, model: str | None, notes: list[str]) -> dict[str, Any]:
    peft, quant = section(cfg, "peft_config"), section(cfg, "quant_config")
    if not peft.data:
        if quant.data:
            raise cfg.error("quant_config", f"{TITLE} quantizes the base weights of a LoRA run only (peft_config)")
        notes.append(f"parameters in bf16: {TITLE} runs a full fine-tune's model in fp32 (core/model_engine.py): "
                     "fp32 parameters, gradients and AdamW states, computed in bf16 under FSDP2's mixed precision "
                     "and in fp32 without it; tunecost simulates it in bf16 (--dtype fp32 bounds it)")  # fmt: skip
        return {"method": "full"}
    name = peft.typed("name", str)
    if name != "lora":
        raise peft.error("name", f"{name}: tunecost estimates full, LoRA and QLoRA fine-tuning")
    if peft.typed("export_dir", str):
        raise peft.error("export_dir", "a merge and export config (llamafactory-cli merge): nothing is trained")
    if peft.typed("adapter_name_or_path", (str, list)):
        notes.append("peft_config.adapter_name_or_path: training resumes that adapter, whose own rank and targets "
                     "apply; the file's are read")  # fmt: skip
    if peft.typed("use_dora", bool):
        raise peft.error("use_dora", "DoRA is not modelled")
    rank = _get(peft, notes, "r", int)
    targets, target_notes = peft_targets(cfg, "peft_config.target_modules", _targets(peft, notes), model)
    options: dict[str, Any] = {
        "method": "lora",
        "lora_rank": rank,
        "lora_alpha": _get(peft, notes, "lora_alpha", (int, float)),
    }
    options |= {"lora_dropout": _get(peft, notes, "lora_dropout", (int, float)), "lora_targets": targets_text(targets)}
    notes += target_notes
    if quant.data:
        qname = quant.typed("name", str)
        if qname not in ("bnb", "auto"):
            raise quant.error("name", f"{qname}: tunecost models bitsandbytes (bnb) quantization only")
        if qname == "auto" and quant.typed("quantization_bit", int) is None:  # quantization_auto applies none
            notes.append("quant_config auto without quantization_bit: no quantization, as its auto plugin does")
            return options
        bits = _get(quant, notes, "quantization_bit", int)
        if bits == 8:
            raise quant.error("quantization_bit", f"8: {TITLE} trains 8-bit weights only without FSDP; not modelled")
        if bits != 4:
            raise quant.error("quantization_bit", f"must be 4 or 8, got {bits}")
        quant_type = _get(quant, notes, "quantization_type", str)
        if quant_type not in ("nf4", "fp4"):
            raise quant.error("quantization_type", f"must be nf4 or fp4, got {quant_type!r}")
        options |= {
            "method": "qlora",
            "quant_type": quant_type,
            "double_quant": _get(quant, notes, "double_quantization", bool),
        }
    return options


def _targets(peft: ConfigFile, notes: list[str]) -> list[str]:
    value = peft.typed("target_modules", (str, list))
    if value is None:
        notes.append(f"lora targets all: {TITLE}'s default (every linear layer but the head)")
        value = "all"
    return name_list(value)


def _parallel(cfg: ConfigFile, notes: list[str]) -> dict[str, Any]:
    dist = section(cfg, "dist_config")
    name = dist.typed("name", str) if dist.data else None
    cp = cfg.typed("cp_size", int) or 1
    if cp > 1:
        raise cfg.error("cp_size", f"{cp}: {TITLE}'s Ulysses context parallelism (all-to-all heads) is not modelled")
    if name is None:
        notes.append(f"no dist_config: one GPU, or DistributedDataParallel on several ({TITLE}'s BaseTrainer)")
        return {}
    if name == "fsdp2":
        offload = bool(dist.typed("offload_params", bool))
        if dist.typed("reshard_after_forward", bool) is False:
            raise dist.error("reshard_after_forward", "false (ZeRO-2-like FSDP2) is not modelled")
        return {"strategy": "fsdp2"} | ({"offload": "params"} if offload else {})
    if name == "deepspeed":
        path = dist.typed("config_file", str)
        notes.append(f"deepspeed config {path}: {PASS_DEEPSPEED}")
        return {}
    raise dist.error("name", f"{name}: tunecost models fsdp2 and deepspeed ({TITLE}'s fsdpturbo is not modelled)")


def _training(cfg: ConfigFile, notes: list[str]) -> dict[str, Any]:
    flash = _get(cfg, notes, "flash_attn", str)
    if flash not in _ATTENTION:
        raise cfg.error("flash_attn", f"{flash}: must be eager, sdpa or flash_attention_2")
    batch = _get(cfg, notes, "micro_batch_size", int)
    strategy = cfg.typed("batching_strategy", str) or "normal"
    if strategy.startswith("dynamic") or (strategy == "padding_free" and batch > 1):
        what = "one unpadded row of the micro-batch" if strategy == "padding_free" else "a token budget's micro-batches"
        raise cfg.error("batching_strategy", f"{strategy}: {what} is not modelled (normal pads each micro-batch)")
    if cfg.typed("bf16", bool) is False:
        notes.append(f"bf16 false: read as bf16 ({TITLE} loads the weights in the checkpoint's dtype either way)")
    checkpointing = _get(cfg, notes, "enable_activation_checkpointing", bool)
    options: dict[str, Any] = {
        "dtype": "bf16",
        "attention": _ATTENTION[flash],
        "gradient_checkpointing": checkpointing,
        "optimizer": "adamw",
        "seq_len": _get(cfg, notes, "cutoff_len", int),
        "batch_size": batch,
    }
    if checkpointing:
        options["reentrant"] = False
    optim = section(cfg, "optim_config")
    if optim.data:  # plugins/trainer_plugins/optimizers: muon is the one plugin
        raise optim.error("name", f"{optim.data.get('name')} is not modelled; tunecost models {TITLE}'s AdamW")
    notes.append(f"optimizer adamw: {TITLE}'s default without optim_config (torch.optim.AdamW, multi-tensor)")
    global_batch = cfg.typed("global_batch_size", int)
    if global_batch is not None:  # core/utils/batching.py: micro-batches per step = global / (dp x micro)
        options["queries_per_step"] = global_batch
    steps = cfg.typed("max_steps", int)
    if steps is not None and steps > 0:
        options["max_steps"] = steps
        notes.append(f"run length: max_steps {steps} optimizer steps ({TITLE} ignores the epochs beside it)")
        if global_batch is None:
            notes.append(f"global batch: {TITLE}'s default, the GPUs x micro_batch_size (one micro-batch a step)")
        cfg.typed("num_train_epochs", int)
        return options
    return options | {"epochs": _get(cfg, notes, "num_train_epochs", (int, float))}


def _read(cfg: ConfigFile) -> ConfigJob:
    cfg.check_keys(KEYS, dotted_keys(cfg.data))
    notes: list[str] = []
    model = cfg.typed("model", str)
    model_class = cfg.typed("model_class", str) or "llm"
    if model_class != "llm" or (model and VISION_MODEL.search(model)):
        raise cfg.error("model_class" if model_class != "llm" else "model", f"a {model_class} model: {SFT_ONLY}")
    options: dict[str, Any] = {"model": model} if model else {}
    options |= _method(cfg, model, notes) | _training(cfg, notes) | _parallel(cfg, notes)
    kernels = section(cfg, "kernel_config")
    if kernels.data and kernels.typed("name", str) != "auto":
        notes.append(f"kernel_config {kernels.data.get('name')}: its fused kernels are not modelled")
    dataset = cfg.typed("train_dataset", str)
    if dataset and (known := catalog_dataset(dataset)):
        options["dataset"] = known
    elif dataset:
        notes.append(f"train_dataset {dataset}: a {TITLE} data file, give --dataset FILE for its lengths")
    notes += [
        "training: supervised fine-tuning, as `llamafactory-cli sft` runs it (the command, not the file, picks "
        "the trainer)",
        f"stack hf-peft: {TITLE} runs transformers + PEFT in its own loop; its loss keeps an fp32 copy of the "
        "logits and a shifted fp32 copy, one copy more than the simulated transformers loss",
    ]
    options["stack"] = "hf-peft"
    notes += accumulation_of(options, "global_batch_size")  # core/utils/batching.py
    return ConfigJob(framework="llamafactory-v1", path=cfg.path, options=options, assumptions=tuple(notes),
                     not_modelled=cfg.unused_keys())  # fmt: skip


def _detect(data: Mapping[str, Any]) -> bool:
    keys = ("micro_batch_size", "cutoff_len", "train_dataset", "peft_config", "dist_config", "model_class")
    return isinstance(data.get("model"), str) and "model_name_or_path" not in data and any(k in data for k in keys)


# data parallelism, and Ulysses' cp_size (not modelled): no model-parallel layout searched
FRAMEWORK = Framework(name="llamafactory-v1", title=TITLE, suffixes=(".yaml", ".yml", ".json"),
                      detect=_detect, read=_read, model_parallel=())  # fmt: skip
