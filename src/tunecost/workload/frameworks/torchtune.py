"""torchtune recipe configs (YAML for `tune run RECIPE --config FILE`) read as a tunecost job.

The model builder names the model and the method (`lora_`/`qlora_` prefixes). The recipe (single-device or
distributed) is named on the command line, so a multi-GPU layout is read only from the distributed recipes' keys.
"""

from __future__ import annotations

from typing import Any

from tunecost.workload.frameworks import (
    COMPILE_NOTE,
    SFT_ONLY,
    ConfigFile,
    ConfigJob,
    Framework,
    KnownKeys,
    steps_options,
)
from tunecost.workload.frameworks.model_parallel import catalog_shape, check_layout, own_attention, positive
from tunecost.workload.frameworks.nested import config_job, data_parallel_layout, nested_config, optimizer_name
from tunecost.workload.job import group_targets, targets_text
from tunecost.workload.known_datasets import catalog_dataset, mixture_option
from tunecost.workload.run_length import sliced_queries

# Defaults, pytorch/torchtune @ bd2a0fc7 (2026-04-23):
#   lora_rank 8, lora_alpha 16, lora_dropout 0.0, apply_lora_to_mlp/_output False, use_dora False
#                                                                                models/*/_model_builders.py
#   qlora_* = lora_* with quantize_base=True: torchao to_nf4 (64-weight blocks, int8 scalers per 256: double quant)
#   dtype required (cfg.dtype); null -> fp32                                       training/precision.py get_dtype
#   enable_activation_checkpointing/_offloading False, optimizer_in_bwd False, compile False, fsdp_cpu_offload
#   False, fsdp_reshard_after_forward True, data_parallel_shard_dim -1, data_parallel_replicate_dim 1,
#   tensor/context_parallel_dim 1                 recipes/{lora,full}_finetune_{single_device,distributed}.py
#   tensor_parallel_dim > 1: the full distributed recipe only, with a tensor_parallel_plan (the LoRA recipe
#   asserts 1); models/llama3/_parallelism.py (llama3, 3.1-3.3) and llama4's plans shard the norms along the
#   sequence (SequenceParallel); batches padded to a multiple of tp (x 2 x cp)   training/_distributed.py
#   tokenizer max_seq_len None (no truncation)                                      models/llama3/_model_builders.py
#   attention: torch SDPA (flex attention for packed data)                          modules/attention_utils.py
TITLE = "torchtune"
KEYS = KnownKeys(f"{TITLE}'s recipe configs", ("torchtune",))  # top-level keys; a component's arguments unchecked
# builder (without lora_/qlora_) -> hub id in tunecost's catalog (mistral_7b: vocab 32000, the configs' v0.1)
_MODEL_TABLE = """
    llama2_7b=meta-llama/Llama-2-7b-hf llama2_13b=meta-llama/Llama-2-13b-hf llama2_70b=meta-llama/Llama-2-70b-hf
    llama3_8b=meta-llama/Meta-Llama-3-8B llama3_70b=meta-llama/Meta-Llama-3-70B llama3_1_8b=meta-llama/Llama-3.1-8B
    llama3_1_70b=meta-llama/Llama-3.1-70B llama3_1_405b=meta-llama/Llama-3.1-405B llama3_2_1b=meta-llama/Llama-3.2-1B
    llama3_2_3b=meta-llama/Llama-3.2-3B llama3_3_70b=meta-llama/Llama-3.3-70B-Instruct
    mistral_7b=mistralai/Mistral-7B-v0.1 gemma_2b=google/gemma-2b gemma_7b=google/gemma-7b
    gemma2_2b=google/gemma-2-2b gemma2_9b=google/gemma-2-9b gemma2_27b=google/gemma-2-27b
    phi3_mini=microsoft/Phi-3-mini-4k-instruct phi4_14b=microsoft/phi-4 smollm2_135m=HuggingFaceTB/SmolLM2-135M
    qwen2_0_5b=Qwen/Qwen2-0.5B qwen2_1_5b=Qwen/Qwen2-1.5B qwen2_7b=Qwen/Qwen2-7B
    qwen2_5_0_5b=Qwen/Qwen2.5-0.5B qwen2_5_3b=Qwen/Qwen2.5-3B qwen3_32b=Qwen/Qwen3-32B
"""
MODELS: dict[str, str] = dict(pair.split("=") for pair in _MODEL_TABLE.split())
for _size in ("1_5b", "7b", "14b", "32b", "72b"):
    MODELS[f"qwen2_5_{_size}_base"] = f"Qwen/Qwen2.5-{_size.replace('_', '.').upper()}"
    MODELS[f"qwen2_5_{_size}_instruct"] = f"Qwen/Qwen2.5-{_size.replace('_', '.').upper()}-Instruct"
for _size in ("0_6b", "1_7b", "4b", "8b", "14b"):
    MODELS[f"qwen3_{_size}_base"] = f"Qwen/Qwen3-{_size.replace('_', '.').upper()}-Base"
    MODELS[f"qwen3_{_size}_instruct"] = f"Qwen/Qwen3-{_size.replace('_', '.').upper()}"
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "output_proj")
STAGE_KEYS = {
    "policy_model": "PPO",
    "reward_and_value_model": "PPO",
    "teacher_model": "knowledge distillation",
    "kd_loss": "knowledge distillation",
    "grpo_samples": "GRPO",
    "quantizer": "quantization-aware training",
}
# dataset builders and the hub dataset each loads by default (torchtune/datasets/_alpaca.py, _slimorca.py @ bd2a0fc7)
BUILDER_SOURCES = {
    "alpaca_dataset": "tatsu-lab/alpaca",
    "alpaca_cleaned_dataset": "yahma/alpaca-cleaned",
    "slimorca_dataset": "Open-Orca/SlimOrca-Dedup",
}
INFERENCE_KEYS = ("tasks", "prompt", "max_new_tokens", "quantizer")  # keys of the recipes that train nothing
PREFERENCE_DATASETS = ("stack_exchange_paired_dataset", "preference_dataset", "hh_rlhf_helpful_dataset")
LOSSES = {"CEWithChunkedOutputLoss": True, "LinearCrossEntropyLoss": True, "CrossEntropyLoss": False}
DP_KEYS = ("data_parallel_shard_dim", "data_parallel_replicate_dim", "fsdp_cpu_offload")  # shard, replicate, offload
TP_CP_KEYS = ("tensor_parallel_dim", "context_parallel_dim")
PLAN_KEYS = {"tp": "tensor_parallel_dim", "cp": "context_parallel_dim", "sequence_parallel": "tensor_parallel_dim"}
SEQUENCE_PARALLEL_PLANS = ("base_llama_tp_plan", "decoder_only_tp_plan")  # models/llama3, llama4 _parallelism.py
DISTRIBUTED_KEYS = (*DP_KEYS, *TP_CP_KEYS, "fsdp_reshard_after_forward", "custom_sharded_layers")


def _check_stage(flat: ConfigFile) -> None:
    trains = any(k == "optimizer" or k.startswith(("optimizer.", "loss")) for k in flat.data)
    used = next((k for k in INFERENCE_KEYS if k in flat.data), None)
    if used and not trains:  # eleuther_eval / generate / quantize recipes: no optimizer, no loss
        raise flat.error(used, f"an evaluation, generation or quantization config: nothing is trained; {SFT_ONLY}")
    for key, stage in STAGE_KEYS.items():
        if flat.data.get(key) is None and not any(k.startswith(f"{key}.") for k in flat.data):
            continue  # absent, or `quantizer: null`
        raise flat.error(key, f"{stage}: {SFT_ONLY}")
    loss = str(flat.get("loss._component_") or "")
    if any(word in loss.lower() for word in ("rlhf", "dpo", "ppo", "grpo", "simpo")):
        raise flat.error("loss._component_", f"{loss}: {SFT_ONLY}")
    datasets = flat.get("dataset")
    items = datasets if isinstance(datasets, list) else [flat.get("dataset._component_")]
    for item in items:
        name = str(item.get("_component_", "") if isinstance(item, dict) else item or "")
        if ".multimodal." in name or name.endswith("_cauldron_dataset"):
            raise flat.error("dataset._component_", f"{name}: a multimodal dataset; {SFT_ONLY} of text models")
        if name.rsplit(".", 1)[-1] in PREFERENCE_DATASETS or ".grpo." in name:
            raise flat.error("dataset._component_", f"{name}: preference/RL data; {SFT_ONLY}")


def _model(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> str:
    """The hub id and the method from the builder; LoRA options for lora_/qlora_ builders. Returns the method."""
    key = "model._component_"
    component = flat.typed(key, str)
    if component is None:
        raise flat.error(key, "missing: the model builder (e.g. torchtune.models.llama3_1.lora_llama3_1_8b)")
    builder = component.rsplit(".", 1)[-1]
    method = "qlora" if builder.startswith("qlora_") else "lora" if builder.startswith("lora_") else "full"
    base = builder.split("_", 1)[1] if method != "full" else builder
    if "vision" in base:
        raise flat.error(key, f"{component}: a vision model; {SFT_ONLY} of text models")
    if "reward" in base:
        raise flat.error(key, f"{component}: a reward model; {SFT_ONLY}")
    if base not in MODELS:
        raise flat.error(key, f"{component}: builder not known to tunecost; known: {', '.join(MODELS)}")
    options.update(model=MODELS[base], method=method)
    if method == "qlora":
        options.update(quant_type="nf4", double_quant=True)
        notes.append(f"nf4, double quantization: {TITLE}'s qlora_ builders use torchao's NF4 (int8 block scalers)")
    if method != "full":
        _lora(flat, options, notes)
    return method


def _lora(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> None:
    if flat.typed("model.use_dora", bool):
        raise flat.error("model.use_dora", "DoRA: tunecost estimates full, LoRA and QLoRA fine-tuning")
    options["lora_rank"] = flat.or_default("model.lora_rank", int, 8, notes, f"lora_rank 8: {TITLE}'s default")
    line = f"lora_alpha 16: {TITLE}'s default"
    options["lora_alpha"] = flat.or_default("model.lora_alpha", (int, float), 16, notes, line)
    line = f"lora_dropout 0: {TITLE}'s default"
    options["lora_dropout"] = flat.or_default("model.lora_dropout", (int, float), 0.0, notes, line)
    modules = flat.get("model.lora_attn_modules")
    if not isinstance(modules, list) or any(m not in ATTENTION_MODULES for m in modules):
        raise flat.error("model.lora_attn_modules", f"must be a list of {', '.join(ATTENTION_MODULES)}")
    names = {"o_proj" if m == "output_proj" else m for m in modules}  # torchtune's output_proj: transformers' o_proj
    groups = list(group_targets("attention", names))
    line = f"apply_lora_to_mlp false: {TITLE}'s default"
    if flat.or_default("model.apply_lora_to_mlp", bool, False, notes, line):
        groups.append("mlp")
    if flat.typed("model.apply_lora_to_output", bool):
        notes.append("apply_lora_to_output: LoRA on the output projection is not modelled")
    if not groups:
        raise flat.error("model.lora_attn_modules", "no LoRA target (empty, and apply_lora_to_mlp false)")
    options["lora_targets"] = targets_text(groups)


def _precision(flat: ConfigFile, method: str, options: dict[str, Any], notes: list[str]) -> None:
    """dtype and the recipe's memory options."""
    dtype = flat.typed("dtype", str)
    if dtype is None:
        notes.append(f"dtype fp32: {TITLE}'s get_dtype(None) (dtype null; its shipped configs set bf16)")
    elif dtype not in ("bf16", "fp32"):
        raise flat.error("dtype", f"{dtype!r}: {TITLE}'s recipes train in bf16 or fp32")
    options["dtype"] = dtype or "fp32"
    line = f"gradient_checkpointing off: {TITLE}'s default (enable_activation_checkpointing false)"
    checkpointing = flat.or_default("enable_activation_checkpointing", bool, False, notes, line)
    options["gradient_checkpointing"] = checkpointing
    _ac_mode(flat, method, options, notes)
    _fp8(flat, method, options, notes)
    options["offload_activations"] = flat.typed("enable_activation_offloading", bool)
    if method == "full":  # the LoRA recipes do not read optimizer_in_bwd
        options["optimizer_in_backward"] = flat.typed("optimizer_in_bwd", bool)
    if flat.typed("compile", bool):
        options["torch_compile"] = True
        notes.append(f"compile true: {TITLE} runs the step under torch.compile; {COMPILE_NOTE}")
    loss = flat.typed("loss._component_", str)
    if loss is not None:
        if loss.rsplit(".", 1)[-1] not in LOSSES:
            raise flat.error("loss._component_", f"{loss}: not known; known: {', '.join(LOSSES)}")
        options["chunked_loss"] = LOSSES[loss.rsplit(".", 1)[-1]]
        if loss.endswith("LinearCrossEntropyLoss"):  # chunks of 8 too, but only the tokens with labels projected
            notes.append(
                f"chunked_loss: {TITLE}'s LinearCrossEntropyLoss modelled as CEWithChunkedOutputLoss (all tokens)"
            )


STEPS_KEYS = ("max_steps_per_epoch", "gradient_accumulation_steps")


def _training(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> None:
    optimizer = flat.typed("optimizer._component_", str)
    options["optimizer"] = optimizer_name(flat, "optimizer._component_", optimizer) if optimizer else None
    options["fused_adamw"] = flat.typed("optimizer.fused", bool) if options["optimizer"] == "adamw" else None
    for key, option in (("batch_size", "batch_size"), ("epochs", "epochs"), ("tokenizer.max_seq_len", "seq_len")):
        options[option] = flat.typed(key, int)
    options |= steps_options(flat, STEPS_KEYS, TITLE, notes, option="max_steps_per_epoch")
    if options["seq_len"] is None:
        notes.append(f"tokenizer.max_seq_len unset: {TITLE} does not truncate (seq_len left to the data)")
    options["attention"], line = own_attention(TITLE, options.get("model"))
    notes.append(line)
    _data(flat, options, notes)


def _data(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> None:
    """One dataset builder, or a list of them, which the recipes concatenate (ConcatDataset): the first gives the
    lengths and the packing (a mix of packed and unpacked is torchtune's error), all the queries where the catalog
    counts each."""
    listed = flat.get("dataset")
    if not isinstance(listed, list):
        _dataset(flat, options, notes)
        return
    owns: list[dict[str, Any]] = []
    for i, entry in enumerate(listed):
        item = ConfigFile(path=f"{flat.path}: dataset[{i}]", data={"dataset": entry if isinstance(entry, dict) else {}})
        owns.append({})
        _dataset(nested_config(item), owns[-1], notes if i == 0 else [])
    first = owns[0] if owns else {}
    if len(owns) > 1:
        parts = [(str(own.get("dataset", "")), own.get("dataset_split"), 1.0) for own in owns]
        first, line = mixture_option("dataset", parts, first)
        notes.append(line)
    options |= first


def _dataset(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> None:
    component = flat.typed("dataset._component_", str)
    files = flat.get("dataset.data_files")
    if isinstance(files, str) and flat.get("dataset.source") in ("json", "csv", "parquet", "text"):
        options["dataset"] = files
    elif component:
        builder = component.rsplit(".", 1)[-1]
        source = flat.get("dataset.source") or BUILDER_SOURCES.get(builder)
        known = catalog_dataset(source) if isinstance(source, str) else None
        if known:
            options["dataset"] = known
            notes.append(f"dataset {known}: {TITLE}'s {builder} loads {source}")
        else:
            notes.append(f"dataset {builder}: {TITLE}'s builder, not read (give --dataset FILE)")
    split = flat.typed("dataset.split", str)
    if split and split.strip() != "train":
        try:
            sliced_queries(split, 0)
        except ValueError as e:
            raise flat.error("dataset.split", f"{split}: not a Hugging Face split spec ({e})") from None
        options["dataset_split"] = split.strip()
    if flat.typed("dataset.packed", bool):
        options["packing"] = "per-document"
        notes.append("packing per-document: dataset.packed packs examples into max_seq_len-token rows, attention "
                     "masked per document")  # fmt: skip


GPUS_UNSAID = f"GPUs: {TITLE}'s recipe and `tune run --nproc_per_node` are not in the file (give --gpus)"


def _layout(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> None:
    if not any(key in flat.data for key in DISTRIBUTED_KEYS):
        notes.append(GPUS_UNSAID)
        return
    tp, cp = (positive(flat, key, flat.typed(key, int)) for key in TP_CP_KEYS)
    options.update({k: v for k, v in (("tp", tp), ("cp", cp)) if v > 1})
    if tp > 1:
        _tensor_parallel(flat, options, notes)
    reshard = flat.typed("fsdp_reshard_after_forward", bool) is not False
    layout, lines = data_parallel_layout(flat, DP_KEYS, reshard=reshard, title=TITLE, inner=tp * cp)
    options.update(layout)
    notes.extend(lines)
    if layout.get("strategy", "single") != "single":
        notes.append(f"strategy {layout['strategy']}: {TITLE}'s distributed recipes shard with FSDP2")
    if tp * cp > 1:  # torchtune pads each batch to a multiple of the degrees: no sequence to check (seq_len 0)
        check_layout(flat, options, PLAN_KEYS, shape=catalog_shape(options["model"]), seq_len=0)


def _tensor_parallel(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> None:
    if options["method"] != "full":
        raise flat.error("tensor_parallel_dim", f"{TITLE}'s LoRA recipes refuse tensor parallelism (set it to 1)")
    plan = flat.typed("tensor_parallel_plan._component_", str)
    if plan is None:
        raise flat.error("tensor_parallel_plan", f"{TITLE} needs a tensor_parallel_plan with tensor_parallel_dim > 1")
    if plan.rsplit(".", 1)[-1] in SEQUENCE_PARALLEL_PLANS:
        options["sequence_parallel"] = True
        notes.append(
            f"sequence parallelism on: {TITLE}'s {plan.rsplit('.', 1)[-1]} shards the norms along the sequence"
        )
    else:
        options["sequence_parallel"] = False
        notes.append(f"sequence parallelism off: assumed for {plan}, not one of {TITLE}'s plans tunecost read")


def _ac_mode(flat: ConfigFile, method: str, options: dict[str, Any], notes: list[str]) -> None:
    """ac_mode / ac_option as recipes/full_finetune_distributed.py reads them: only with
    enable_activation_checkpointing false ("full": every layer; "selective" N: every Nth block, counted over the
    whole model; "none": none); beside it true, neither is applied. The LoRA recipes do not read them."""
    mode, option = flat.typed("ac_mode", str), flat.get("ac_option")
    if mode is None:
        return
    if method != "full":
        notes.append(f"ac_mode {mode}: not read by {TITLE}'s LoRA recipes (enable_activation_checkpointing is)")
        return
    notes.append(f"ac_mode {mode}: as {TITLE}'s full_finetune_distributed reads it (the single-device one does not)")
    if options["gradient_checkpointing"]:
        options["gradient_checkpointing"] = False
        notes.append(
            "enable_activation_checkpointing true beside ac_mode: the recipe applies neither, no checkpointing"
        )
        return
    if mode not in ("none", "full", "selective"):
        raise flat.error("ac_mode", f"{mode!r}: none, full or selective")
    option = str(option if mode == "selective" else 1)
    if not option.isdigit():
        raise flat.error("ac_option", f"{option!r}: a whole number (checkpoint every Nth layer)")
    every = int(option)
    options["gradient_checkpointing"] = mode != "none"
    if mode == "selective" and every > 1 and options.get("model") is not None:
        layers = catalog_shape(options["model"]).num_layers
        options["gradient_checkpointing"] = layers >= every
        options |= {"recompute_layers": layers // every} if layers >= every else {}
        notes.append(f"ac_option {every}: {layers // every} of the {layers} layers checkpointed (one in {every})")


def _fp8(flat: ConfigFile, method: str, options: dict[str, Any], notes: list[str]) -> None:
    """enable_fp8_training (full_finetune_distributed only): torchao Float8Linear on every linear but the output
    head, fp8_recipe_name's recipe (unset: tensorwise, training/quantization.py convert_to_float8_training)."""
    recipe = flat.typed("fp8_recipe_name", str)
    if not flat.typed("enable_fp8_training", bool):
        return
    if method != "full":
        notes.append(f"enable_fp8_training: not read by {TITLE}'s LoRA recipes (bf16 matmuls)")
        return
    if recipe not in (None, "tensorwise", "rowwise"):
        raise flat.error("fp8_recipe_name", f"{recipe!r}: tunecost models tensorwise and rowwise")
    options["fp8"] = recipe or "tensorwise"
    notes.append(f"fp8 {options['fp8']}: {TITLE}'s full_finetune_distributed converts the linears but the output head "
                 f"to torchao Float8Linear{'' if recipe else ' (fp8_recipe_name unset: tensorwise)'}")  # fmt: skip


def detect(data: Any) -> bool:
    return any(isinstance(v, dict) and str(v.get("_component_", "")).startswith("torchtune.") for v in data.values())


def read(cfg: ConfigFile) -> ConfigJob:
    flat = nested_config(cfg)
    flat.check_keys(KEYS)
    _check_stage(flat)
    options: dict[str, Any] = {"stack": "torchtune"}
    notes: list[str] = []
    method = _model(flat, options, notes)
    _precision(flat, method, options, notes)
    _training(flat, options, notes)
    _layout(flat, options, notes)
    return config_job(FRAMEWORK.name, flat, options, notes)


FRAMEWORK = Framework(
    name="torchtune",
    title=TITLE,
    suffixes=(".yaml", ".yml"),
    detect=detect,
    read=read,
    strategies=("fsdp2",),
    model_parallel=("tp", "cp"),  # tensor_parallel_dim, context_parallel_dim: no pipeline
    strategies_why=f"{TITLE}'s distributed recipes shard with FSDP2 (fully_shard)",
)
