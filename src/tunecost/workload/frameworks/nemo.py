"""NeMo 1.x training YAML (Hydra: megatron_gpt_config.yaml, megatron_gpt_finetuning_config.yaml) and Megatron-LM's
`--yaml-cfg` YAML (or its argparse flags as top-level keys) read as a tunecost job: the model-parallel layout,
precision, micro- and global batch, sequence length and LoRA.

Neither names a Hugging Face model: it is the tokenizer's or the architecture's (megatron_model.py), else --model.
An interpolation (${model.x}) is that key's value; resolvers (${oc.env:...}) are not run. NeMo 2 is not read.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from tunecost.models.projections import PROJECTIONS
from tunecost.workload.frameworks import SFT_ONLY, ConfigFile, ConfigJob, Framework, accumulation_of
from tunecost.workload.frameworks.megatron_model import Architecture, file_model
from tunecost.workload.frameworks.model_parallel import (
    ModelShape,
    check_layout,
    config_expert_parallel,
    megatron_split,
    positive,
)
from tunecost.workload.frameworks.nemo_keys import MEGATRON, MEGATRON_FIXED_FLAGS, MEGATRON_LM, NEMO, TITLE, Dialect
from tunecost.workload.frameworks.nested import config_job, nested_config
from tunecost.workload.job import group_targets, targets_text
from tunecost.workload.parallel import config_node_size, fixed_split_note, micro_batches_per_step

# optimizer name -> tunecost's, and whether it shards its states over the data-parallel group (ZeRO-1's layout)
OPTIMIZERS = {"fused_adam": ("adamw", False), "adam": ("adamw", False), "adamw": ("adamw", False)}
OPTIMIZERS.update(distributed_fused_adam=("adamw", True), mcore_distributed_optim=("adamw", True), sgd=("sgd", False))
# NeMo's LoRA target -> the projections of transformers' model it adapts (linear_qkv, linear_fc1: fused in Megatron)
LORA_TARGETS = {"attention_qkv": "q_proj,k_proj,v_proj", "attention_dense": "o_proj", "attention": "attention"}
LORA_TARGETS.update(mlp_fc1="gate_proj,up_proj", mlp_fc2="down_proj", mlp="mlp", all="attention,mlp")


class Reader:
    """One file's values by the dialect's keys (a Megatron-LM key also as its top-level argparse name), each
    default named among the assumptions with whose default it is."""

    def __init__(self, flat: ConfigFile, dialect: Dialect, finetuning: bool) -> None:
        self.flat, self.dialect, self.finetuning = flat, dialect, finetuning
        self.notes: list[str] = []
        self.title = f"{dialect.title}'s{' fine-tuning' if finetuning else ''} default"

    def key(self, key: str) -> str:
        if self.dialect is MEGATRON_LM and key not in self.flat.data and key.rsplit(".", 1)[-1] in self.flat.data:
            return key.rsplit(".", 1)[-1]
        return key

    def value(self, key: str, kind: Any, default: Any = None, note: str | None = None) -> Any:
        key = self.key(key)
        raw, seen = self.flat.data.get(key), {key}
        # OmegaConf's ${other.key}: its value (NeMo's alpha: ${model.peft.lora_tuning.adapter_dim})
        while isinstance(raw, str) and (ref := _REFERENCE.fullmatch(raw.strip())) and ref[1] not in seen:
            seen.add(ref[1])
            raw = self.flat.data.get(ref[1])
            self.flat.used.add(ref[1])
        if raw == "???":  # OmegaConf's mandatory value, given on the command line: as if unset
            self.flat.used.add(key)
            self.notes.append(f"{key} ???: given on {self.dialect.title}'s command line, not in the file")
            return default
        if isinstance(raw, str) and "${" in raw:
            raise self.flat.error(key, f"{raw}: an OmegaConf interpolation; give the resolved config (hparams.yaml)")
        value = self.flat.typed(key, kind) if len(seen) == 1 else _typed(self.flat, key, raw, kind)
        if value is None and default is not None:
            self.notes.append(note or f"{key} {default}: {self.title}")
            return default
        return value


_REFERENCE = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")  # another key of the file, by its absolute path


def _typed(flat: ConfigFile, key: str, value: Any, kind: Any) -> Any:
    """`flat.typed` of `key` holding `value` (the value an interpolation names)."""
    return dataclasses.replace(flat, data={**flat.data, key: value}).typed(key, kind)


def _layout(r: Reader, options: dict[str, Any]) -> dict[str, str]:
    """GPUs, degrees, micro-batches; returns the plan option -> config key map for the plan's errors."""
    d = r.dialect
    tp, pp, cp = (positive(r.flat, r.key(k), r.value(k, int, 1)) for k in (d.tp, d.pp, d.cp))
    vp = r.value(d.vp, int) or 1
    keys = {"tp": r.key(d.tp), "pp": r.key(d.pp), "cp": r.key(d.cp), "sequence_parallel": r.key(d.sp)}
    keys.update(micro_batches=r.key(d.global_batch), virtual_stages=r.key(d.vp))
    options.update({k: v for k, v in (("tp", tp), ("pp", pp), ("cp", cp)) if v > 1})
    sp = r.value(d.sp, bool, False)
    if sp and tp == 1:
        r.notes.append(f"{r.key(d.sp)} off: {d.title} turns sequence parallelism off without tensor parallelism")
    options["sequence_parallel"] = bool(sp) if tp > 1 else None  # stated: --sequence-parallel's default is on
    options["tp_impl"] = "megatron" if tp > 1 else None  # Megatron Core's column/row-parallel layers
    if tp > 1 and r.value(d.tp_overlap, bool):  # TE userbuffers (default off)
        options["tp_comm_overlap"] = True
    if pp > 1:
        options["pipeline_schedule"] = "interleaved-1f1b" if vp > 1 else "1f1b"
        options["virtual_stages"] = vp if vp > 1 else None
    if d is NEMO:
        unsaid = r.flat.get("trainer.devices") == "???"  # given on NeMo's command line
        devices = "???" if unsaid else r.value("trainer.devices", (int, str), 1)
        devices = int(devices) if isinstance(devices, str) and devices.isdigit() else devices
        nodes = positive(r.flat, "trainer.num_nodes", r.value("trainer.num_nodes", int, 1))
        if isinstance(devices, int) and devices > 0:
            options.update(num_gpus=devices * nodes, **config_node_size(devices, nodes))
        else:
            why = "given on NeMo's command line" if unsaid else "every GPU of the node"
            r.notes.append(f"GPUs: trainer.devices {devices!r}: {why} (give --gpus)")
    else:
        r.notes.append(f"GPUs: {MEGATRON}'s world size comes from the launcher (give --gpus)")
    micro = r.value(d.micro, int, 4 if d is NEMO else None)
    if micro is None:
        raise r.flat.error(r.key(d.micro), f"missing: {MEGATRON} requires it")
    options["batch_size"] = micro = positive(r.flat, r.key(d.micro), micro)
    _micro_batches(r, options, micro, tp * pp * cp)
    config_expert_parallel(r.flat, options, r.key(d.ep), r.key(d.etp), etp_default=None)
    return keys


def _micro_batches(r: Reader, options: dict[str, Any], micro: int, model_parallel: int) -> None:
    """Megatron's micro-batches per step: global batch / (micro-batch x data-parallel degree)."""
    key = r.key(r.dialect.global_batch)
    default = (128 if r.finetuning else 8) if r.dialect is NEMO else None
    global_batch = r.value(r.dialect.global_batch, int, default)
    options["queries_per_step"] = None if global_batch is None else positive(r.flat, key, global_batch)
    gpus = options.get("num_gpus")
    if global_batch is None or gpus is None or gpus % model_parallel:
        return  # the plan names degrees that do not divide the GPUs
    try:
        count = micro_batches_per_step(global_batch, micro, gpus // model_parallel)
    except ValueError as e:
        raise r.flat.error(key, str(e)) from None
    if options.get("pp", 1) > 1:
        options["micro_batches"] = count
    else:
        r.notes += accumulation_of(options, key)


def _training(r: Reader, options: dict[str, Any]) -> None:
    d, flat = r.dialect, r.flat
    if d is NEMO:
        precision = str(r.value("trainer.precision", (str, int), 16 if r.finetuning else "bf16"))
        dtype = "bf16" if "bf16" in precision else "fp16" if precision.startswith("16") else None
        dtype = dtype or ("fp32" if precision.startswith("32") else None)
        if dtype is None:
            raise flat.error("trainer.precision", f"{precision!r}: tunecost models bf16, 16 and 32")
    else:
        bf16, fp16 = r.value("model_parallel.bf16", bool, False), r.value("model_parallel.fp16", bool, False)
        dtype = "bf16" if bf16 else "fp16" if fp16 else "fp32"
    options["dtype"] = dtype
    if dtype != "fp32" and options["method"] == "full":
        r.notes.append(
            f"dtype {dtype}: {d.title}'s fp32 main parameters and optimizer states (mixed precision) are simulated "
            f"in {dtype} (their memory under-estimated; --dtype fp32 bounds it)"
        )
    fp8 = r.value(d.fp8, (bool, str))
    if fp8:  # Transformer Engine's FP8 linears, delayed scaling (NeMo's fp8_recipe default)
        options["fp8"] = "te-delayed"
        hybrid = f" (fp8_hybrid {r.value('model.fp8_hybrid', bool, True)})" if d is NEMO else ""
        r.notes.append(
            f"{r.key(d.fp8)} {fp8}{hybrid}: Transformer Engine FP8 linears with delayed scaling (te-delayed)"
        )
        if r.value(d.fp8_params, bool):  # TE fp8_model_init: no bf16 weight kept
            options["fp8_params"] = True
    name = r.value(d.optimizer, str, "fused_adam" if d is NEMO else "adam")
    if name not in OPTIMIZERS:
        raise flat.error(r.key(d.optimizer), f"{name!r}: tunecost models {', '.join(OPTIMIZERS)}")
    options["optimizer"], sharded = OPTIMIZERS[name]
    sharded = sharded or bool(d is MEGATRON_LM and r.value("use_distributed_optimizer", bool))
    # Megatron Core's own DDP at any data-parallel size (one rank: priced as one GPU; --gpus N: replicated over N)
    options["strategy"] = "zero1" if sharded else "ddp"
    if options["strategy"] == "zero1":
        r.notes.append(f"distributed optimizer: {d.title}'s shards its states over data parallel, modelled as zero1")
    recompute = r.value(d.recompute, str)
    if recompute not in (None, "full", "selective"):
        raise flat.error(r.key(d.recompute), f"{recompute!r}: full, selective or null")
    options["gradient_checkpointing"] = recompute == "full"
    if recompute is None:
        r.notes.append(f"gradient_checkpointing off: {r.key(d.recompute)} null ({d.title}'s default)")
    if recompute == "selective":
        options["selective_recompute"] = True
    if recompute == "full":
        _recomputed_layers(r, options)


def _recomputed_layers(r: Reader, options: dict[str, Any]) -> None:
    """Megatron Core's full recomputation: `block` checkpoints the first N layers of each pipeline stage (of each
    model chunk under a virtual pipeline) and keeps the others' activations; `uniform` checkpoints every layer, N
    at a time (modelled one at a time: a group's recompute holds N layers' activations)."""
    d = r.dialect
    method_key, layers_key = (r.key(d.recompute.replace("granularity", k)) for k in ("method", "num_layers"))
    method, layers = r.value(method_key, str), r.value(layers_key, int)
    if method not in (None, "uniform", "block"):
        raise r.flat.error(method_key, f"{method!r}: uniform or block")
    if layers is not None and layers < 1:
        raise r.flat.error(layers_key, f"{layers}: at least 1")
    if method == "block" and layers:
        chunks = options.get("pp", 1) * (options.get("virtual_stages") or 1)
        options["recompute_layers"] = layers * chunks
        r.notes.append(f"{method_key} block, {layers_key} {layers}: {layers} layers of each of {chunks} model chunks")
    elif method is None or layers is None:
        r.notes.append(f"every layer recomputed: {method_key} or {layers_key} not set")
    elif layers > 1:
        r.notes.append(f"{method_key} uniform, {layers_key} {layers}: modelled as each layer recomputed alone")


def _sequence(r: Reader, options: dict[str, Any]) -> None:
    d = r.dialect
    if d is NEMO and r.finetuning and "model.data.train_ds.max_seq_length" in r.flat.data:
        options["seq_len"] = r.value("model.data.train_ds.max_seq_length", int)
    elif d is NEMO and "model.seq_length" in r.flat.data:
        options["seq_len"] = r.value("model.seq_length", int)
    else:
        default = (2048 if r.finetuning else 512) if d is NEMO else None
        options["seq_len"] = r.value(d.seq_len, int, default)
    if options["seq_len"] is None:
        raise r.flat.error(r.key(d.seq_len), f"missing: {MEGATRON} requires it")
    if r.value("model.data.train_ds.packed_sequence", bool):
        r.notes.append(
            "model.data.train_ds.packed_sequence: every sample is max_seq_length tokens, attention per document"
        )
    files = r.value("model.data.train_ds.file_names", list)
    if isinstance(files, list) and len(files) == 1 and str(files[0]).endswith((".jsonl", ".json")):
        options["dataset"] = str(files[0])
    _attention(r, options)


def _attention(r: Reader, options: dict[str, Any]) -> None:
    """Megatron Core's local layer spec (Megatron-LM transformer_impl local; NeMo transformer_engine false) runs
    DotProductAttention, which keeps the scores: eager. Else Transformer Engine's fused (flash) attention."""
    if r.dialect is MEGATRON_LM:
        key, local = "transformer_impl", r.value("transformer_impl", str, "transformer_engine") == "local"
    else:  # the legacy (not mcore_gpt) model takes use_flash_attention without TE
        legacy_flash = not r.value("model.mcore_gpt", bool) and r.value("model.use_flash_attention", bool)
        # unset: False (megatron_gpt_model.py cfg.get), but a fine-tuning run takes its checkpoint's model config
        te = r.value("model.transformer_engine", bool, None if r.finetuning else False)
        key, local = "model.transformer_engine", te is False and not legacy_flash
    options["attention"] = "eager" if local else "flash"
    kept = f"{key} {r.flat.data.get(key, False)}: Megatron Core's DotProductAttention keeps the attention scores"
    fused = f"{r.dialect.title}'s Transformer Engine / flash attention kernels"
    r.notes.append(f"attention {options['attention']}: {kept if local else fused}")


def _peft(r: Reader, options: dict[str, Any]) -> None:
    """full, or LoRA with its rank, alpha and targets (NeMo's model.peft; Megatron-LM trains the whole model)."""
    if "model.kd_teacher_restore_from_path" in r.flat.data:  # megatron_gpt_distillation.py's teacher (null: a CLI's)
        raise r.flat.error("model.kd_teacher_restore_from_path", f"knowledge distillation: {SFT_ONLY}")
    if not r.finetuning:
        options["method"] = "full"
        return
    scheme = r.value("model.peft.peft_scheme", str, "adapter")
    if scheme in ("none", "null"):
        options["method"] = "full"
        return
    if scheme != "lora":
        raise r.flat.error("model.peft.peft_scheme", f"{scheme!r}: tunecost estimates full and LoRA fine-tuning")
    options["method"] = "lora"
    dim = "model.peft.lora_tuning.adapter_dim"
    options["lora_rank"] = rank = positive(r.flat, dim, r.value(dim, int, 32))
    line = f"lora_alpha {rank}: {TITLE}'s default (model.peft.lora_tuning.alpha = adapter_dim)"
    options["lora_alpha"] = r.value("model.peft.lora_tuning.alpha", (int, float), rank, line)
    modules = r.value("model.peft.lora_tuning.target_modules", list, ["attention_qkv"])
    if any(m not in LORA_TARGETS for m in modules) or not modules:
        raise r.flat.error("model.peft.lora_tuning.target_modules", f"{modules}: a list of {', '.join(LORA_TARGETS)}")
    names = {n for m in modules for n in LORA_TARGETS[m].split(",")}
    targets: set[str] = set()
    for group, own in PROJECTIONS.items():
        targets.update(group_targets(group, names & {group, *own}))
    options["lora_targets"] = targets_text(targets)
    if names & {"attention", "mlp", "q_proj", "gate_proj"}:
        r.notes.append(f"lora_targets {options['lora_targets']}: {TITLE}'s fused linear_qkv and linear_fc1 take one "
                       "adapter each; priced as one adapter per projection")  # fmt: skip


def _run_length(r: Reader, options: dict[str, Any]) -> None:
    """NeMo's trainer.max_steps and max_epochs (whichever ends first; -1 or null: no limit), Megatron-LM's
    train_iters; the global batch (`_micro_batches`) turns steps into queries."""
    steps_key = "trainer.max_steps" if r.dialect is NEMO else "train_iters"
    steps = r.value(steps_key, int)
    epochs = r.value("trainer.max_epochs", int) if r.dialect is NEMO else None
    if steps is not None and steps > 0:
        options["max_steps"] = steps
        ends = f", or {epochs} epochs if they end first" if epochs is not None and epochs > 0 else ""
        r.notes.append(f"run length: {steps_key} {steps} optimizer steps{ends} ({r.dialect.title} stops at either)")
    if epochs is not None and epochs > 0:
        options["epochs"] = epochs


def _pipeline_split(r: Reader, options: dict[str, Any], keys: dict[str, str]) -> bool:
    """The layers the stages count the embedding and the head as (Megatron Core's account_for_embedding/loss_in_
    pipeline_split, default off: the stages divide the decoder layers), or the first and last stages' own layers
    (num_layers_in_first/last_pipeline_stage, which Megatron refuses beside them); True where the stages need not
    divide the layers."""
    if options.get("pp", 1) == 1:
        return False
    fixed = _fixed_stage_keys(r)
    for (option, key), flag in zip(fixed.items(), ("pp_first_stage_layers", "pp_last_stage_layers"), strict=True):
        value = r.value(key, int)
        options[option], keys[flag] = None if value is None else positive(r.flat, key, value), key
    split = [r.key(k) for k in (r.dialect.split_embedding, r.dialect.split_loss)]
    given = [k for option, k in fixed.items() if options[option] is not None]
    if given:
        on = [k for k in split if r.value(k, bool)]
        if on:
            raise r.flat.error(given[0], f"Megatron refuses it beside {' and '.join(on)}")
        r.notes.append(
            f"{' and '.join(given)}: {fixed_split_note(options['first_stage_layers'], options['last_stage_layers'])}"
        )
        return True
    return megatron_split(options, split, [r.value(k, bool, False, f"{k} off: {r.title}") for k in split], r.notes)


def _fixed_stage_keys(r: Reader) -> dict[str, str]:
    """option -> the key of the first and last stages' layers (Megatron-LM's argparse names where given)."""
    d, out = r.dialect, {}
    for option, key, flag in zip(
        ("first_stage_layers", "last_stage_layers"), (d.first_layers, d.last_layers), MEGATRON_FIXED_FLAGS, strict=True
    ):
        out[option] = flag if d is MEGATRON_LM and flag in r.flat.data else r.key(key)
    return out


def _model(r: Reader, options: dict[str, Any]) -> Architecture | None:
    """The model the file trains where its Hugging Face tokenizer or its architecture keys name one
    (`megatron_model.file_model`); the note says how, or what to give. Returns the architecture the file states."""
    d, (kind_key, hf_kind, name_key) = r.dialect, r.dialect.tokenizer
    name = r.flat.get(r.key(name_key)) if r.flat.get(r.key(kind_key)) == hf_kind else None
    layers, hidden, heads = (r.value(k, int) for k in (d.layers, d.hidden, d.heads))
    arch = None
    if layers and hidden and heads:
        kv_heads = r.value(d.groups, int) or heads  # Megatron-LM's argparse name for num_moe_experts: num_experts
        experts = r.value(d.experts, int) or (d is MEGATRON_LM and r.value("num_experts", int)) or 1
        ffn = r.value(d.ffn, int)
        if ffn is None and d is MEGATRON_LM:  # its arguments' default: 4 x hidden, 2/3 of it (to 64) for SwiGLU
            swiglu = r.value("language_model.activation_func", str) == "swiglu" or r.value("swiglu", bool)
            ffn = int(4 * hidden * 2 / 3 / 64) * 64 if swiglu else 4 * hidden
        arch = Architecture(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn, experts=experts)
    model, note = file_model(name if isinstance(name, str) else None, r.key(name_key), arch, d.title)
    r.notes.append(note)
    if model is not None:
        options["model"] = model
    return arch


def _shape(r: Reader) -> ModelShape | None:
    """Heads and layers when the config gives the architecture (pre-training); None for a restored checkpoint."""
    d = r.dialect
    heads, layers = r.value(d.heads, int), r.value(d.layers, int)
    if heads is None or layers is None:
        return None
    return ModelShape(heads, r.value(d.groups, int) or heads, layers)


def _dialect(data: Any) -> Dialect | None:
    model, trainer = data.get("model"), data.get("trainer")
    nemo_keys = ("tensor_model_parallel_size", "micro_batch_size", "global_batch_size", "mcore_gpt", "peft")
    if isinstance(model, dict) and isinstance(trainer, dict) and any(k in model for k in nemo_keys):
        return NEMO
    sections = any(isinstance(data.get(k), dict) for k in ("model_parallel", "language_model"))
    flags = any(k in data for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size"))
    return MEGATRON_LM if sections or flags else None


def read(cfg: ConfigFile) -> ConfigJob:
    dialect = _dialect(cfg.data)
    assert dialect is not None
    flat = nested_config(cfg)
    finetuning = dialect is NEMO and any(k.startswith("model.peft.") for k in flat.data)
    r = Reader(flat, dialect, finetuning)
    options: dict[str, Any] = {"stack": "tunecost"}
    arch = _model(r, options)
    r.notes.append(f"{dialect.title}'s own model code: memory simulated with transformers' model code (stack tunecost)")
    _peft(r, options)
    keys = _layout(r, options)
    _training(r, options)
    _sequence(r, options)
    _run_length(r, options)
    uneven = _pipeline_split(r, options, keys)
    check_layout(flat, options, keys, shape=_shape(r), seq_len=options["seq_len"], even_layers=not uneven)
    job = config_job(FRAMEWORKS[dialect is MEGATRON_LM].name, flat, options, r.notes)
    return dataclasses.replace(job, not_modelled=_sections(job.not_modelled, flat.used), architecture=arch)


def _sections(keys: tuple[str, ...], used: set[str]) -> tuple[str, ...]:
    """A key three deep or more named by its two-part section ("model.optim") when no key of that was read."""
    read = {".".join(k.split(".")[:2]) for k in used}
    return tuple(dict.fromkeys(k if ".".join(k.split(".")[:2]) in read else ".".join(k.split(".")[:2]) for k in keys))


def _framework(name: str, dialect: Dialect, strategies: tuple[str, ...], why: str) -> Framework:
    why = f"{dialect.title} runs Megatron Core's DDP or distributed optimizer (zero1), or {why}"
    return Framework(name=name, title=dialect.title, suffixes=(".yaml", ".yml"), read=read, strategies=strategies,
                     detect=lambda data: _dialect(data) is dialect, strategies_why=why)  # fmt: skip


# NeMo's model.fsdp is PyTorch FSDP1 (NLPFSDPStrategy); Megatron-LM's use_torch_fsdp2 is FSDP2
FRAMEWORKS = (
    _framework("nemo", NEMO, ("ddp", "zero1", "fsdp1"), "FSDP1 (model.fsdp)"),
    _framework("megatron-lm", MEGATRON_LM, ("ddp", "zero1", "fsdp2"), "FSDP2 (use_torch_fsdp2)"),
)
