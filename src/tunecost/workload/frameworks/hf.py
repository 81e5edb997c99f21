"""Reader for a transformers TrainingArguments / TRL SFTConfig dump (JSON or YAML, with a TRL script's ModelConfig
keys where present), and the LoRA, 4-bit and 8-bit options the Hugging Face stack's files share (`adapters`).
It reports its own file and its library's defaults only: `--config` merges the files."""

# Defaults filled (installed transformers 5.23.0; trl main f2cd577 = 1.10.0.dev0):
#   per_device_train_batch_size 8, num_train_epochs 3.0, bf16/fp16 off, activation_checkpointing off,
#   optim adamw_torch_fused (torch >= 2.8), fsdp_config version 2: transformers training_args.py
#   use_reentrant False without checkpointing kwargs, attn_implementation sdpa: transformers modeling_utils.py
#   SFTConfig max_length 1024, gradient_checkpointing on, bf16 unless fp16, use_reentrant False, loss_type
#   chunked_nll: trl trainer/sft_config.py, base_config.py, sft_trainer.py; ModelConfig lora_r 16, lora_alpha 32,
#   lora_dropout 0.05, bnb_4bit_quant_type nf4, use_bnb_nested_quant False: trl trainer/model_config.py
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tunecost.catalog.peft_targets import peft_default_targets
from tunecost.errors import TunecostError
from tunecost.models.catalog import resolve_model
from tunecost.workload.frameworks import (
    PASS_DEEPSPEED,
    ConfigFile,
    ConfigJob,
    Framework,
    KnownKeys,
    steps_options,
)
from tunecost.workload.frameworks.hf_common import (
    HF_TP_STRATEGIES,
    Part,
    compile_options,
    eval_split_of,
    fsdp_options,
    int8_options,
    liger_options,
    optimizer_options,
    peft_targets,
    truthy,
)
from tunecost.workload.job import fp32_strategies, targets_text
from tunecost.workload.known_datasets import config_dataset_option, mixture_option


def words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


TA, SFT, TRL_MODEL = "transformers TrainingArguments'", "TRL SFTConfig's", "TRL ModelConfig's"
PEFT, BNB = "PEFT LoraConfig's", "BitsAndBytesConfig's"
TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
BOTH_OFF = "(bf16, fp16 off)"  # in the dtype line of a Trainer file that turns both off: no autocast
SFT_KEYS = {"max_length", "max_seq_length", "packing", "dataset_text_field", "completion_only_loss", "loss_type"}
SCRIPT_KEYS = ("dataset_name", "datasets", "dataset_mixture")  # a TRL script's data (ScriptArguments): `trl sft`'s
TRL_MODEL_KEYS = {"use_peft", "lora_r", "lora_target_modules", "use_bnb_nested_quant"}
# the keys of each file (keys/*.txt); max_seq_length: SFTConfig's max_length before TRL 0.20, torch_dtype:
# ModelConfig's dtype before TRL 0.22 (many TRL YAMLs still set it); dataset_mixture, chat_template: the alignment
# handbook's ScriptArguments and SFTConfig (huggingface/alignment-handbook@925acdfe src/alignment/configs.py)
TRAINER_KEYS = ("hf_training_args", "hf_training_args_older", "hf_seq2seq_args", "trl_sft")
ARGS_KEYS = KnownKeys(
    "transformers' TrainingArguments or TRL's SFTConfig",
    TRAINER_KEYS,
    extra=("max_seq_length", "torch_dtype", "dataset_mixture", "chat_template"),
)
# key prefixes that change neither memory nor time: logging, saving, evaluation, hub, learning-rate schedule, seeds
NO_COST = words(
    "output_dir overwrite_output_dir logging_ log_ save_ eval_ hub_ push_to_hub report_to run_name project trackio_ "
    "seed data_seed learning_rate lr_scheduler_ warmup_ adam_ weight_decay max_grad_norm label_ per_device_eval "
    "prediction_loss_only include_ disable_tqdm load_best metric_for greater_is ignore_data_skip restore_callback "
    "full_determinism do_ resume_from local_rank ddp_timeout skip_memory remove_unused length_column train_sampling "
    "accelerator_config average_tokens debug batch_eval dataset_text_field dataset_num_proc dataset_kwargs eos_token "
    "pad_token chat_template truncation_mode shuffle_dataset completion_only_loss assistant_only_loss "
    "trust_remote_code lora_task_type task_type inference_mode peft_version revision llm_int8_"
)


def not_modelled(cfg: ConfigFile, skip: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The unused keys that say something (not empty, off or unset) and do not start with a `skip` prefix."""
    said = (k for k in cfg.unused_keys() if cfg.data[k] not in (None, False, "", [], {}, "none", "no"))
    return tuple(k for k in said if not k.startswith(skip))


def job(cfg: ConfigFile, framework: str, options: dict[str, Any], notes: list[str]) -> ConfigJob:
    return ConfigJob(
        framework=framework,
        path=cfg.path,
        options=options,
        assumptions=tuple(notes),
        not_modelled=not_modelled(cfg, NO_COST),
    )


def attention_of(cfg: ConfigFile, key: str, value: str) -> str:
    for word, attention in (("flash", "flash"), ("fa2", "flash"), ("sdpa", "sdpa"), ("eager", "eager")):
        if word in value.lower():
            return attention
    raise cfg.error(key, f"{value!r} is not modelled; tunecost models flash_attention_2, sdpa and eager")


def lora_options(
    cfg: ConfigFile, keys: tuple[str, ...], defaults: tuple[int, int, float], whose: str, model: Any
) -> Part:
    """lora_rank, lora_alpha, lora_dropout (`lora_dropout`), lora_targets from the keys (rank, alpha, target
    modules, target parameters)."""
    out: dict[str, Any] = {}
    notes: list[str] = []
    dropout = cfg.typed("lora_dropout", (int, float))
    out["lora_dropout"] = defaults[2] if dropout is None else dropout
    notes += [f"lora_dropout {defaults[2]}: {whose} default"] if dropout is None and defaults[2] else []
    for option, key, default in (("lora_rank", keys[0], defaults[0]), ("lora_alpha", keys[1], defaults[1])):
        value = cfg.typed(key, int if option == "lora_rank" else (int, float))
        out[option] = default if value is None else value
        notes += [f"{option} {default} ({key}): {whose} default"] if value is None else []
    groups: set[str] = set()
    for key in keys[2:]:
        if cfg.get(key) not in (None, []):
            groups |= _target_groups(cfg, key, cfg.data[key], model, notes)
    if not groups and cfg.data.get(keys[2]) is None:
        groups = _peft_default_targets(cfg, keys[2], model, whose, notes)
    if groups:
        out["lora_targets"] = targets_text(groups)
    return out, notes


def _peft_default_targets(cfg: ConfigFile, key: str, model: Any, whose: str, notes: list[str]) -> set[str]:
    """The targets PEFT takes for the model's type when `key` is unset (`catalog.peft_targets`); none (tunecost's
    default targets) where the model is not known here or PEFT has no default for its type."""
    try:
        model_type = resolve_model(str(model)).family if model else None
    except TunecostError:
        model_type = None
    names = peft_default_targets(model_type) if model_type else None
    if names is None:
        why = f"PEFT has none for model type {model_type}" if model_type else "the model's type is not known here"
        notes.append(f"lora_targets ({key} unset): {whose} default, PEFT's targets for the architecture ({why}): "
                     "tunecost's default targets")  # fmt: skip
        return set()
    notes.append(f"lora_targets {', '.join(names)} ({key} unset): PEFT's default for model type {model_type}")
    return _target_groups(cfg, key, list(names), model, notes)


def _target_groups(cfg: ConfigFile, key: str, names: Any, model: Any, notes: list[str]) -> set[str]:
    """PEFT's target list (names, or one name or pattern) as tunecost's targets."""
    if not isinstance(names, (list, str)):
        raise cfg.error(key, f"must be a list of module names or 'all-linear', got {names!r}")
    targets, lines = peft_targets(cfg, key, [names] if isinstance(names, str) else [str(n) for n in names], model)
    notes += lines
    return targets


def qlora_options(cfg: ConfigFile, keys: tuple[str, str], defaults: tuple[str, bool], whose: str) -> Part:
    """method qlora with quant_type and double_quant from the (quant type, double quant) keys."""
    quant, double = cfg.typed(keys[0], str), cfg.typed(keys[1], bool)
    if quant is not None and quant.lower() not in ("nf4", "fp4"):
        raise cfg.error(keys[0], f"{quant!r} is not a 4-bit type tunecost models (nf4, fp4)")
    out = {"method": "qlora", "quant_type": (quant or defaults[0]).lower(), "double_quant": double}
    notes = [f"quant_type {defaults[0]} ({keys[0]}): {whose} default"] if quant is None else []
    if double is None:
        out["double_quant"] = defaults[1]
        notes.append(f"double_quant {defaults[1]} ({keys[1]}): {whose} default")
    return out, notes


def _mapping(cfg: ConfigFile, key: str) -> dict[str, Any]:
    """A mapping value, or JSON text of one (TrainingArguments parses both)."""
    value = cfg.get(key)
    try:
        value = json.loads(value) if isinstance(value, str) and value.lstrip().startswith("{") else value
    except ValueError:
        raise cfg.error(key, "is not valid JSON") from None
    if value is not None and not isinstance(value, dict):
        raise cfg.error(key, f"must be a mapping, got {value!r}")
    return value or {}


def _checkpointing(cfg: ConfigFile, whose: str) -> Part:
    """gradient_checkpointing, reentrant: transformers 5 names them activation_checkpointing*, gradient_* aliases."""
    on, alias = cfg.typed("activation_checkpointing", bool), cfg.typed("gradient_checkpointing", bool)
    on = alias if on is None else on
    both = [_mapping(cfg, f"{name}_kwargs") for name in ("activation_checkpointing", "gradient_checkpointing")]
    kwargs = both[0] or both[1]
    notes = [] if on is not None else [f"gradient_checkpointing {'on' if whose == SFT else 'off'}: {whose} default"]
    if not (on or (on is None and whose == SFT)):
        return {"gradient_checkpointing": False}, notes
    reentrant = kwargs.get("use_reentrant")
    if reentrant is None:  # transformers passes use_reentrant False without other kwargs; torch's default is True
        reentrant = whose != SFT and bool(set(kwargs) - {"every_n_layers", "offload"})
        source = "torch.utils.checkpoint's default" if reentrant else f"{whose} default"
        notes.append(f"reentrant {reentrant} (use_reentrant unset): {source}")
    elif not isinstance(reentrant, bool):
        raise cfg.error("gradient_checkpointing_kwargs", f"use_reentrant must be true or false, got {reentrant!r}")
    if kwargs.get("every_n_layers", 1) != 1:
        notes.append(f"every_n_layers {kwargs['every_n_layers']}: not modelled (tunecost checkpoints every layer)")
    if truthy(kwargs.get("offload", False)):
        notes.append("checkpointing offload: not modelled on the hf-peft stack (saved activations counted on the GPU)")
    return {"gradient_checkpointing": True, "reentrant": reentrant}, notes


def _precision(cfg: ConfigFile, whose: str) -> Part:
    """The compute dtype: bf16 / fp16 autocast where on (TRL's SFTConfig: bf16 unless fp16); both off, no autocast:
    the dtype the model was loaded in (BOTH_OFF): TRL's load dtype (float32 by default), else transformers 5's
    from_pretrained default, the checkpoint's (dtype "auto": bf16 for the catalog's models)."""
    bf16, fp16 = cfg.typed("bf16", bool), cfg.typed("fp16", bool)
    if bf16 and fp16:
        raise cfg.error("bf16", "bf16 and fp16 are both true; set one")
    if bf16 or fp16:
        return {"dtype": "bf16" if bf16 else "fp16"}, []
    if whose == SFT and bf16 is None:
        return {"dtype": "bf16"}, [f"dtype bf16 (bf16 unset, fp16 off): {whose} default"]
    launch = "accelerate launch's mixed_precision turns autocast on where set"
    if whose == SFT:
        stated = _trl_dtype(cfg)
        loaded = TORCH_DTYPES.get(str(stated), "bf16" if stated == "auto" else "fp32")
        return {"dtype": loaded}, [f"dtype {loaded} {BOTH_OFF}: no autocast, the model in TRL's load dtype; {launch}"]
    default = "" if bf16 is False else f"{whose} default; "
    return {"dtype": "bf16"}, [f"dtype bf16 {BOTH_OFF}: {default}no autocast, the model in the dtype it was loaded in "
                               "(transformers' from_pretrained: the checkpoint's, bf16 for the catalog's models; "
                               f"--dtype fp32 for a model loaded in fp32); {launch}"]  # fmt: skip


def _trl_dtype(cfg: ConfigFile) -> str | None:
    """The dtype TRL loads the model in, as the file says it (dtype, torch_dtype, model_init_kwargs; None: unset)."""
    init = _mapping(cfg, "model_init_kwargs")
    key = next((k for k in ("dtype", "torch_dtype") if cfg.data.get(k) is not None), None)
    dtype = cfg.typed(key, str) if key else init.get("dtype") or init.get("torch_dtype")
    if dtype not in (None, "bfloat16", "float16", "float32", "auto"):
        raise cfg.error(key or "model_init_kwargs", f"{dtype!r}: bfloat16, float16, float32 or auto")
    return dtype


def _trl_model(cfg: ConfigFile, model: str | None) -> Part:
    """A TRL script's ModelConfig keys (use_peft, lora_r, load_in_4bit, ...) where the YAML has them."""
    use_peft, four, eight = (cfg.typed(k, bool) for k in ("use_peft", "load_in_4bit", "load_in_8bit"))
    if cfg.typed("use_dora", bool):
        raise cfg.error("use_dora", "DoRA is not modelled; tunecost estimates full, LoRA and QLoRA fine-tuning")
    if (four or eight) and not use_peft:
        key = "load_in_4bit" if four else "load_in_8bit"
        raise cfg.error(key, "quantized weights without LoRA (use_peft): tunecost estimates QLoRA")
    if not use_peft:
        return {"method": "full"}, ([f"method full (use_peft unset): {TRL_MODEL} default"] if use_peft is None else [])
    keys = ("lora_r", "lora_alpha", "lora_target_modules", "lora_target_parameters")
    out, notes = lora_options(cfg, keys, (16, 32, 0.05), TRL_MODEL, model)
    quant, more = qlora_options(cfg, ("bnb_4bit_quant_type", "use_bnb_nested_quant"), ("nf4", False), TRL_MODEL)
    if eight and not four:
        quant, more = int8_options(cfg, "load_in_8bit")
    return ({**out, **quant}, notes + more) if four or eight else ({**out, "method": "lora"}, notes)


def _trl_load_dtype(cfg: ConfigFile, out: dict[str, Any]) -> Part:
    """The dtype TRL loads the model in (ModelConfig.dtype, or model_init_kwargs' for SFTTrainer): float32 by
    default (trl/trainer/model_config.py, utils.py create_model_from_path), computed in bf16/fp16: fp32 parameters
    (`fp32_params`) where the layout keeps them (`fp32_strategies`); DeepSpeed casts its module to its dtype."""
    dtype = _trl_dtype(cfg)
    if dtype in ("bfloat16", "float16", "auto") or out.get("dtype") == "fp32" or cfg.data.get("deepspeed"):
        return {}, []
    said = "float32 stated" if dtype else "dtype unset: TRL's default float32"
    method = str(out.get("method"))
    if method in ("full", "lora") and out.get("strategy", "single") in fp32_strategies(method):
        return {"fp32_params": True}, [f"fp32_params: TRL loads the model in fp32 ({said}), trained under "
                                       f"{out.get('dtype', 'bf16')} autocast"]  # fmt: skip
    held = "weights, gradients and AdamW states" if out.get("method") == "full" else "frozen weights"
    return {}, [f"weights in {out.get('dtype', 'bf16')}: TRL loads the model in fp32 ({said}) under autocast, so "
                f"its {held} are fp32; tunecost simulates them in {out.get('dtype', 'bf16')}: their memory is "
                "under-estimated (2x for those; set dtype: bfloat16, or --dtype fp32 bounds it)"]  # fmt: skip


def _sft(cfg: ConfigFile) -> Part:
    """seq_len (max_length; max_seq_length before TRL 0.20), packing and loss_type of an SFTConfig."""
    length = cfg.typed("max_length", int)
    length = cfg.typed("max_seq_length", int) if length is None else length
    out: dict[str, Any] = {} if length is None else {"seq_len": length}
    notes: list[str] = []
    if length is None and "max_length" not in cfg.data:
        out["seq_len"] = 1024
        notes.append(f"seq_len 1024 (max_length): {SFT} default")
    if cfg.typed("packing", bool):
        strategy = cfg.typed("packing_strategy", str) or "bfd"
        wrapped = strategy == "wrapped"
        out["packing"] = "cross-document" if wrapped else "per-document"
        whose = "" if "packing_strategy" in cfg.data else f" ({SFT} default)"
        how = (
            "examples cut into max_length-token rows, one causal mask over each"
            if wrapped
            else "examples packed into max_length-token rows, attention within each under a flash-attention kernel "
            "(position ids)"
        )
        notes.append(f"packing {out['packing']}: packing_strategy {strategy}{whose}: {how}")
    loss_type, liger = cfg.typed("loss_type", str), cfg.typed("use_liger_kernel", bool)
    if loss_type == "chunked_nll" and liger:
        raise cfg.error("loss_type", f"chunked_nll with use_liger_kernel: {SFT} refuses the pair")
    if loss_type in (None, "chunked_nll") and not liger:
        out["chunked_loss"] = True
        default = "" if loss_type else f" ({SFT} default since TRL 1.7; before it nll: set loss_type nll there)"
        notes.append(f"loss_type chunked_nll{default}: the head and its loss per 256 tokens, checkpointed, no logits")
    if cfg.typed("activation_offloading", bool):
        out["offload_activations"] = True
        notes.append("activation_offloading: TRL's OffloadActivations over forward and loss (what they save, 1 KiB or "
                     "more, to host memory; the head's kept; TRL's is torchtune's ported)")  # fmt: skip
    return out, notes


def _dataset(cfg: ConfigFile) -> Part:
    """dataset_name (at dataset_train_split), else a mixture: TRL's `datasets` (DatasetMixtureConfig, each a `path`,
    its test_split_size held out) or the alignment handbook's `dataset_mixture.datasets` (each an `id` and a weight,
    src/alignment/configs.py and data.py). The first dataset gives the lengths; its queries are the mixture's."""
    key, mixture, source = "datasets", cfg.get("datasets"), cfg
    if not mixture:
        source = ConfigFile(path=f"{cfg.path}: dataset_mixture", data=_mapping(cfg, "dataset_mixture"))
        key, mixture = "dataset_mixture", source.get("datasets")
    listed = mixture if isinstance(mixture, list) else []
    entries = [d for d in listed if isinstance(d, dict) and isinstance(d.get("path") or d.get("id"), str)]
    name: str | None = cfg.typed("dataset_name", str)
    if not entries:  # trl/scripts/sft.py: `datasets` first, dataset_name ignored beside it
        split = cfg.typed("dataset_train_split", str)
        return config_dataset_option("dataset_name", name, split) if name is not None else ({}, [])
    parts = [_part(source, d, key) for d in entries]
    options, notes = config_dataset_option(key, parts[0][0], parts[0][1])
    if len(parts) > 1 or parts[0][2] != 1:
        options, line = mixture_option(key, parts, options)
        notes.insert(0, line)
    return options | eval_split_of(source, "test_split_size"), notes


def _part(source: ConfigFile, entry: dict, key: str) -> tuple[str, str | None, float]:
    """(dataset, split, weight) of a mixture entry: a handbook entry takes `int(len(ds) * weight)` rows of its split,
    TRL's have no weight."""
    split, weight = entry.get("split"), entry.get("weight") if key == "dataset_mixture" else None
    if weight is not None and (isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight <= 1):
        raise source.error("datasets", f"weight of {entry.get('id')} must be a share in (0, 1], got {weight!r}")
    return str(entry.get("path") or entry.get("id")), split if isinstance(split, str) else None, float(weight or 1)


def _read_training_args(cfg: ConfigFile) -> ConfigJob:
    if "beta" in cfg.data:  # DPOConfig, ORPOConfig, KTOConfig, CPOConfig, GRPOConfig: the preference / RL trainers'
        raise cfg.error("beta", "a preference or RL trainer's config (DPO, ORPO, KTO, GRPO): tunecost estimates "
                        "supervised fine-tuning (full, LoRA, QLoRA) only")  # fmt: skip
    cfg.check_keys(ARGS_KEYS)
    whose = SFT if any(k in cfg.data for k in {*SFT_KEYS, *TRL_MODEL_KEYS, *SCRIPT_KEYS}) else TA
    out: dict[str, Any] = {"stack": "hf-peft"}
    notes: list[str] = []
    if cfg.typed("model_name_or_path", str):
        out["model"] = cfg.data["model_name_or_path"]
    dataset, lines = _dataset(cfg)
    out, notes = out | dataset, notes + lines
    out |= steps_options(cfg, ("max_steps", "gradient_accumulation_steps"), whose, notes)
    for option, key, kind, default in (
        ("batch_size", "per_device_train_batch_size", int, 8),
        ("epochs", "num_train_epochs", (int, float), 3.0),
    ):
        value = cfg.typed(key, kind)
        if option == "epochs" and "max_steps" in out:
            continue  # max_steps > 0 replaces num_train_epochs
        out[option] = default if value is None else value
        notes += [f"{option} {default} ({key}): {whose} default"] if value is None else []
    optim = cfg.typed("optim", str)
    out |= optimizer_options(cfg, "optim", optim or "adamw_torch_fused")
    notes += [] if optim else [f"optimizer adamw (optim adamw_torch_fused with torch >= 2.8): {whose} default"]
    attn = cfg.typed("attn_implementation", str) or _mapping(cfg, "model_init_kwargs").get("attn_implementation")
    out["attention"] = attention_of(cfg, "attn_implementation", attn) if attn else "sdpa"
    notes += [] if attn else ["attention sdpa (attn_implementation unset): transformers' default"]
    parts = [_precision(cfg, whose), _checkpointing(cfg, whose), fsdp_options(cfg), compile_options(cfg, whose)]
    parts.append(liger_options(cfg, "use_liger_kernel"))
    if whose == SFT:
        parts.append(_trl_model(cfg, out.get("model")))
    else:
        notes.append("method: TrainingArguments do not say; give --method or the PEFT/BitsAndBytes files (--config)")
    for options, lines in [*parts, _sft(cfg)] if whose == SFT else parts:
        out.update(options)
        notes += lines
    if whose == SFT:
        amp, lines = _trl_load_dtype(cfg, out)
        out, notes = out | amp, notes + lines
    if cfg.get("deepspeed"):
        where = cfg.data["deepspeed"] if isinstance(cfg.data["deepspeed"], str) else "inline (save it as a JSON file)"
        notes.append(f"deepspeed config {where} (its ZeRO stage is the strategy): {PASS_DEEPSPEED}")
    return job(cfg, FRAMEWORK_TRAINING_ARGS.name, out, notes)


def detect_training_args(data: Mapping[str, Any]) -> bool:
    """per_device_train_batch_size with another TrainingArguments key, or a TRL script's model and data (`trl sft
    --config`'s example has no batch size); not LLaMA-Factory's, axolotl's or PEFT's."""
    others = ("stage", "finetuning_type", "base_model", "micro_batch_size", "peft_type", "distributed_type")
    ours = ("output_dir", "num_train_epochs", "learning_rate", "gradient_accumulation_steps")
    trainer = "per_device_train_batch_size" in data and any(k in data for k in ours)
    script = "model_name_or_path" in data and any(k in data for k in SCRIPT_KEYS)
    return (trainer or script) and not any(k in data for k in others)


FILES = (".json", ".yaml", ".yml")
FRAMEWORK_TRAINING_ARGS = Framework(
    name="hf-training-args",
    title="transformers TrainingArguments / TRL SFTConfig",
    suffixes=FILES,
    detect=detect_training_args,
    read=_read_training_args,
    model_parallel=("tp", "cp"),  # parallelism_config: accelerate's ParallelismConfig
    tp_shards_norms=False,
    tp_strategies=HF_TP_STRATEGIES,
)
FRAMEWORKS = (FRAMEWORK_TRAINING_ARGS,)
