"""LLaMA-Factory training YAML (examples/train_lora, train_qlora, train_full) as a tunecost job.

Also the mapping helpers the YAML readers share: LoRA target lists, optimizer names, DeepSpeed, vision models.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from tunecost.workload.frameworks import ConfigFile, ConfigJob, Framework, KnownKeys, steps_options
from tunecost.workload.frameworks.accelerate import fp8_options
from tunecost.workload.frameworks.hf import optimizer_name
from tunecost.workload.frameworks.hf_common import INT8, compile_options, fsdp_options, liger_options
from tunecost.workload.frameworks.llamafactory_megatron import megatron_options
from tunecost.workload.job import group_targets, targets_text
from tunecost.workload.known_datasets import catalog_dataset

TITLE = "LLaMA-Factory"
# its hparams dataclasses and the transformers Seq2SeqTrainingArguments they extend (headers of keys/*.txt)
KEYS = KnownKeys(f"{TITLE}'s config", ("llamafactory", "hf_training_args", "hf_training_args_older", "hf_seq2seq_args"))
SFT_ONLY = "tunecost estimates supervised fine-tuning (full, LoRA, QLoRA) only"
VISION_MODEL = re.compile(r"(?i)vision|llava|internvl|(?<![a-z])vl(?![a-z])")

_FFN_W = ("w1", "w2", "w3")  # a dense MLP's, or Mixtral's experts (block_sparse_moe.experts.N.w1)
_ROUTER = ("gate", "router")
_ALL_LINEAR = ("all", "all-linear", "all_linear")
_WHOLE = {  # module sets that each cover a group: a target list covering none of them adapts only part of it
    "attention": ("q_proj k_proj v_proj o_proj", "query_key_value dense", "Wqkv out_proj", "qkv_proj o_proj", "c_attn"),
    "mlp": ("gate_proj up_proj down_proj", "gate_up_proj down_proj", "fc1 fc2", "c_fc c_proj", "w1 w2 w3",
            "dense_h_to_4h dense_4h_to_h"),
}  # fmt: skip
_NAME_GROUP = {name: group for group, sets in _WHOLE.items() for s in sets for name in s.split()}
_WHOLE_TEXT = {"attention": "all four projections", "mlp": "gate, up and down projections"}
_MOE_MODEL = re.compile(r"(?i)mixtral|moe")
# key: (default, option as tunecost reads it, how); read at hiyouga/LLaMA-Factory ff6d4d12 (v0.9.5-54, Aug 2026),
# src/llamafactory/hparams/*.py, and transformers 5.23.0 training_args.py (the Trainer arguments it extends)
_DEFAULTS: dict[str, tuple[Any, str, str]] = {
    "stage": ("sft", "stage sft", ""),  # finetuning_args.py
    "finetuning_type": ("lora", "method lora", "finetuning_type lora"),
    "lora_rank": (8, "lora_rank 8", ""),
    "lora_dropout": (0.0, "lora_dropout 0", ""),
    "lora_target": ("all", "lora_target all", ""),
    "quantization_method": ("bnb", "quantization_method bnb", ""),  # model_args.py
    "quantization_type": ("nf4", "quant_type nf4", ""),
    "double_quantization": (True, "double_quant on", ""),
    "flash_attn": ("auto", "attention sdpa", "flash_attn auto keeps transformers' default, sdpa"),
    "disable_gradient_checkpointing": (False, "gradient_checkpointing on", "disable_gradient_checkpointing false"),
    "use_reentrant_gc": (True, "reentrant on", "use_reentrant_gc true"),
    "cutoff_len": (2048, "seq_len 2048", "cutoff_len"),  # data_args.py
    "optim": ("adamw_torch_fused", "optimizer adamw", "transformers' optim adamw_torch_fused, torch >= 2.8"),
    "per_device_train_batch_size": (8, "batch_size 8", "transformers' per_device_train_batch_size"),
    "num_train_epochs": (3.0, "epochs 3.0", "transformers' num_train_epochs"),
}  # fmt: skip
# no bf16/fp16: model/patcher.py loads the weights in extras/misc.py infer_optim_dtype's dtype (bf16 first)
_OPT = "is not modelled; tunecost models adamw, adamw-8bit, adamw-4bit and sgd"
_UNMODELLED_FLAGS = {
    "use_unsloth": "unsloth's own kernels are not modelled", "use_dora": "DoRA is not modelled",
    "use_llama_pro": "LLaMA Pro (expanded blocks) is not modelled", "use_galore": f"GaLore {_OPT}",
    "use_apollo": f"APOLLO {_OPT}", "use_badam": f"BAdam {_OPT}", "use_adam_mini": f"Adam-mini {_OPT}",
    "use_muon": f"Muon {_OPT}",
}  # fmt: skip


def lora_target_groups(entries: Sequence[str], model: str | None, key: str) -> tuple[str | None, list[str]]:
    """tunecost's LoRA target groups (comma list) for module names / paths, and the assumption lines they need."""
    tokens = [re.findall(r"[A-Za-z0-9_]+", e) for e in entries]
    moe = bool(model and _MOE_MODEL.search(model)) or any(t in _ROUTER or t == "experts" for ts in tokens for t in ts)
    found: dict[str, set[str]] = {}
    notes: list[str] = []
    for entry, ts in zip(entries, tokens):
        if entry.strip().lower() in _ALL_LINEAR:
            found.setdefault("attention", set()).add("all")
            found.setdefault("mlp", set()).add("all")
            notes.append(f"{key} {entry}: every linear layer, read as attention,mlp (for an MoE model tunecost's "
                         "default targets may differ)")  # fmt: skip
            continue
        known = [t for t in ts if t in _NAME_GROUP]
        if "experts" in ts:
            group, name = "experts", "experts"
        elif any(t in _ROUTER for t in ts):
            group, name = "router", "gate"
        elif known:
            name = known[-1]
            group = ("experts" if moe else "mlp") if name in _FFN_W else _NAME_GROUP[name]
        else:
            notes.append(f"{key} {entry}: not a module tunecost adapts (attention, mlp, experts, router); left out")
            continue
        found.setdefault(group, set()).add(name)
    if any(n in _FFN_W for names in found.values() for n in names):
        notes.append(f"{key} w1/w2/w3: read as {'MoE experts' if moe else 'a dense MLP'} (from the model and targets)")
    targets: set[str] = set()
    for group, names in found.items():
        targets.update(narrowed := group_targets(group, names))
        whole = "all" in names or any(set(s.split()) <= names for s in _WHOLE.get(group, ()))
        if narrowed == (group,) and group in _WHOLE and not whole:
            notes.append(f"{key} {','.join(sorted(names))}: tunecost adapts the whole {group} group "
                         f"({_WHOLE_TEXT[group]}), not only the listed ones")  # fmt: skip
    return (targets_text(targets) or None), notes


def deepspeed_options(cfg: ConfigFile, key: str) -> tuple[dict[str, Any], list[str]]:
    """strategy/offload of an inline DeepSpeed dict; for a file path, an assumption line asking for the file."""
    value = cfg.typed(key, (str, dict))
    if value is None:
        return {}, []
    if isinstance(value, str):
        return {}, [f"deepspeed config {value}: pass it too with --config"]
    zero = value.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise cfg.error(key, f"zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    options: dict[str, Any] = {"strategy": f"zero{stage}" if stage else "ddp"}
    notes = [] if "stage" in zero else ["zero stage 0: DeepSpeed's default (plain data parallel)"]
    params, optim = (
        str((zero.get(k) or {}).get("device")) in ("cpu", "nvme") for k in ("offload_param", "offload_optimizer")
    )
    if params or optim:
        options["offload"] = "params" if params else "optimizer"
    return options, notes


def filled(cfg: ConfigFile, notes: list[str], key: str, kind: Any, default: Any, line: str) -> Any:
    """The key's value, or the framework's `default` with its assumption `line` noted."""
    value = cfg.typed(key, kind)
    if value is None:
        notes.append(line)
        return default
    return value


def _get(cfg: ConfigFile, notes: list[str], key: str, kind: Any) -> Any:
    default, said, how = _DEFAULTS[key]
    return filled(cfg, notes, key, kind, default, f"{said}: {TITLE}'s default" + (f" ({how})" if how else ""))


def _method(cfg: ConfigFile, model: str | None, notes: list[str]) -> dict[str, Any]:
    stage = _get(cfg, notes, "stage", str)
    if stage != "sft":
        raise cfg.error("stage", f"{stage} (pt: pretraining, rm/ppo/dpo/kto: reward/preference training): {SFT_ONLY}")
    for key, what in _UNMODELLED_FLAGS.items():
        if cfg.typed(key, bool):
            raise cfg.error(key, what)
    kind = _get(cfg, notes, "finetuning_type", str)
    if kind not in ("lora", "full"):
        raise cfg.error("finetuning_type", f"{kind}: tunecost estimates full, LoRA and QLoRA fine-tuning")
    options: dict[str, Any] = {"method": kind}
    bits = cfg.typed("quantization_bit", int)
    if bits is not None and bits not in (4, 8):
        raise cfg.error("quantization_bit", f"{bits}-bit weights are not modelled; tunecost models 16, 8 and 4 bits")
    if bits is not None:
        if kind != "lora":
            raise cfg.error("quantization_bit", f"{TITLE} quantizes only for finetuning_type lora")
        qmethod = _get(cfg, notes, "quantization_method", str)
        if qmethod != "bnb":
            raise cfg.error("quantization_method", f"{qmethod}: tunecost models bitsandbytes (bnb) quantization only")
    if bits == 8:  # BitsAndBytesConfig(load_in_8bit=True) (model/model_utils/quantization.py)
        options |= INT8
        notes.append("quantization_bit 8: LLM.int8 base weights (--quant-type int8)")
    if bits == 4:
        quant = _get(cfg, notes, "quantization_type", str)
        if quant not in ("nf4", "fp4"):
            raise cfg.error("quantization_type", f"must be nf4 or fp4, got {quant!r}")
        double = _get(cfg, notes, "double_quantization", bool)
        options |= {"method": "qlora", "quant_type": quant, "double_quant": double}
    if kind == "lora":
        rank = _get(cfg, notes, "lora_rank", int)
        alpha = cfg.typed("lora_alpha", (int, float))
        if not alpha:  # LLaMA-Factory: lora_alpha or lora_rank * 2
            alpha = rank * 2
            notes.append(f"lora_alpha {alpha}: {TITLE}'s default (lora_rank * 2)")
        target = _get(cfg, notes, "lora_target", str)
        groups, target_notes = lora_target_groups([t.strip() for t in target.split(",")], model, "lora_target")
        options |= {"lora_rank": rank, "lora_alpha": alpha} | ({"lora_targets": groups} if groups else {})
        options["lora_dropout"] = _get(cfg, notes, "lora_dropout", (int, float))
        notes += target_notes
    return options


def _training(cfg: ConfigFile, notes: list[str]) -> dict[str, Any]:
    bf16, fp16, pure = (cfg.typed(k, bool) for k in ("bf16", "fp16", "pure_bf16"))
    if bf16 and fp16:
        raise cfg.error("fp16", "bf16 and fp16 are both true; set one")
    if not (bf16 or fp16 or pure):
        notes.append(f"dtype bf16: {TITLE}'s default without bf16/fp16 (weights in bf16 where the GPU has it and "
                     "the model's torch_dtype is bf16 or unset, else fp16; no mixed precision)")  # fmt: skip
    flash = _get(cfg, notes, "flash_attn", str)
    attention = {"auto": "sdpa", "sdpa": "sdpa", "fa2": "flash", "fa3": "flash", "disabled": "eager"}.get(flash)
    if attention is None:
        raise cfg.error("flash_attn", f"{flash}: must be auto, disabled, sdpa, fa2 or fa3")
    off = _get(cfg, notes, "disable_gradient_checkpointing", bool)
    options: dict[str, Any] = {
        "dtype": "fp16" if fp16 else "bf16",
        "attention": attention,
        "gradient_checkpointing": not off,
        "optimizer": optimizer_name(cfg, "optim", _get(cfg, notes, "optim", str)),
        "seq_len": _get(cfg, notes, "cutoff_len", int),
        "batch_size": _get(cfg, notes, "per_device_train_batch_size", int),
    }
    if not off:
        options["reentrant"] = _get(cfg, notes, "use_reentrant_gc", bool)
    options |= steps_options(cfg, ("max_steps", "gradient_accumulation_steps"), TITLE, notes)
    if "max_steps" in options:
        cfg.typed("num_train_epochs", (int, float))
        return options
    return options | {"epochs": _get(cfg, notes, "num_train_epochs", (int, float))}


def _read(cfg: ConfigFile) -> ConfigJob:
    cfg.check_keys(KEYS)
    notes: list[str] = []
    model = cfg.typed("model_name_or_path", str)
    vision = [k for k in cfg.data if k.startswith(("image_", "video_", "audio_", "freeze_vision", "freeze_multi"))]
    if vision or (model and VISION_MODEL.search(model)):
        raise cfg.error(vision[0] if vision else "model_name_or_path", f"a multimodal model or data: {SFT_ONLY}")
    do_train = cfg.typed("do_train", bool)
    if do_train is False:
        raise cfg.error("do_train", f"false: nothing is trained; {SFT_ONLY}")
    if do_train is None:
        notes.append(f"do_train unset: read as a training run ({TITLE} trains only with do_train true)")
    options: dict[str, Any] = {"model": model} if model else {}
    options |= _method(cfg, model, notes) | _training(cfg, notes)
    names = [n for n in (cfg.typed("dataset", str) or "").split(",") if n.strip()]
    max_samples = cfg.typed("max_samples", int)
    if max_samples is not None:  # data/loader.py: each dataset cut to its first max_samples examples
        options["max_queries"] = max_samples * max(1, len(names))
        notes.append(f"max_samples {max_samples}: each of the {max(1, len(names))} dataset(s) cut to its first "
                     f"{max_samples} examples, at most {options['max_queries']} queries per epoch")  # fmt: skip
    for name in names:
        if known := catalog_dataset(name):
            options["dataset"] = known
        elif name.strip():
            notes.append(f"dataset {name.strip()}: a {TITLE} dataset name, give --dataset FILE for its lengths")
    if cfg.typed("neat_packing", bool):
        options["packing"] = "per-document"
        notes.append("packing per-document: neat_packing packs examples into cutoff_len-token rows, attention within "
                     "each")  # fmt: skip
    elif cfg.typed("packing", bool):
        options["packing"] = "cross-document"
        notes.append("packing cross-document: packing packs examples into cutoff_len-token rows, one causal mask "
                     "over each (neat_packing would keep them apart)")  # fmt: skip
    ds_options, ds_notes = deepspeed_options(cfg, "deepspeed")
    fsdp, fsdp_notes = fsdp_options(cfg)  # the Trainer's own fsdp / fsdp_config arguments
    compiled, compile_notes = compile_options(cfg, TITLE)
    liger, liger_notes = liger_options(cfg, "enable_liger_kernel")
    options |= ds_options | fsdp | compiled | liger | {"stack": "hf-peft"}
    notes += [*ds_notes, *fsdp_notes, *compile_notes, *liger_notes, f"stack hf-peft: {TITLE} runs transformers + PEFT"]
    megatron = megatron_options(cfg, model, notes)
    if megatron:  # Megatron Core runs the model: the Trainer's checkpointing, attention and stack do not apply
        hf_only = ("gradient_checkpointing ", "reentrant ", "attention ", "optimizer ", "stack hf-peft", "enable_liger")
        notes = [n for n in notes if not n.startswith(hf_only)]
        hf_options = ("reentrant", "attention", "liger_kernel")
        options = {k: v for k, v in options.items() if k not in hf_options} | megatron
    elif cfg.typed("fp8", bool) or cfg.typed("fp8_enable_fsdp_float8_all_gather", bool):
        # train/fp8_utils.py: torchao rowwise (auto, torchao) or TE's HYBRID delayed recipe, forced into accelerate
        fp8, fp8_notes = fp8_options(cfg, "fp8_backend", cfg.typed("fp8_backend", str), "rowwise", f"{TITLE}'s")
        options, notes = options | fp8, notes + fp8_notes
    return ConfigJob(framework="llamafactory-megatron" if megatron else "llamafactory", path=cfg.path,
                     options=options, assumptions=tuple(notes), not_modelled=cfg.unused_keys())  # fmt: skip


def _detect(data: Mapping[str, Any]) -> bool:
    keys = ("stage", "finetuning_type", "lora_target", "cutoff_len", "quantization_bit", "flash_attn")
    return "model_name_or_path" in data and any(k in data for k in keys)


FRAMEWORK = Framework(name="llamafactory", title=TITLE, suffixes=(".yaml", ".yml", ".json"), detect=_detect, read=_read)
