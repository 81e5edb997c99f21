"""axolotl YAML (examples/*/lora.yml, qlora.yml, fft configs) as a tunecost job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tunecost.workload.frameworks import (
    LIGER_NOTE,
    SFT_ONLY,
    ConfigFile,
    ConfigJob,
    Framework,
    KnownKeys,
    hf_common,
    steps_options,
)
from tunecost.workload.frameworks.hf_common import (
    HF_TP_STRATEGIES,
    INT8,
    VISION_MODEL,
    compile_options,
    deepspeed_options,
    fp8_options,
    modules_to_save,
    optimizer_options,
    peft_targets,
)
from tunecost.workload.frameworks.model_parallel import config_expert_parallel, positive
from tunecost.workload.job import targets_text
from tunecost.workload.known_datasets import FILE_SUFFIXES, catalog_dataset, config_dataset_option, mixture_option

TITLE = "axolotl"
KEYS = KnownKeys(f"{TITLE}'s config", ("axolotl",))  # its pydantic schema and bundled plugins' args
# key: (default, option as tunecost reads it, how); read at axolotl-ai-cloud/axolotl 067b021c (v0.18.0-9, Jul 2026)
_DEFAULTS: dict[str, tuple[Any, str, str]] = {
    "sequence_len": (512, "seq_len 512", "sequence_len; utils/schemas/config.py"),
    "gradient_checkpointing": (False, "gradient_checkpointing off", "schemas/config.py"),
    "micro_batch_size": (1, "batch_size 1", "micro_batch_size; schemas/training.py"),
    "num_epochs": (1.0, "epochs 1.0", "num_epochs; schemas/training.py"),
    "optimizer": ("adamw_torch_fused", "optimizer adamw", "adamw_torch_fused; schemas/training.py"),
}  # fmt: skip
# bf16 auto (schemas/config.py): bf16 where the GPU has it, else fp16 (utils/config/__init__.py); QLoRA's
# BitsAndBytesConfig nf4 + double quant unless bnb_config_kwargs override (loaders/model.py); no lora_r/lora_alpha
# default (schemas/peft.py); use_reentrant true when checkpointing without kwargs (utils/config/__init__.py)
_BNB: dict[str, tuple[str, Any]] = {
    "bnb_4bit_quant_type": ("quant_type", "nf4"),
    "bnb_4bit_use_double_quant": ("double_quant", True),
}
_ATTENTION = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash", "flash_attention_3": "flash"}
# kernels that keep what FlashAttention-2 keeps for backward (the output and its log-sum-exp, no L x L scores):
# axolotl registers xformers with FA2's masks (monkeypatch/attention/__init__.py); transformers' flex_attention
_LIKE_FLASH = {"xformers": "xformers' memory_efficient_attention", "flex_attention": "torch's flex_attention"}
_LEGACY_ATTENTION = {  # schemas/enums.py LEGACY_ATTN_FLAG_TO_IMPL, in its order
    "xformers_attention": "xformers", "sage_attention": "sage", "flex_attention": "flex_attention",
    "flash_attention": "flash_attention_2", "sdp_attention": "sdpa", "eager_attention": "eager",
}  # fmt: skip
_NOT_SFT = {
    "rl": "RL / preference training", "reward_model": "reward model training",
    "process_reward_model": "reward model training", "pretraining_dataset": "pretraining",
    "kd_trainer": "knowledge distillation", "qat": "quantization-aware training",
}  # fmt: skip


def _get(cfg: ConfigFile, notes: list[str], key: str, kind: Any) -> Any:
    default, said, how = _DEFAULTS[key]
    return cfg.or_default(key, kind, default, notes, f"{said}: {TITLE}'s default ({how})")


def _method(cfg: ConfigFile, model: str | None, notes: list[str]) -> dict[str, Any]:
    for key, what in _NOT_SFT.items():
        if cfg.get(key):
            raise cfg.error(key, f"{what}: {SFT_ONLY}")
    if cfg.typed("peft_use_dora", bool):
        raise cfg.error("peft_use_dora", "DoRA is not modelled; tunecost estimates full, LoRA and QLoRA fine-tuning")
    adapter = cfg.typed("adapter", str)
    load4, load8 = cfg.typed("load_in_4bit", bool), cfg.typed("load_in_8bit", bool)
    if adapter is None:
        if load4 or load8:
            raise cfg.error("load_in_4bit" if load4 else "load_in_8bit", f"needs an adapter ({TITLE}'s own check)")
        notes.append(f"method full: {TITLE}'s default (no adapter)")
        return {"method": "full"}
    if adapter not in ("lora", "qlora"):
        raise cfg.error("adapter", f"{adapter}: tunecost estimates full, LoRA and QLoRA fine-tuning")
    options: dict[str, Any] = {"method": adapter}
    if load8 and adapter == "lora":  # loaders/model.py: BitsAndBytesConfig(load_in_8bit=True)
        options |= INT8
        notes.append("load_in_8bit with adapter lora: LLM.int8 base weights (--quant-type int8)")
    if adapter == "qlora":
        if not load4:
            raise cfg.error("adapter", f"qlora needs load_in_4bit: true ({TITLE}'s own check)")
        bnb = cfg.typed("bnb_config_kwargs", dict) or {}
        for key, (option, default) in _BNB.items():
            options[option], said = bnb.get(key, default), "on" if default is True else default
            notes += [] if key in bnb else [f"{option} {said}: {TITLE}'s default for qlora (loaders/model.py)"]
        if (kind := options["quant_type"]) not in ("nf4", "fp4"):
            raise cfg.error("bnb_config_kwargs", f"bnb_4bit_quant_type must be nf4 or fp4, got {kind!r}")
    elif cfg.typed("gptq", bool):
        options["method"] = "qlora"
        notes.append("gptq: a GPTQ 4-bit checkpoint, read as qlora (tunecost takes the 4-bit type from the model)")
    elif load4 and not load8:
        notes.append(f"load_in_4bit with adapter lora: {TITLE} quantizes only for adapter qlora; read as 16-bit LoRA")
    options["lora_dropout"] = cfg.typed("lora_dropout", (int, float)) or 0.0  # unset: no dropout module
    for key, option in (("lora_r", "lora_rank"), ("lora_alpha", "lora_alpha")):
        value = cfg.typed(key, int if key == "lora_r" else (int, float))
        if value is None:
            notes.append(f"{key} unset: {TITLE} has no default for it; tunecost's --{option.replace('_', '-')} applies")
        else:
            options[option] = value
    return options | _targets(cfg, model, notes) | modules_to_save(cfg, "lora_modules_to_save")


def _targets(cfg: ConfigFile, model: str | None, notes: list[str]) -> dict[str, Any]:
    entries: list[str] = []
    for key in ("lora_target_modules", "lora_target_parameters"):
        value = cfg.get(key)
        names = [value] if isinstance(value, str) else value or []
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise cfg.error(key, f"must be a module name or a list of them, got {value!r}")
        entries += names
    if cfg.typed("lora_target_linear", bool):
        entries.append("all-linear")
    if not entries:
        notes.append("no lora_target_modules or lora_target_linear: tunecost's default targets apply")
        return {}
    targets, target_notes = peft_targets(cfg, "LoRA targets", entries, model)
    notes += target_notes
    return {"lora_targets": targets_text(targets)}


def _fsdp_config(cfg: ConfigFile) -> dict[str, Any]:
    """fsdp_config with the deprecated fsdp_ prefix dropped, as axolotl reads it."""
    conf = cfg.typed("fsdp_config", dict) or {}
    return {(k if k == "fsdp_version" else k.removeprefix("fsdp_")): v for k, v in conf.items()}


def _precision(cfg: ConfigFile, notes: list[str]) -> dict[str, Any]:
    """utils/config/__init__.py resolve_dtype: bf16 (or bfloat16, half weights without AMP) first, then fp16 (or
    float16), else fp32; bf16 auto is bf16 where the GPU has it unless fp16 is set."""
    bf16, fp16 = cfg.typed("bf16", (bool, str), "auto"), cfg.typed("fp16", bool)
    pure_bf16, pure_fp16 = cfg.typed("bfloat16", bool), cfg.typed("float16", bool)
    if isinstance(bf16, str) and bf16 != "auto":
        raise cfg.error("bf16", f"must be true, false or auto, got {bf16!r}")
    if bf16 is True or pure_bf16 or (bf16 == "auto" and not fp16):
        if bf16 == "auto" and not pure_bf16:
            notes.append(f"dtype bf16: {TITLE}'s default bf16 auto (bf16 where the GPU has it, else fp16)")
        return {"dtype": "bf16"}
    if pure_fp16 and not fp16:
        notes.append("dtype fp16: float16 true loads the weights in fp16 (no mixed precision)")
    elif not fp16:
        notes.append(f"dtype fp32: {TITLE} trains in float32 with bf16 false and fp16 unset")
    return {"dtype": "fp16" if fp16 or pure_fp16 else "fp32"}


def _training(cfg: ConfigFile, notes: list[str]) -> dict[str, Any]:
    options = _precision(cfg, notes)
    key, impl = "attn_implementation", cfg.typed("attn_implementation", str)
    for legacy, name in _LEGACY_ATTENTION.items():
        if impl is None and cfg.typed(legacy, bool):
            key, impl = legacy, name
    if impl is None:
        notes.append(f"attention sdpa: {TITLE}'s default (no attn_implementation: transformers' default, sdpa)")
    attention = "sdpa" if impl is None else _ATTENTION.get(impl, "flash" if "flash" in impl else None)
    if impl in _LIKE_FLASH:
        attention = "flash"
        notes.append(f"attention flash: {key} {impl}: {_LIKE_FLASH[impl]} keeps for backward what FlashAttention-2 "
                     "keeps; its kernels' speed is taken as FlashAttention-2's")  # fmt: skip
    if attention is None:
        raise cfg.error(key, f"{impl}: tunecost models eager, sdpa and flash_attention_2/3")
    checkpointing = cfg.typed("gradient_checkpointing", (bool, str))
    if checkpointing is None and _fsdp_config(cfg).get("activation_checkpointing"):
        checkpointing = True
        notes.append("fsdp_config activation_checkpointing: accelerate's FSDP checkpointing (non-reentrant)")
        options["reentrant"] = False
    elif checkpointing is None:
        checkpointing = _get(cfg, notes, "gradient_checkpointing", bool)
    elif isinstance(checkpointing, str):
        if checkpointing not in ("offload", "offload_disk"):
            raise cfg.error("gradient_checkpointing", f"must be true, false, offload or offload_disk, "
                            f"got {checkpointing!r}")  # fmt: skip
        notes.append(f"gradient_checkpointing {checkpointing}: modelled as checkpointing with the checkpoints on "
                     "the GPU")  # fmt: skip
    kwargs = cfg.typed("gradient_checkpointing_kwargs", dict)
    if checkpointing and kwargs is None and "reentrant" not in options:
        options["reentrant"] = True
        notes.append(f"reentrant on: {TITLE}'s default with gradient_checkpointing (no gradient_checkpointing_kwargs)")
    elif checkpointing and kwargs and "use_reentrant" in kwargs:
        options["reentrant"] = bool(kwargs["use_reentrant"])
    options |= {
        "attention": attention,
        "gradient_checkpointing": bool(checkpointing),
        **optimizer_options(cfg, "optimizer", _get(cfg, notes, "optimizer", str)),
        "seq_len": _get(cfg, notes, "sequence_len", int),
        "batch_size": _get(cfg, notes, "micro_batch_size", int),
    }
    options |= steps_options(cfg, ("max_steps", "gradient_accumulation_steps"), TITLE, notes)
    if (batch := cfg.typed("batch_size", int)) is not None and "grad_accum" not in options:  # normalize_config
        if batch < options["batch_size"]:
            raise cfg.error("batch_size", f"{batch} is less than micro_batch_size {options['batch_size']}")
        options["grad_accum"] = batch // options["batch_size"]
    if "max_steps" in options:
        cfg.typed("num_epochs", (int, float))
        return options
    return options | {"epochs": _get(cfg, notes, "num_epochs", (int, float))}


def _dataset(cfg: ConfigFile, notes: list[str]) -> dict[str, Any]:
    datasets = cfg.typed("datasets", list) or []
    if not datasets:
        return {}
    first = datasets[0] if isinstance(datasets[0], dict) else {}
    path = first.get("data_files") if isinstance(first.get("data_files"), str) else first.get("path")
    if not isinstance(path, str):
        raise cfg.error("datasets", f"each entry needs a path, got {datasets[0]!r}")
    entries = [d if isinstance(d, dict) else {} for d in datasets]
    parts = [(str(d.get("path")), d["split"] if isinstance(d.get("split"), str) else None, 1.0) for d in entries]
    local = path.lower().endswith(FILE_SUFFIXES) and not catalog_dataset(path)  # a file: its own data
    option, lines = ({"dataset": path}, []) if local else config_dataset_option("datasets[0].path", path, parts[0][1])
    if len(parts) > 1:  # utils/data/shared.py merge_datasets: concatenated
        option, line = mixture_option("datasets", parts, option)
        notes.append(line)
    notes += lines
    return option


def _model_parallel(cfg: ConfigFile, notes: list[str]) -> dict[str, Any]:
    """context_parallel_size (sequence_parallel_degree before it) and tensor_parallel_size (transformers' tp_plan
    under FSDP, DeepSpeed AutoTP under DeepSpeed: neither shards the norms, so no sequence parallelism)."""
    options: dict[str, Any] = {}
    cp = cfg.typed("context_parallel_size", int) or cfg.typed("sequence_parallel_degree", int)
    if cp and cp > 1:
        options["cp"] = cp
        notes.append(f"cp {cp}: context_parallel_size splits each sequence over {cp} ranks (ring-flash-attn); "
                     "modelled as tunecost's context parallelism (docs/multi-gpu.md)")  # fmt: skip
    tp = cfg.typed("tensor_parallel_size", int)
    if tp and tp > 1:
        options.update(tp=tp, sequence_parallel=False)
        how = "DeepSpeed AutoTP" if cfg.data.get("deepspeed") else "transformers' tp_plan (loaders/model.py tp_size)"
        notes.append(f"tp {tp}: tensor_parallel_size, {how}; sequence parallelism off (the norms are not sharded)")
    return options


def _expert_parallel(cfg: ConfigFile, options: dict[str, Any], notes: list[str]) -> bool:
    """expert_parallel_size (integrations/expert_parallel/plugin.py): the routed experts split over its ranks, the
    GPUs ep x dp_shard_size x cp (the plugin's product); under FSDP2 the experts shard over dp_shard and the other
    weights over every rank, as tunecost's EP does; alone, the rest is replicated (DDP). False where EP is off."""
    ep, key = cfg.typed("expert_parallel_size", int), "expert_parallel_size"
    if ep is None or ep == 1:
        return False
    if options.get("tp", 1) > 1 or (cfg.typed("dp_replicate_size", int) or 1) > 1:
        raise cfg.error(key, f"{ep} beside tensor_parallel_size or dp_replicate_size: {TITLE}'s plugin composes "
                        "expert parallelism with dp_shard_size and context_parallel_size only")  # fmt: skip
    shard = positive(cfg, "dp_shard_size", cfg.typed("dp_shard_size", int))
    options["num_gpus"] = ep * shard * options.get("cp", 1)
    config_expert_parallel(cfg, options, key, None, etp_default=None)
    strategy = options.setdefault("strategy", "ddp")  # dp_shard_size needs fsdp_config
    if strategy not in ("ddp", "fsdp2") or (strategy == "ddp" and shard > 1):
        raise cfg.error(key, f"{ep} under {strategy} with dp_shard_size {shard}: {TITLE}'s plugin runs expert "
                        "parallelism alone or beside FSDP2 (fsdp_version 2) over dp_shard_size")  # fmt: skip
    notes.append(f"GPUs {options['num_gpus']}: expert_parallel_size x dp_shard_size x cp, {strategy} beside {TITLE}'s "
                 "expert parallelism (the experts split over its ranks)")  # fmt: skip
    return True


def _data_parallel(cfg: ConfigFile, options: dict[str, Any], notes: list[str]) -> None:
    """dp_shard_size and dp_replicate_size (accelerate's ParallelismConfig, utils/distributed.py
    _get_parallel_config_kwargs): both fix the GPUs; under FSDP, shard groups of more than one GPU replicated over
    the others are HSDP (tunecost's HSDP shards within a node), replicas of one GPU are DDP."""
    if _expert_parallel(cfg, options, notes):
        return
    shard, replicate = cfg.typed("dp_shard_size", int), cfg.typed("dp_replicate_size", int)
    for key, size in (("dp_shard_size", shard), ("dp_replicate_size", replicate)):
        positive(cfg, key, size)
    inner = options.get("tp", 1) * options.get("cp", 1)
    if shard is not None and replicate is not None:
        options["num_gpus"] = shard * replicate * inner
        notes.append(f"GPUs {options['num_gpus']}: dp_shard_size x dp_replicate_size x tp x cp")
    elif shard is not None and shard > 1:  # replicas only on the GPUs beyond one shard group
        options["num_gpus"] = shard * inner
        notes.append(f"GPUs {shard * inner}: dp_shard_size x tp x cp, one shard group ({TITLE} replicates it over "
                     "any GPUs beyond: --gpus)")  # fmt: skip
        return
    if options.get("strategy") not in ("fsdp1", "fsdp2") or (shard or 1) * (replicate or 1) == 1 or replicate == 1:
        return  # FSDP over every data-parallel GPU
    if shard == 1:
        options["strategy"] = "ddp"
    elif shard is not None:
        options.update(strategy="hsdp", gpus_per_node=shard * inner)
        notes.append(f"gpus_per_node {shard * inner}: each shard group (dp_shard_size x tp x cp) is one node; "
                     f"{TITLE} replicates over the others")  # fmt: skip
    else:
        options["strategy"] = "hsdp"
        notes.append(f"dp_replicate_size {replicate}: {TITLE} shards over the GPUs each replica leaves (HSDP; "
                     "--gpus-per-node sets the shard group)")  # fmt: skip


def _strategy(cfg: ConfigFile, notes: list[str]) -> dict[str, Any]:
    options, ds_notes = deepspeed_options(cfg, "deepspeed")
    notes += ds_notes
    options |= _model_parallel(cfg, notes)
    fsdp, conf = cfg.get("fsdp"), _fsdp_config(cfg)
    if not fsdp and not conf:
        _data_parallel(cfg, options, notes)
        return options
    words = fsdp if isinstance(fsdp, list) else str(fsdp or "").split()
    version = cfg.typed("fsdp_version", int) or conf.get("fsdp_version") or conf.get("version")
    if version is None:
        version = 1
        notes.append(f"fsdp_version 1: {TITLE}'s default for a config without one (utils/schemas/validation.py)")
    strategy = "fsdp2" if str(version) == "2" else "fsdp1"
    if "hybrid_shard" in words or "hybrid_shard_zero2" in words:
        strategy = "hsdp"
    elif "shard_grad_op" in words:
        strategy = "fsdp2-shard-grad-op"
        notes.append("fsdp shard_grad_op: modelled as fsdp2-shard-grad-op (parameters whole from forward to backward)")
    elif "no_shard" in words:
        strategy = "ddp"
    options["strategy"] = strategy
    if conf.get("offload_params") or "offload" in words:
        options["offload"] = "params"
    _data_parallel(cfg, options, notes)
    return options


LIGER_KEYS = {"rope": "liger_rope", "rms_norm": "liger_rms_norm", "swiglu": "liger_glu_activation",
              "fused_linear_cross_entropy": "liger_fused_linear_cross_entropy"}  # fmt: skip


def _liger(cfg: ConfigFile) -> tuple[dict[str, Any], list[str]]:
    """axolotl's Liger plugin (axolotl.integrations.liger) with the liger_* keys: modelled when they ask for the
    default kernel set (rms_norm, glu_activation and fused_linear_cross_entropy on; rope either way); another set
    stays among the keys not modelled and the step is counted without Liger."""
    plugins = cfg.data.get("plugins")
    if not isinstance(plugins, list) or not any(str(p).startswith("axolotl.integrations.liger") for p in plugins):
        return {}, []
    asked = {kernel: bool(cfg.data.get(key)) for kernel, key in LIGER_KEYS.items()}
    if cfg.data.get("liger_cross_entropy") or not all(on for kernel, on in asked.items() if kernel != "rope"):
        said = ", ".join(f"{LIGER_KEYS[k]} {v}" for k, v in asked.items())
        return {}, [f"Liger plugin with {said}: only Liger's default kernels are modelled; counted without Liger"]
    for key in LIGER_KEYS.values():
        cfg.get(key)
    cfg.get("liger_cross_entropy")
    return {"liger_kernel": True}, [f"Liger plugin: {LIGER_NOTE}"]


def _ignored_keys(cfg: ConfigFile) -> list[str]:
    """A note per key axolotl's schema lacks (unless a plugin from outside axolotl, which may add keys, is loaded):
    its pydantic model drops unknown keys, so axolotl runs without them (a misspelt key's default applies), and so
    does tunecost."""
    plugins = cfg.data.get("plugins")
    outside = (
        [p for p in plugins if not str(p).startswith("axolotl.integrations.")] if isinstance(plugins, list) else []
    )
    notes = []
    for key in [] if outside else list(cfg.data):
        unknown = KEYS.unknown(str(key))
        if unknown is not None:
            cfg.used.add(key)
            notes.append(f"{key}: {KEYS.not_a_key(unknown)}; ignored, as {TITLE} ignores it (its schema drops it)")
    return notes


def _read(cfg: ConfigFile) -> ConfigJob:
    notes: list[str] = _ignored_keys(cfg)
    model = cfg.typed("base_model", str)
    if "processor_type" in cfg.data or (model and VISION_MODEL.search(model)):
        raise cfg.error("processor_type" if "processor_type" in cfg.data else "base_model", f"multimodal: {SFT_ONLY}")
    if cfg.data.get("unfrozen_parameters"):  # train.py freezes every parameter but these patterns
        raise cfg.error("unfrozen_parameters", "training a subset of the weights is not modelled (full, lora, qlora)")
    options: dict[str, Any] = {"model": model} if model else {}
    options |= _method(cfg, model, notes) | _training(cfg, notes) | _dataset(cfg, notes) | _strategy(cfg, notes)
    options |= hf_common.eval_split_of(cfg, "val_set_size")  # utils/data: train_test_split(test_size=val_set_size)
    if cfg.typed("sample_packing", bool):
        options["packing"] = "per-document"
        notes.append("packing per-document: sample_packing packs examples into sequence_len-token rows, attention "
                     "within each (multipack's position ids / block masks)")  # fmt: skip
        cfg.typed("pad_to_sequence_len", bool)  # packed rows are sequence_len tokens either way
    elif cfg.data.get("pad_to_sequence_len"):  # left among the keys not modelled
        notes.append("pad_to_sequence_len: not modelled; tunecost pads each batch to its longest example (rows of "
                     "sequence_len tokens: give --seq-len without --dataset for that)")  # fmt: skip
    else:
        cfg.typed("pad_to_sequence_len", bool)  # false: each batch padded to its longest, as modelled
    compiled, compile_notes = compile_options(cfg, TITLE)
    liger, liger_notes = _liger(cfg)
    # fp8: accelerate with AORecipeKwargs(Float8LinearConfig()), torchao's tensorwise default (core/trainers/base.py)
    fp8, fp8_notes = fp8_options(cfg, "fp8", "ao", "tensorwise", f"{TITLE}'s") if cfg.typed("fp8", bool) else ({}, [])
    options |= compiled | liger | fp8 | {"stack": "hf-peft"}
    notes += [*compile_notes, *liger_notes, *fp8_notes, f"stack hf-peft: {TITLE} runs transformers + PEFT"]
    return ConfigJob(framework="axolotl", path=cfg.path, options=options, assumptions=tuple(notes),
                     not_modelled=cfg.unused_keys())  # fmt: skip


def _detect(data: Mapping[str, Any]) -> bool:
    keys = ("datasets", "micro_batch_size", "sequence_len", "adapter", "num_epochs", "lora_r")
    return "base_model" in data and any(k in data for k in keys)


# model_parallel: tensor_parallel_size (transformers' tp_plan, DeepSpeed AutoTP) and context_parallel_size
FRAMEWORK = Framework(name="axolotl", title=TITLE, suffixes=(".yaml", ".yml"), detect=_detect, read=_read,
                      model_parallel=("tp", "cp"), tp_shards_norms=False, tp_strategies=HF_TP_STRATEGIES)  # fmt: skip
