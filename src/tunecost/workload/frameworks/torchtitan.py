"""torchtitan job configs (TOML, `--job.config_file FILE`) read as a tunecost job.

torchtitan trains the whole model (pre-training or continued training): priced as a full fine-tune step. TOML is
torchtitan's format up to February 2026; later versions configure runs in Python, which is not read here.
"""

from __future__ import annotations

from typing import Any

from tunecost.workload.frameworks import (
    COMPILE_NOTE,
    ConfigFile,
    ConfigJob,
    Framework,
    KnownKeys,
    accumulation_of,
    global_batch_divides,
)
from tunecost.workload.frameworks.model_parallel import (
    ModelShape,
    catalog_shape,
    check_layout,
    config_expert_parallel,
    positive,
)
from tunecost.workload.frameworks.nested import config_job, data_parallel_layout, nested_config, optimizer_name

TITLE = "torchtitan"  # its defaults and where they were read: docs/configs.md, "torchtitan's defaults"
GLOBAL_BATCH = "training.global_batch_size"  # -1: local batch x data-parallel ranks; else train.py asserts the multiple
SP_KEY = "enable_sequence_parallel"  # the Python configs' switch (2026-03-29), read when a TOML file has it
# older TOML names read as today's: training.batch_size (before 2025-06-05), July to September 2025 (torchtitan
# 0.1, 0.2: 34d815c0, 8a2686c4)
_RENAMED_TABLE = """
    training.batch_size=training.local_batch_size
    job.print_args=job.print_config training.compile=compile.enable training.seed=debug.seed
    training.deterministic=debug.deterministic checkpoint.enable_checkpoint=checkpoint.enable
    memory_estimation.enabled=memory_estimation.enable validation.enabled=validation.enable
    mx.recipe_name=quantize.linear.mx.recipe_name mx.filter_fqns=quantize.linear.mx.filter_fqns
    mx.mxfp8_dim1_cast_kernel_choice=quantize.linear.mx.mxfp8_dim1_cast_kernel_choice
"""
FLOAT8_FIELDS = ("emulate", "enable_fsdp_float8_all_gather", "filter_fqns", "precompute_float8_dynamic_scale_for_fsdp")
RENAMED = dict(pair.split("=") for pair in _RENAMED_TABLE.split()) | {
    f"float8.{k}": f"quantize.linear.float8.{k}" for k in (*FLOAT8_FIELDS, "recipe_name")
}
# those months' keys with no name today (not modelled, so not read)
_DROPPED_TABLE = """
    job.use_for_integration_test parallelism.enable_compiled_autograd parallelism.pipeline_parallel_split_points
    float8.force_recompute_fp8_weight_in_bwd float8.moe_fqns_prototype mx.moe_fqns_prototype
    mx.use_fp8_dim1_cast_triton_kernel lr_scheduler.lr_min fault_tolerance.fragment_sync_delay
    fault_tolerance.fragment_update_alpha fault_tolerance.should_quantize fault_tolerance.sync_steps
"""
DROPPED = tuple(_DROPPED_TABLE.split())
KEYS = KnownKeys(f"{TITLE}'s JobConfig", ("torchtitan",), extra=(f"parallelism.{SP_KEY}", *DROPPED))
CUSTOM_CONFIG = ("job.custom_config_module", "experimental.custom_args_module")  # extend JobConfig: keys unknown
# model.name/flavor -> hub id in tunecost's catalog (llama3's flavors are Llama 3.1's: hf_assets_path Llama-3.1-8B)
_FLAVOR_TABLE = """
    llama3/8B=meta-llama/Llama-3.1-8B llama3/70B=meta-llama/Llama-3.1-70B llama3/405B=meta-llama/Llama-3.1-405B
    qwen3/0.6B=Qwen/Qwen3-0.6B qwen3/1.7B=Qwen/Qwen3-1.7B qwen3/4B=Qwen/Qwen3-4B qwen3/8B=Qwen/Qwen3-8B
    qwen3/14B=Qwen/Qwen3-14B qwen3/32B=Qwen/Qwen3-32B qwen3/30B-A3B=Qwen/Qwen3-30B-A3B
    gpt_oss/20b=openai/gpt-oss-20b gpt_oss/120b=openai/gpt-oss-120b deepseek_v3/16B=deepseek-ai/DeepSeek-V2-Lite
    deepseek_v3/236B=deepseek-ai/DeepSeek-V2 deepseek_v3/671B=deepseek-ai/DeepSeek-V3
"""
# flavors whose model registry defaults to flex attention (deepseek_v3: attn_backend "flex", block-causal masks)
_FLEX_FLAVORS = ("deepseek_v3/16B", "deepseek_v3/236B", "deepseek_v3/671B")
FLAVORS: dict[str, str] = dict(pair.split("=") for pair in _FLAVOR_TABLE.split())
PAR = "parallelism."
DP_KEYS = (f"{PAR}data_parallel_shard_degree", f"{PAR}data_parallel_replicate_degree", "training.enable_cpu_offload")
# torchtitan's pipeline schedule (lower case) -> tunecost's; the others (ZBV, DualPipeV, LoopedBFS, ...) are refused
SCHEDULES = {"1f1b": "1f1b", "gpipe": "gpipe", "interleaved1f1b": "interleaved-1f1b"}
# the config keys each plan option comes from, named in its errors
PLAN_KEYS = {
    "tp": f"{PAR}tensor_parallel_degree",
    "pp": f"{PAR}pipeline_parallel_degree",
    "cp": f"{PAR}context_parallel_degree",
    "sequence_parallel": f"{PAR}tensor_parallel_degree",
    "micro_batches": f"training.local_batch_size / {PAR}pipeline_parallel_microbatch_size",
    "virtual_stages": f"{PAR}pipeline_parallel_layers_per_stage / module_fqns_per_model_part",
}
RESHARD = {"default": True, "always": True, "never": False}
CHECKPOINTING = {"none": False, "full": True, "selective": True, "memory_budget": True}
DTYPES = {"bfloat16": "bf16", "float32": "fp32"}
# torchao float8 linears: the converter's registered name, and "float8" as the shipped TOMLs write it
FLOAT8_CONVERTERS = ("quantize.linear.float8", "float8")
FLOAT8 = "quantize.linear.float8."


def _model(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> None:
    name = flat.or_default("model.name", str, "llama3", notes, f"model.name llama3: {TITLE}'s default")
    line = f"model.flavor debugmodel: {TITLE}'s default"
    flavor = flat.or_default("model.flavor", str, "debugmodel", notes, line)
    if not any(key.startswith(f"{name}/") for key in FLAVORS):
        known = ", ".join(dict.fromkeys(key.split("/")[0] for key in FLAVORS))
        raise flat.error("model.name", f"{name!r}: not a model tunecost knows; known: {known}")
    base, _, attention = flavor.partition("_")
    if f"{name}/{base}" not in FLAVORS:
        known = ", ".join(key.split("/")[1] for key in FLAVORS if key.startswith(f"{name}/"))
        raise flat.error("model.flavor", f"{flavor!r}: not a released {name} size tunecost knows; known: {known}")
    options.update(model=FLAVORS[f"{name}/{base}"], attention="sdpa")
    how = f"{attention} attention modelled as SDPA" if attention else "torch's scaled_dot_product_attention"
    if f"{name}/{base}" in _FLEX_FLAVORS:
        how = "its model args' flex attention (block-causal) modelled as SDPA"
    notes.append(f"attention sdpa: {TITLE}'s flavor {flavor}: {how}")
    _converters(flat, options, notes)


def _converters(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> None:
    """model.converters: torchao float8 linears (FLOAT8_CONVERTERS) -> fp8 with quantize.linear.float8's recipe
    (None: tensorwise, torchao's default config); MX and grouped-GEMM float8 are not modelled (bf16 assumed)."""
    converters = flat.get("model.converters") or []
    if isinstance(converters, str):  # the CLI's comma-separated form
        converters = [c.strip() for c in converters.split(",") if c.strip()]
    other = [c for c in converters if c not in FLOAT8_CONVERTERS]
    if other:
        notes.append(f"model.converters {', '.join(other)}: not modelled (bf16 matmuls assumed)")
    if not any(c in FLOAT8_CONVERTERS for c in converters):
        return
    recipe = flat.typed(f"{FLOAT8}recipe_name", str)
    if recipe not in (None, "tensorwise", "rowwise"):
        raise flat.error(f"{FLOAT8}recipe_name", f"{recipe!r}: tunecost models tensorwise and rowwise")
    options["fp8"] = recipe or "tensorwise"
    if recipe is None:
        notes.append(f"fp8 tensorwise: {FLOAT8}recipe_name unset, {TITLE}'s torchao Float8LinearConfig() default")
    filtered = flat.get(f"{FLOAT8}filter_fqns") or []
    if "output" not in filtered:
        notes.append(f"{FLOAT8}filter_fqns: the output head converted by {TITLE} is modelled in bf16")


def _training(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> None:
    line = f"batch_size 8: {TITLE}'s default (training.local_batch_size)"
    options["batch_size"] = flat.or_default("training.local_batch_size", int, 8, notes, line)
    options["seq_len"] = flat.or_default("training.seq_len", int, 2048, notes, f"seq_len 2048: {TITLE}'s default")
    line = f"training.dtype float32: {TITLE}'s default"
    dtype = DTYPES.get(flat.or_default("training.dtype", str, "float32", notes, line))
    line = f"training.mixed_precision_param bfloat16: {TITLE}'s default"
    compute = DTYPES.get(flat.or_default("training.mixed_precision_param", str, "bfloat16", notes, line))
    if dtype is None or compute is None:
        raise flat.error("training.dtype" if dtype is None else "training.mixed_precision_param", "bfloat16 or float32")
    options["dtype"] = "bf16" if "bf16" in (dtype, compute) else "fp32"
    if dtype == "fp32" and compute == "bf16":  # `_mixed_precision` keeps it where the layout holds it
        options["fp32_params"] = True
    name = flat.or_default("optimizer.name", str, "AdamW", notes, f"optimizer AdamW: {TITLE}'s default")
    options["optimizer"] = optimizer_name(flat, "optimizer.name", name)
    if flat.data.get("optimizer.early_step_in_backward"):  # left among the keys not modelled
        notes.append(f"optimizer.early_step_in_backward: {TITLE}'s optimizer in backward is not modelled (grads kept)")
    if _compiles_model(flat):
        options["torch_compile"] = True
        notes.append(f"compile.enable: {TITLE} runs the step under torch.compile; {COMPILE_NOTE}")
    elif flat.typed("compile.enable", bool):
        notes.append(f"compile.components {flat.get('compile.components')}: the model runs eagerly (not 'model')")
    dataset = flat.or_default("training.dataset", str, "c4_test", notes, f"dataset c4_test: {TITLE}'s default")
    notes.append(f"dataset {dataset}: {TITLE} packs its text into samples of seq_len tokens (not read; no epochs)")
    line = f"gradient_checkpointing on: {TITLE}'s default activation_checkpoint.mode selective"
    mode = flat.or_default("activation_checkpoint.mode", str, "selective", notes, line)
    if mode not in CHECKPOINTING:
        raise flat.error("activation_checkpoint.mode", f"{mode!r}: one of {', '.join(CHECKPOINTING)}")
    options["gradient_checkpointing"] = CHECKPOINTING[mode]
    if mode == "memory_budget":
        notes.append(
            f"activation_checkpoint.mode {mode}: modelled as every layer checkpointed (memory under-estimated)"
        )


def _layer_checkpointing(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> None:
    """Selective checkpointing of whole layers: selective_ac_option N wraps every Nth block of each pipeline stage
    (torchtitan's counter: blocks N, 2N, ...); "op" keeps chosen ops' outputs (every layer recomputed, modelled)."""
    key = "activation_checkpoint.selective_ac_option"
    option = flat.or_default(key, str, "2", notes, f"{key} 2: {TITLE}'s default (every 2nd layer)")
    if option == "op":
        notes.append(
            f"activation_checkpoint.mode selective, {key} op: per-op checkpointing modelled as every layer "
            "checkpointed (memory under-estimated)"
        )
        return
    if not option.isdigit():
        raise flat.error(key, f"{option!r}: op or a whole number (checkpoint every Nth layer)")
    every, pp = int(option), options.get("pp", 1)
    if every <= 1 or options.get("model") is None:
        return
    per_stage = catalog_shape(options["model"]).num_layers // pp
    if per_stage < every:
        options["gradient_checkpointing"] = False
        notes.append(f"{key} {every}: no layer of a {per_stage}-layer stage is checkpointed")
        return
    options["recompute_layers"] = pp * (per_stage // every)
    notes.append(f"{key} {every}: {per_stage // every} of each stage's {per_stage} layers checkpointed")


def _degrees(flat: ConfigFile) -> tuple[int, int, int]:
    tp, pp, cp = (positive(flat, PLAN_KEYS[o], flat.typed(PLAN_KEYS[o], int)) for o in ("tp", "pp", "cp"))
    return tp, pp, cp


def _tensor_parallel(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> None:
    tp, cp, seq_len = options.get("tp", 1), options.get("cp", 1), options["seq_len"]
    if tp > 1:
        options["sequence_parallel"] = flat.typed(f"{PAR}{SP_KEY}", bool) is not False
        if f"{PAR}{SP_KEY}" not in flat.data:
            notes.append(f"sequence parallelism on: {TITLE}'s tensor parallelism shards the norms along the sequence")
        line = f"{PAR}disable_loss_parallel false: {TITLE}'s default (vocabulary-sharded loss, not modelled apart)"
        flat.or_default(f"{PAR}disable_loss_parallel", bool, False, notes, line)
        if flat.typed(f"{PAR}enable_async_tensor_parallel", bool):
            if not _compiles_model(flat):
                raise flat.error(f"{PAR}enable_async_tensor_parallel", f"{TITLE}'s async TP needs a compiled model")
            notes.append(f"{PAR}enable_async_tensor_parallel: its compute/communication overlap is not modelled")
    if tp * cp > 1 and seq_len % (tp * 2 * cp):
        raise flat.error("training.seq_len", f"{seq_len}: {TITLE} needs a multiple of tp x 2 x cp = {tp * 2 * cp}")


def _compiles_model(flat: ConfigFile) -> bool:
    """compile.enable with 'model' among compile.components (torchtitan's default: model and loss)."""
    return bool(flat.typed("compile.enable", bool)) and "model" in flat.typed("compile.components", list, ["model"])


def _pipeline(flat: ConfigFile, options: dict[str, Any], notes: list[str], shape: ModelShape) -> None:
    """Schedule, micro-batches (batch_size becomes the micro-batch's size) and virtual stages per rank."""
    pp, key = options["pp"], f"{PAR}pipeline_parallel_schedule"
    name = flat.or_default(key, str, "1F1B", notes, f"pipeline_schedule 1f1b: {TITLE}'s default ({key})")
    if name.lower() not in SCHEDULES:
        raise flat.error(key, f"{name!r}: tunecost models {TITLE}'s 1F1B, GPipe and Interleaved1F1B")
    options["pipeline_schedule"] = schedule = SCHEDULES[name.lower()]
    key = f"{PAR}pipeline_parallel_microbatch_size"
    size = positive(flat, key, flat.or_default(key, int, 1, notes, f"{key} 1: {TITLE}'s default"))
    if options["batch_size"] % size:
        raise flat.error(key, f"{size} does not divide training.local_batch_size {options['batch_size']}")
    options.update(micro_batches=options["batch_size"] // size, batch_size=size)
    notes.append(f"pipeline micro-batches: {options['micro_batches']} of {size} (batch_size), {key}")
    if flat.typed(f"{PAR}pipeline_parallel_schedule_csv", str):
        raise flat.error(f"{PAR}pipeline_parallel_schedule_csv", "a schedule read from a CSV file is not modelled")
    first, last = _less_layers(flat)
    if (first, last) != (1, 1):  # torchtitan's defaults are the plan's
        options.update(first_stage_less_layers=first, last_stage_less_layers=last)
    stages, key = _stages(flat, shape)
    if stages is None:
        options["virtual_stages"] = 2 if schedule == "interleaved-1f1b" else None  # None: the plan's 1
        return
    if stages % pp or (stages // pp > 1) != (schedule == "interleaved-1f1b"):
        want = "2 or more" if schedule == "interleaved-1f1b" else "1"
        raise flat.error(key, f"{stages} stages over {pp} ranks; {name} needs {want} per rank")
    options["virtual_stages"] = stages // pp if stages > pp else None


def _stages(flat: ConfigFile, shape: ModelShape) -> tuple[int | None, str]:
    """Pipeline stages in all: one per module_fqns_per_model_part list, else layers_per_stage's count (the first
    and last stages count their embedding and output as pipeline_parallel_first/last_stage_less_layers layers)."""
    key = f"{PAR}module_fqns_per_model_part"
    parts = flat.typed(key, list)
    if parts:
        return len(parts), key
    key = f"{PAR}pipeline_parallel_layers_per_stage"
    per_stage = flat.typed(key, int)
    if per_stage is None:
        return None, key
    first, last = _less_layers(flat)
    return -(-(shape.num_layers + first + last) // positive(flat, key, per_stage)), key


def _less_layers(flat: ConfigFile) -> tuple[int, int]:
    """pipeline_parallel_first/last_stage_less_layers: the layers the embedding and the head count as (1 each)."""
    out = []
    for end in ("first", "last"):
        key = f"{PAR}pipeline_parallel_{end}_stage_less_layers"
        value = flat.typed(key, int, 1)
        if value < 0:
            raise flat.error(key, f"must be at least 0, got {value}")
        out.append(value)
    return out[0], out[1]


def _layout(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> None:
    tp, pp, cp = _degrees(flat)
    options.update({k: v for k, v in (("tp", tp), ("pp", pp), ("cp", cp)) if v > 1})
    ep, etp = f"{PAR}expert_parallel_degree", f"{PAR}expert_tensor_parallel_degree"  # etp: 1 by default
    config_expert_parallel(flat, options, ep, etp, etp_default=1)
    shape = catalog_shape(options["model"]) if tp * pp * cp > 1 else None
    _tensor_parallel(flat, options, notes)
    if shape is not None and pp > 1:
        _pipeline(flat, options, notes, shape)
    # "default": resharded after forward, except under pipeline parallelism (per-micro-batch all-gathers avoided;
    # models/llama3/infra/parallelize.py apply_fsdp)
    smart = "resharded" if pp == 1 else "not resharded after forward under pipeline parallelism"
    line = f"{PAR}fsdp_reshard_after_forward default: {TITLE}'s default ({smart})"
    reshard = flat.or_default(f"{PAR}fsdp_reshard_after_forward", str, "default", notes, line)
    if reshard not in RESHARD:
        raise flat.error(f"{PAR}fsdp_reshard_after_forward", f"{reshard!r}: one of {', '.join(RESHARD)}")
    resharded = RESHARD[reshard] and not (reshard == "default" and pp > 1)
    layout, lines = data_parallel_layout(flat, DP_KEYS, reshard=resharded, title=TITLE, inner=tp * cp, pp=pp)
    options.update(layout)
    notes.extend(lines)
    _mixed_precision(flat, options, notes, tp * pp > 1 and cp == 1)
    check_layout(flat, options, PLAN_KEYS, shape=shape, seq_len=options["seq_len"], even_layers=False)


def _mixed_precision(flat: ConfigFile, options: dict[str, Any], notes: list[str], model_parallel: bool) -> None:
    """torchtitan's maybe_enable_amp: fp32 parameters computed in bf16 by FSDP's mixed precision, by autocast
    without FSDP (one GPU, DDP); TP or PP without FSDP trains in training.dtype (fp32 by default) throughout
    (distributed/utils.py). fp32 parameters beside TP, PP, CP or EP are simulated in bf16 (a note)."""
    if not options.pop("fp32_params", False):
        return
    if model_parallel and options.get("strategy") in ("single", "ddp"):
        options["dtype"] = "fp32"
        notes.append(f"dtype fp32: TP or PP without FSDP: {TITLE} disables mixed precision (training.dtype float32)")
    elif options.get("tp", 1) * options.get("pp", 1) * options.get("cp", 1) * options.get("expert_parallel", 1) > 1:
        notes.append(
            f"dtype bf16: {TITLE}'s fp32 parameters, gradients and AdamW states with bf16 compute are simulated in "
            "bf16 beside TP, PP, CP or EP (their memory under-estimated; --dtype fp32 bounds it)"
        )
    else:
        options["fp32_params"] = True
        how = "FSDP's mixed precision" if options.get("strategy") not in ("single", "ddp") else "autocast"
        notes.append(
            f"fp32_params: {TITLE}'s training.dtype float32: fp32 parameters, gradients and AdamW states, the "
            f"layers computed in bf16 by {how} (training.mixed_precision_param)"
        )


def detect(data: Any) -> bool:
    model, parallelism, job = data.get("model"), data.get("parallelism"), data.get("job")
    return (
        (isinstance(model, dict) and "flavor" in model)
        or (isinstance(parallelism, dict) and any(str(k).endswith("_degree") for k in parallelism))
        or (isinstance(job, dict) and "dump_folder" in job)
    )


def _renamed(flat: ConfigFile) -> tuple[ConfigFile, list[str]]:
    """The config with an older TOML's keys under today's names (RENAMED), and a note per key renamed."""
    older = [k for k in flat.data if k in RENAMED]
    both = [k for k in older if RENAMED[k] in flat.data]
    if both:
        raise flat.error(both[0], f"and {RENAMED[both[0]]} (its name today) are both set")
    data = {RENAMED.get(k, k): v for k, v in flat.data.items()}
    return ConfigFile(path=flat.path, data=data), [f"{k}: read as {RENAMED[k]}, its name today" for k in older]


def read(cfg: ConfigFile) -> ConfigJob:
    flat, notes = _renamed(nested_config(cfg))
    if not any(flat.data.get(key) for key in CUSTOM_CONFIG):
        flat.check_keys(KEYS)
    options: dict[str, Any] = {"method": "full", "stack": "tunecost"}
    notes[:0] = [
        f"method full: {TITLE} trains the whole model (pre-training or continued training)",
        f"{TITLE}'s own model code: memory simulated with transformers' model code (stack tunecost)",
    ]
    _model(flat, options, notes)
    _training(flat, options, notes)
    _layout(flat, options, notes)
    if options["gradient_checkpointing"] and flat.data.get("activation_checkpoint.mode", "selective") == "selective":
        _layer_checkpointing(flat, options, notes)
    _steps(flat, options, notes)
    if options.get("num_gpus"):
        global_batch_divides(GLOBAL_BATCH, TITLE, options, options["num_gpus"])
    notes += accumulation_of(options, GLOBAL_BATCH)  # train.py's gradient_accumulation_steps
    return config_job(FRAMEWORK.name, flat, options, notes)


def _steps(flat: ConfigFile, options: dict[str, Any], notes: list[str]) -> None:
    """The run's optimizer steps (training.steps; no epochs) and training.global_batch_size when set (-1: local
    batch x data-parallel ranks, no accumulation)."""
    line = f"max_steps 10000: {TITLE}'s default training.steps"
    options["max_steps"] = positive(flat, "training.steps", flat.or_default("training.steps", int, 10000, notes, line))
    stated = flat.typed(GLOBAL_BATCH, int)
    if stated is not None and stated > 0:
        options["queries_per_step"] = stated


FRAMEWORK = Framework(
    name="torchtitan",
    title=TITLE,
    suffixes=(".toml",),
    detect=detect,
    read=read,
    strategies=("fsdp2", "fsdp2-shard-grad-op", "hsdp", "ddp"),
    strategies_why=f"{TITLE} shards and replicates with FSDP2's degrees",
    global_batch_key=GLOBAL_BATCH,
)
