"""LLaMA-Factory training YAML (examples/train_lora, train_qlora, train_full) as a tunecost job."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tunecost.workload.datasets import load_dataset
from tunecost.workload.frameworks import SFT_ONLY, ConfigFile, ConfigJob, Framework, KnownKeys, steps_options
from tunecost.workload.frameworks.hf_common import (
    AUTOTP_STRATEGIES,
    INT8,
    VISION_MODEL,
    compile_options,
    deepspeed_options,
    eval_split_of,
    fp8_options,
    fsdp_options,
    liger_options,
    modules_to_save,
    name_list,
    optimizer_options,
    peft_targets,
)
from tunecost.workload.frameworks.llamafactory_megatron import megatron_options
from tunecost.workload.frameworks.model_parallel import soft_capped
from tunecost.workload.job import fp32_strategies, targets_text
from tunecost.workload.known_datasets import FILE_SUFFIXES, catalog_dataset, mixture_parts
from tunecost.workload.run_length import interleaved_queries

TITLE = "LLaMA-Factory"
MIX_STRATEGIES = ("concat", "interleave_under", "interleave_over")  # hparams/data_args.py
# its hparams dataclasses and the transformers Seq2SeqTrainingArguments they extend (headers of keys/*.txt)
KEYS = KnownKeys(f"{TITLE}'s config", ("llamafactory", "hf_training_args", "hf_training_args_older", "hf_seq2seq_args"))

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
    "use_muon": f"Muon {_OPT}", "use_kt": "KTransformers (the MoE experts run on the CPU) is not modelled",
    "shift_attn": "LongLoRA's shifted short attention (S^2-Attn) is not modelled",
    "mixture_of_depths": "Mixture-of-Depths (tokens skip layers) is not modelled",
}  # fmt: skip


def _get(cfg: ConfigFile, notes: list[str], key: str, kind: Any) -> Any:
    default, said, how = _DEFAULTS[key]
    return cfg.or_default(key, kind, default, notes, f"{said}: {TITLE}'s default" + (f" ({how})" if how else ""))


def _method(cfg: ConfigFile, model: str | None, notes: list[str]) -> dict[str, Any]:
    stage = _get(cfg, notes, "stage", str)
    if stage != "sft":
        raise cfg.error("stage", f"{stage} (pt: pretraining, rm/ppo/dpo/kto: reward/preference training): {SFT_ONLY}")
    for key, what in _UNMODELLED_FLAGS.items():
        if cfg.typed(key, str if key == "mixture_of_depths" else bool):  # its "convert" or "load"
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
        target = _get(cfg, notes, "lora_target", (str, list))
        targets, target_notes = peft_targets(cfg, "lora_target", name_list(target), model)
        options |= {"lora_rank": rank, "lora_alpha": alpha, "lora_targets": targets_text(targets)}
        options["lora_dropout"] = _get(cfg, notes, "lora_dropout", (int, float))
        options |= modules_to_save(cfg, "additional_target")  # model/adapter.py: PEFT's modules_to_save
        if cfg.typed("resize_vocab", bool) and "modules_to_save" not in options:
            options["modules_to_save"] = "embed_tokens,lm_head"
            notes.append("modules_to_save embed_tokens,lm_head: resize_vocab trains the resized embeddings fully")
        notes += target_notes
    return options


def _training(cfg: ConfigFile, model: str | None, notes: list[str]) -> dict[str, Any]:
    bf16, fp16, pure = (cfg.typed(k, bool) for k in ("bf16", "fp16", "pure_bf16"))
    if bf16 and fp16:
        raise cfg.error("fp16", "bf16 and fp16 are both true; set one")
    if not (bf16 or fp16 or pure):
        notes.append(f"dtype bf16: {TITLE}'s default without bf16/fp16 (weights in bf16 where the GPU has it and "
                     "the model's torch_dtype is bf16 or unset, else fp16; no mixed precision)")  # fmt: skip
    # model_utils/attention.py: auto on Gemma-2 is fa2 where flash-attn is installed, else eager; elsewhere sdpa
    capped = cfg.data.get("flash_attn", "auto") == "auto" and soft_capped(model)
    if capped:
        cfg.get("flash_attn")
        notes.append(f"attention eager: {TITLE}'s flash_attn auto on Gemma-2 (fa2 where flash-attn is installed, "
                     "else eager; --attention flash prices fa2)")  # fmt: skip
    flash = "disabled" if capped else _get(cfg, notes, "flash_attn", str)
    attention = {"auto": "sdpa", "sdpa": "sdpa", "fa2": "flash", "fa3": "flash", "disabled": "eager"}.get(flash)
    if attention is None:
        raise cfg.error("flash_attn", f"{flash}: must be auto, disabled, sdpa, fa2 or fa3")
    off = _get(cfg, notes, "disable_gradient_checkpointing", bool)
    options: dict[str, Any] = {
        "dtype": "fp16" if fp16 else "bf16",
        "attention": attention,
        "gradient_checkpointing": not off,
        **optimizer_options(cfg, "optim", _get(cfg, notes, "optim", str)),
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
    if do_train is None and (cfg.typed("do_predict", bool) or cfg.typed("do_eval", bool)):
        which = "do_predict" if cfg.data.get("do_predict") else "do_eval"
        raise cfg.error(which, f"true without do_train: an evaluation or prediction run trains nothing; {SFT_ONLY}")
    if do_train is None:
        notes.append(f"do_train unset: read as a training run ({TITLE} trains only with do_train true)")
    options: dict[str, Any] = {"model": model} if model else {}
    options |= _method(cfg, model, notes) | _training(cfg, model, notes)
    names = name_list(cfg.typed("dataset", (str, list)))
    max_samples = cfg.typed("max_samples", int)
    if max_samples is not None:  # data/loader.py: each dataset cut to its first max_samples examples
        options["max_queries"] = max_samples * max(1, len(names))  # not a bound on an interleave_over mixture
        options["max_queries_per_dataset"] = max_samples
        at_most = "" if len(names) > 1 else f", at most {max_samples} queries per epoch"
        notes.append(f"max_samples {max_samples}: each of the {max(1, len(names))} dataset(s) cut to its first "
                     f"{max_samples} examples{at_most}")  # fmt: skip
    options |= eval_split_of(cfg, "val_size")  # data/data_utils.py split_dataset: train_test_split(test_size)
    if (workers := cfg.typed("ray_num_workers", int)) is not None and workers > 1:  # train/tuner.py, USE_RAY=1
        options["num_gpus"] = workers
        notes.append(f"num_gpus {workers}: ray_num_workers, one GPU per Ray worker (a run launched with USE_RAY=1)")
    files = [_dataset_info_file(cfg, name.strip()) for name in names]
    local = [f for f in files if f is not None] if None not in files else []
    for name, file in zip(names, local):  # dataset_info.json's own files first: what LLaMA-Factory trains on
        notes.append(f"dataset {name.strip()}: {file}, its file in dataset_dir/dataset_info.json")
    if local:
        options["dataset"] = ",".join(str(f) for f in local)
    for name in names if not local else ():
        if known := catalog_dataset(name):
            options["dataset"] = known
        elif name.strip():
            notes.append(f"dataset {name.strip()}: a {TITLE} dataset name, give --dataset FILE for its lengths")
    if len(names) > 1:
        options |= _merged(cfg, names, max_samples, options.get("dataset"), notes, local)
    if cfg.typed("neat_packing", bool):
        options["packing"] = "per-document"
        notes.append("packing per-document: neat_packing packs examples into cutoff_len-token rows, attention within "
                     "each")  # fmt: skip
    elif cfg.typed("packing", bool):
        options["packing"] = "cross-document"
        notes.append("packing cross-document: packing packs examples into cutoff_len-token rows, one causal mask "
                     "over each (neat_packing would keep them apart)")  # fmt: skip
    ds_options, ds_notes = deepspeed_options(cfg, "deepspeed")
    # the Trainer's own fsdp / fsdp_config arguments, on the transformers <= 5.8.0 its pyproject.toml pins
    fsdp, fsdp_notes = fsdp_options(cfg, ("1", f"transformers' default up to 5.9 ({TITLE} pins <= 5.8.0)"))
    compiled, compile_notes = compile_options(cfg, TITLE)
    liger, liger_notes = liger_options(cfg, "enable_liger_kernel")
    options |= ds_options | fsdp | compiled | liger | {"stack": "hf-peft"}
    notes += [*ds_notes, *fsdp_notes, *compile_notes, *liger_notes, f"stack hf-peft: {TITLE} runs transformers + PEFT"]
    upcast, upcast_notes = _upcast(cfg, options)
    options, notes = options | upcast, notes + upcast_notes
    megatron = megatron_options(cfg, model, notes)
    if megatron:  # Megatron Core runs the model: the Trainer's checkpointing, attention and stack do not apply
        hf_only = ("gradient_checkpointing ", "reentrant ", "attention ", "optimizer ", "stack hf-peft", "enable_liger",
                   "parameters in ", "fp32_params")  # fmt: skip
        notes = [n for n in notes if not n.startswith(hf_only)]
        hf_options = ("reentrant", "attention", "liger_kernel", "fp32_params")
        options = {k: v for k, v in options.items() if k not in hf_options} | megatron
    elif cfg.typed("fp8", bool) or cfg.typed("fp8_enable_fsdp_float8_all_gather", bool):
        # train/fp8_utils.py: torchao rowwise (auto, torchao) or TE's HYBRID delayed recipe, forced into accelerate
        fp8, fp8_notes = fp8_options(cfg, "fp8_backend", cfg.typed("fp8_backend", str), "rowwise", f"{TITLE}'s")
        options, notes = options | fp8, notes + fp8_notes
    return ConfigJob(framework="llamafactory-megatron" if megatron else "llamafactory", path=cfg.path,
                     options=options, assumptions=tuple(notes), not_modelled=cfg.unused_keys())  # fmt: skip


UPCASTS = (
    "upcasts a full fine-tune's trainable parameters to fp32"  # not under DeepSpeed/FSDP: `registry.merge_configs`
)


def _dataset_info_file(cfg: ConfigFile, name: str) -> Path | None:
    """The local file `name` stands for in dataset_dir/dataset_info.json (dataset_dir "data" under the working
    directory, as data/parser.py reads it) where tunecost reads it as LLaMA-Factory does: a file of alpaca or
    sharegpt rows under their default columns, not a hub or script dataset, nor sampled (`num_samples`)."""
    folder = Path(cfg.typed("dataset_dir", str) or "data").expanduser()
    try:
        info = json.loads((folder / "dataset_info.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None  # no dataset_info.json here: the name stays a name
    entry = info.get(name) if isinstance(info, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("file_name"), str):
        return None
    remote = any(k in entry for k in ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name"))
    recast = any(k in entry for k in ("columns", "tags", "num_samples")) or entry.get("ranking")
    path = folder / entry["file_name"]
    if remote or recast or entry.get("formatting", "alpaca") not in ("alpaca", "sharegpt"):
        return None
    return path if path.is_file() and path.suffix in FILE_SUFFIXES else None


def _merged(
    cfg: ConfigFile, names: list[str], cut: int | None, known: str | None, notes: list[str], files: list[Path]
) -> dict[str, Any]:
    """The queries per epoch of several datasets, each cut to max_samples (`cut`), as data/data_utils.py
    merge_dataset mixes them (mix_strategy: concatenated, or interleaved with interleave_probs), where the catalog
    (or their local `files`) counts every one; else `known`'s."""
    strategy = cfg.typed("mix_strategy", str) or "concat"
    if strategy not in MIX_STRATEGIES:
        raise cfg.error("mix_strategy", f"{strategy}: one of {', '.join(MIX_STRATEGIES)}")
    probs = _interleave_probs(cfg, strategy, len(names))
    parts = [_local_part(f, cut) for f in files] or mixture_parts([(n, None, 1.0) for n in names], cut)
    if parts is None:
        if known:
            notes.append(f"dataset: {len(names)} datasets (not all in the catalog): {known}'s queries per epoch "
                         "(--queries gives theirs)")  # fmt: skip
        return {}
    text = " + ".join(t for _, t in parts)
    if strategy == "concat":
        n, how = sum(k for k, _ in parts), "concatenated"
    else:  # datasets' interleave_datasets: first_exhausted (under), all_exhausted (over)
        over = strategy == "interleave_over"
        n = interleaved_queries([k for k, _ in parts], probs, over=over)
        drawn = "in turn" if probs is None else f"drawn with interleave_probs {','.join(f'{p:g}' for p in probs)}"
        how = f"interleaved {drawn} until {'every one' if over else 'the first'} is exhausted"
    notes.append(f"dataset: {n} queries per epoch, its {len(names)} datasets {how} ({text})")
    return {"mixture_queries": n}


def _local_part(file: Path, cut: int | None) -> tuple[int, str]:
    """The examples LLaMA-Factory takes of a local data file (its first `cut`), and a text naming them."""
    rows = len(load_dataset(str(file)))
    n = min(rows, cut or rows)
    return n, f"{n} of {file.name}"


def _interleave_probs(cfg: ConfigFile, strategy: str, count: int) -> list[float] | None:
    """interleave_probs as hparams/data_args.py reads it (commas), checked as it and numpy's choice check it."""
    given = cfg.typed("interleave_probs", (str, list))
    if given is None:
        return None
    if strategy == "concat":
        raise cfg.error("interleave_probs", "only valid with mix_strategy interleave_under or interleave_over")
    try:
        probs = [float(p) for p in name_list(given)]
    except ValueError:
        raise cfg.error("interleave_probs", f"{given}: numbers separated by commas") from None
    if len(probs) != count or min(probs) < 0 or abs(sum(probs) - 1) > 1e-8:
        raise cfg.error("interleave_probs", f"{given}: {count} probabilities, one per dataset, >= 0 and summing to 1")
    return probs


def _upcast(cfg: ConfigFile, options: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """model/adapter.py: a full fine-tune's trainable parameters are upcast to fp32 unless pure_bf16 or under
    ZeRO-3, and DeepSpeed's engine casts its module back to its own dtype (any stage): with bf16 or fp16 the step
    computes in it over fp32 parameters (`fp32_params`: autocast, or FSDP's mixed precision); else it trains in fp32."""
    held = options.get("strategy", "single") in fp32_strategies("full") and not cfg.data.get("deepspeed")
    if options.get("method") != "full" or cfg.data.get("pure_bf16") or not held:
        return {}, []
    if cfg.data.get("bf16") or cfg.data.get("fp16"):
        return {"fp32_params": True}, [f"fp32_params: {TITLE} {UPCASTS} (pure_bf16 false), trained under "
                                       f"{options['dtype']} autocast (model/adapter.py)"]  # fmt: skip
    return {}, [f"parameters in {options['dtype']}: {TITLE} {UPCASTS} and, without bf16 or fp16, trains them in "
                "fp32 (no autocast): --dtype fp32 prices that"]  # fmt: skip


def _detect(data: Mapping[str, Any]) -> bool:
    keys = ("stage", "finetuning_type", "lora_target", "cutoff_len", "quantization_bit", "flash_attn")
    return "model_name_or_path" in data and any(k in data for k in keys)


# model_parallel: DeepSpeed AutoTP (its Megatron backends are framework llamafactory-megatron, every layout)
FRAMEWORK = Framework(name="llamafactory", title=TITLE, suffixes=(".yaml", ".yml", ".json"), detect=_detect,
                      read=_read, model_parallel=("tp",), tp_shards_norms=False,
                      tp_strategies=AUTOTP_STRATEGIES)  # fmt: skip
