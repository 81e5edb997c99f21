"""litgpt fine-tuning configs (YAML for `litgpt finetune_lora|finetune_full --config FILE`) read as a tunecost job.

The command is not in the file: lora_* keys or quantize mean `finetune_lora`, neither `finetune_full`. litgpt runs its
own model code; tunecost simulates the model with transformers' (stack "tunecost").
"""

from __future__ import annotations

from typing import Any

from tunecost.models.catalog import catalog_model
from tunecost.models.families import FUSED_QKV_FAMILIES
from tunecost.models.projections import PROJECTIONS
from tunecost.workload.frameworks import SFT_ONLY, ConfigFile, ConfigJob, Framework, KnownKeys, accumulation_of
from tunecost.workload.frameworks.model_parallel import own_attention
from tunecost.workload.frameworks.nested import config_job, nested_config, optimizer_name
from tunecost.workload.job import group_targets, targets_text
from tunecost.workload.parallel import config_node_size

# Defaults, Lightning-AI/litgpt @ 26857050 (2026-06-29), litgpt/finetune/lora.py and full.py setup():
#   precision None -> utils.get_default_supported_precision(training=True): "bf16-mixed" ("16-mixed" without bf16)
#   quantize None; devices 1, num_nodes 1; optimizer "AdamW" (torch.optim; under bnb quantize utils.
#   instantiate_bnb_optimizer: bitsandbytes PagedAdamW); data None -> litgpt.data.Alpaca
#   lora_r 8, lora_alpha 16, lora_dropout 0.05, lora_query True, lora_value True, lora_key/projection/mlp/head False
#   train: TrainArgs(micro_batch_size=1, epochs=5, max_seq_length=None: no truncation), the signature's instance
#   whose fields are jsonargparse's defaults (jsonargparse @ 5559c81 _signatures.py: set_defaults from it)
#   one device: strategy "auto", no activation checkpointing; several: lora ModelParallelStrategy (FSDP2
#   fully_shard, checkpoint_wrapper per block), full FSDPStrategy (FSDP1 FULL_SHARD, activation_checkpointing_policy)
#   attention: litgpt/model.py CausalSelfAttention calls torch's F.scaled_dot_product_attention
TITLE = "litgpt"
KEYS = KnownKeys(f"{TITLE}'s config", ("litgpt",))  # setup() parameters; train/eval/log fields
PRECISIONS = {"bf16-true": "bf16", "bf16-mixed": "bf16", "bf16": "bf16", "16-true": "fp16", "16-mixed": "fp16"}
PRECISIONS.update({"16": "fp16", "32-true": "fp32", "32": "fp32"})
QUANTIZE = {
    "bnb.nf4": ("nf4", False),
    "bnb.nf4-dq": ("nf4", True),
    "bnb.fp4": ("fp4", False),
    "bnb.fp4-dq": ("fp4", True),
}
ATTENTION_FLAGS = ("lora_query", "lora_key", "lora_value", "lora_projection")
LORA_FLAGS = {"lora_query": True, "lora_key": False, "lora_value": True, "lora_projection": False, "lora_mlp": False}
LORA_FLAGS["lora_head"] = False
PRETRAIN_KEYS = ("model_name", "model_config", "initial_checkpoint_dir", "tokenizer_dir")


def _model(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> str:
    """The hub id from checkpoint_dir, and the method. Returns the method."""
    for key in PRETRAIN_KEYS:
        if key in flat.data:
            raise flat.error(key, f"a `litgpt pretrain` config: {SFT_ONLY}")
    path = flat.typed("checkpoint_dir", str)
    if not path:
        raise flat.error("checkpoint_dir", "missing: the base model's checkpoint folder (checkpoints/ORG/NAME)")
    parts = [p for p in path.strip("/").split("/") if p not in ("", ".")]
    options["model"] = "/".join(parts[-2:])
    notes.append(f"model {options['model']}: checkpoint_dir's last two folders ({TITLE} download's ORG/NAME)")
    quantize = flat.typed("quantize", str)
    if quantize == "bnb.int8-training":
        raise flat.error(
            "quantize", "bnb.int8-training keeps 16-bit weights beside the int8 codes (has_fp16_weights): not modelled"
        )
    if quantize is not None and quantize not in QUANTIZE:
        raise flat.error("quantize", f"{quantize!r}: one of {', '.join(QUANTIZE)} (bitsandbytes 4-bit)")
    lora = quantize is not None or any(k.startswith("lora_") for k in flat.data)
    method = "full" if not lora else "qlora" if quantize else "lora"
    options["method"] = method
    command = "finetune_lora" if lora else "finetune_full"
    notes.append(f"method {method}: read as `{TITLE} {command}` (the command is not in the file)")
    if quantize:
        options["quant_type"], options["double_quant"] = QUANTIZE[quantize]
    if lora:
        _lora(flat, options, notes)
    return method


def _lora(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> None:
    options["lora_rank"] = flat.or_default("lora_r", int, 8, notes, f"lora_rank 8: {TITLE}'s default")
    line = f"lora_alpha 16: {TITLE}'s default"
    options["lora_alpha"] = flat.or_default("lora_alpha", (int, float), 16, notes, line)
    line = f"lora_dropout 0.05: {TITLE}'s default"
    options["lora_dropout"] = flat.or_default("lora_dropout", (int, float), 0.05, notes, line)
    flags = {key: flat.typed(key, bool) for key in LORA_FLAGS}
    defaulted = [f"{key} {str(LORA_FLAGS[key]).lower()}" for key, value in flags.items() if value is None]
    if defaulted:
        notes.append(f"{', '.join(defaulted)}: {TITLE}'s defaults")
    flags = {key: LORA_FLAGS[key] if value is None else value for key, value in flags.items()}
    # lora_query/key/value/projection: q, k, v and o (litgpt's fused qkv is adapted per part, as separate q, k, v)
    attention = {name for key, name in zip(ATTENTION_FLAGS, PROJECTIONS["attention"]) if flags[key]}
    spec = catalog_model(options["model"])
    if attention - {"o_proj"} and spec is not None and spec.family in FUSED_QKV_FAMILIES:
        attention = set(PROJECTIONS["attention"])
        fused = f"{spec.name}'s transformers attention fuses q, k and v into one linear"
        notes.append(f"lora_query/key/value: {fused}; priced as LoRA on its whole attention ({TITLE} adapts parts)")
    groups = [*group_targets("attention", attention)] + ["mlp"] * flags["lora_mlp"]
    if flags["lora_head"]:
        notes.append("lora_head: LoRA on the output head is not modelled")
    if not groups:
        raise flat.error("lora_query", "no LoRA target (lora_query/key/value/projection/mlp all false)")
    options["lora_targets"] = targets_text(groups)


def _precision(flat: ConfigFile, method: str, options: dict[str, Any], notes: list[str]) -> None:
    precision = flat.typed("precision", str)
    if precision is None and method == "qlora":
        raise flat.error("precision", f"unset: {TITLE}'s default bf16-mixed is refused with quantize (set bf16-true)")
    if precision is None:
        notes.append(f"dtype bf16: {TITLE}'s default precision bf16-mixed (16-mixed on a GPU without bf16)")
        precision = "bf16-mixed"
    if precision not in PRECISIONS:
        raise flat.error("precision", f"{precision!r}: one of {', '.join(PRECISIONS)}")
    if method == "qlora" and precision not in ("bf16-true", "16-true", "32-true"):
        raise flat.error("precision", f"{precision!r}: {TITLE} takes bf16-true, 16-true or 32-true with quantize")
    options["dtype"] = PRECISIONS[precision]
    if precision in ("bf16-mixed", "bf16", "16-mixed", "16") and method in ("full", "lora"):
        options["fp32_params"] = True  # one device; `_layout` takes it back under FSDP
        notes.append(f"fp32_params: precision {precision}: {TITLE} keeps fp32 weights under 16-bit autocast")
    elif precision in ("bf16-mixed", "bf16", "16-mixed", "16"):
        notes.append(_MIXED.format(precision=precision))


_MIXED = (
    f"precision {{precision}}: {TITLE} keeps fp32 weights (16-bit autocast); tunecost simulates 16-bit weights, "
    "gradients and optimizer states (memory under-estimated; --dtype fp32 bounds it)"
)


def _sharded_mixed(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> None:
    """Several devices shard litgpt's fp32 weights (FSDP): not torch AMP over whole fp32 parameters."""
    if options.pop("fp32_params", False):
        index = next(i for i, n in enumerate(notes) if n.startswith("fp32_params: precision "))
        notes[index] = _MIXED.format(precision=flat.typed("precision", str) or "bf16-mixed")  # `_precision`'s


def _layout(flat: ConfigFile, method: str, options: dict[str, Any], notes: list[str]) -> None:
    devices = flat.get("devices", 1)
    if "devices" not in flat.data:
        notes.append(f"devices 1: {TITLE}'s default")
    nodes = flat.or_default("num_nodes", int, 1, notes, f"num_nodes 1: {TITLE}'s default")
    if devices in ("auto", -1, "-1"):
        notes.append(f"devices {devices}: every visible GPU, not in the file (give --gpus); {TITLE} shards on several")
        _sharded_mixed(flat, options, notes)
        return
    if isinstance(devices, bool) or not isinstance(devices, (int, str)) or not str(devices).isdigit():
        raise flat.error("devices", f"must be a whole number or 'auto', got {devices!r}")
    num_gpus = int(devices) * nodes
    options["num_gpus"] = num_gpus
    options["gradient_checkpointing"] = num_gpus > 1
    if num_gpus == 1:
        notes.append(f"gradient_checkpointing off: {TITLE} fine-tunes on one device without activation checkpointing")
        return
    if method == "qlora":
        raise flat.error("quantize", f"{TITLE} quantizes on one device only (devices 1, num_nodes 1)")
    _sharded_mixed(flat, options, notes)
    options["strategy"] = "fsdp2" if method == "lora" else "fsdp1"
    options.update(config_node_size(int(devices), nodes))
    how = "ModelParallelStrategy (FSDP2)" if method == "lora" else "FSDPStrategy (FSDP1 full shard)"
    notes.append(f"strategy {options['strategy']}, gradient_checkpointing on: {TITLE}'s {how} on several devices")


def _training(flat: ConfigFile, method: str, options: dict[str, Any], notes: list[str]) -> None:
    line = f"batch_size 1: {TITLE}'s default train.micro_batch_size"
    options["batch_size"] = flat.or_default("train.micro_batch_size", int, 1, notes, line)
    options["epochs"] = flat.or_default("train.epochs", int, 5, notes, f"epochs 5: {TITLE}'s default")
    _steps(flat, options, notes)
    options["seq_len"] = flat.typed("train.max_seq_length", int)
    if options["seq_len"] is None:
        notes.append(f"train.max_seq_length unset: {TITLE} does not truncate (seq_len left to the data)")
    path = flat.typed("optimizer.class_path", str) or flat.typed("optimizer", str)
    if path is None:
        notes.append(f"optimizer adamw: {TITLE}'s default AdamW")
    key = "optimizer.class_path" if "optimizer.class_path" in flat.data else "optimizer"
    options["optimizer"] = optimizer_name(flat, key, path or "AdamW")
    if method == "qlora":
        if options["optimizer"] != "adamw":
            raise flat.error(key, f"{path}: {TITLE} takes only AdamW with quantize")
        notes.append(f"optimizer adamw: {TITLE} runs bitsandbytes' PagedAdamW under quantize (paging not modelled)")
    options["attention"], line = own_attention(TITLE, options.get("model"))
    notes.append(line)
    data = flat.typed("data.class_path", str) or flat.typed("data", str)
    if data is None:
        notes.append(f"data Alpaca: {TITLE}'s default, not read (give --dataset FILE)")
    elif (json_path := flat.typed("data.init_args.json_path", str)) is not None:
        options["dataset"] = json_path
    else:
        notes.append(f"data {data.rsplit('.', 1)[-1]}: {TITLE}'s data module, not read (give --dataset FILE)")


def _steps(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> None:
    """train.global_batch_size: each optimizer step's queries over every rank (the accumulation, and the run's
    queries in steps); train.max_steps: the run stops at it or at train.epochs, whichever comes first."""
    line = f"global batch 16: {TITLE}'s default train.global_batch_size"
    options["queries_per_step"] = flat.or_default("train.global_batch_size", int, 16, notes, line)
    steps = flat.typed("train.max_steps", int)
    if steps is None or steps <= 0:
        return
    options["max_steps"] = steps
    notes.append(f"run length: train.max_steps {steps} optimizer steps or train.epochs, whichever ends first")


def detect(data: Any) -> bool:
    if "checkpoint_dir" in data:
        return any(k in data for k in ("precision", "devices", "out_dir", "train", "lora_r", "quantize"))
    return "model_name" in data and ("tokenizer_dir" in data or "initial_checkpoint_dir" in data)  # pretraining


def read(cfg: ConfigFile) -> ConfigJob:
    flat = nested_config(cfg)
    flat.check_keys(KEYS)
    options: dict[str, Any] = {"stack": "tunecost"}
    notes = [f"{TITLE}'s own model code: memory simulated with transformers' model code (stack tunecost)"]
    method = _model(flat, options, notes)
    _precision(flat, method, options, notes)
    _layout(flat, method, options, notes)
    _training(flat, method, options, notes)
    notes += accumulation_of(options, "train.global_batch_size")  # TrainArgs.gradient_accumulation_iters
    return config_job(FRAMEWORK.name, flat, options, notes)


FRAMEWORK = Framework(
    name="litgpt",
    title=TITLE,
    suffixes=(".yaml", ".yml"),
    strategies=("fsdp1", "fsdp2"),  # full fine-tuning: FSDPStrategy; LoRA: ModelParallelStrategy
    model_parallel=(),  # its fine-tuning scripts shard with FSDP only
    strategies_why=f"{TITLE} shards with FSDP on several devices (full fine-tuning: FSDP1, LoRA: FSDP2)",
    detect=detect,
    read=read,
)
