"""What the Hugging Face stack's readers share (the Trainer, TRL, PEFT, accelerate, LLaMA-Factory, axolotl): flags
read as transformers reads them, PEFT's target module names, optimizer names, FSDP, DeepSpeed and FP8 settings, and
the torch.compile, Liger and 8-bit keys."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from tunecost.errors import TunecostError
from tunecost.models.catalog import resolve_model
from tunecost.workload.frameworks import COMPILE_NOTE, LIGER_DEFAULTS, LIGER_NOTE, PASS_DEEPSPEED, ConfigFile
from tunecost.workload.job import group_targets

Part = tuple[dict[str, Any], list[str]]  # options and assumption lines
VISION_MODEL = re.compile(r"(?i)vision|llava|internvl|(?<![a-z])vl(?![a-z])")
SHARDS = ("full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2", "no_shard")
# what the HF stack's TP runs beside (`Framework.tp_strategies`): DeepSpeed AutoTP with ZeRO stages 0 to 2, and
# accelerate's ParallelismConfig with FSDP2 or DDP
AUTOTP_STRATEGIES = ("single", "ddp", "zero1", "zero2")
PARALLELISM_CONFIG_STRATEGIES = ("single", "ddp", "fsdp2", "fsdp2-shard-grad-op", "hsdp")
HF_TP_STRATEGIES = (*PARALLELISM_CONFIG_STRATEGIES, "zero1", "zero2")


def truthy(value: Any) -> bool:
    """A flag written as a bool or as text ("true", "yes"), as transformers' and accelerate's str_to_bool read it."""
    return str(value).strip().lower() in ("true", "1", "yes", "y", "t", "on")


def fsdp_options(cfg: ConfigFile, default_version: tuple[str, str] = ("2", "transformers' default")) -> Part:
    """strategy, offload (and checkpointing) of `fsdp` (True, or the older "full_shard auto_wrap") and fsdp_config,
    as transformers 5's _process_fsdp_args reads them (`default_version`: the version fsdp_config leaves unset, and
    whose default it is: FSDP2 since transformers 5.10, FSDP1 before)."""
    fsdp, raw = cfg.get("fsdp"), cfg.get("fsdp_config")
    if not fsdp:
        return {}, []
    items = fsdp.split() if isinstance(fsdp, str) else fsdp if isinstance(fsdp, list) else []
    items = [str(i).lower() for i in items]
    fcfg = {k.removeprefix("fsdp_"): v for k, v in raw.items()} if isinstance(raw, dict) else {}
    notes = (
        [f"fsdp_config {raw}: a file tunecost does not read; put its keys in fsdp_config"] if raw and not fcfg else []
    )
    version = str(fcfg.get("version", default_version[0]))
    notes += [] if "version" in fcfg else [f"FSDP version {version} (fsdp_config.version): {default_version[1]}"]
    reshard = str(fcfg.get("reshard_after_forward", "")).lower()
    shard = next((i for i in items if i in SHARDS), "")
    shard = shard or {"false": "shard_grad_op", "true": "full_shard", "": "full_shard"}.get(reshard, reshard)
    strategies = {"full_shard": f"fsdp{version}", "shard_grad_op": "fsdp2-shard-grad-op"}
    strategies.update({"hybrid_shard": "hsdp", "no_shard": "ddp"} if version == "1" else {})
    if version not in ("1", "2") or shard not in strategies:
        raise cfg.error(
            "fsdp",
            f"{shard} with FSDP version {version} is not modelled (full_shard, shard_grad_op; "
            "FSDP1 also hybrid_shard, no_shard)",
        )
    out: dict[str, Any] = {"strategy": strategies[shard]}
    if shard != "full_shard" and version == "1":
        notes.append(f"FSDP1 {shard}: tunecost models it as {strategies[shard]}")
    if "offload" in items or truthy(fcfg.get("cpu_offload", False)):
        out["offload"] = "params"
    if truthy(fcfg.get("activation_checkpointing", False)):
        out.update(gradient_checkpointing=True, reentrant=False)
        notes.append("fsdp_config activation_checkpointing: FSDP's own, non-reentrant (torch checkpoint_wrapper)")
    return out, notes


INT8 = MappingProxyType({"method": "qlora", "quant_type": "int8"})  # 8-bit LoRA (load_in_8bit), as options


def compile_options(cfg: ConfigFile, whose: str) -> Part:
    """torch_compile (the HF Trainer's, axolotl's and LLaMA-Factory's key; a compile backend or mode set turns it
    on in TrainingArguments.__post_init__, and axolotl's "auto" on the torch it pins)."""
    value = cfg.get("torch_compile")
    if value == "auto":
        return {"torch_compile": True}, [
            f"torch_compile auto: on ({whose} compiles with torch >= 2.5.1); {COMPILE_NOTE}"
        ]
    on = bool(cfg.typed("torch_compile", bool))
    mode = next((k for k in ("torch_compile_backend", "torch_compile_mode") if cfg.typed(k, str)), None)
    if mode is not None and not on:
        return {"torch_compile": True}, [f"torch_compile on: {mode} is set ({whose} turns it on); {COMPILE_NOTE}"]
    return ({"torch_compile": True}, [f"torch_compile: {COMPILE_NOTE}"]) if on else ({}, [])


def liger_options(cfg: ConfigFile, key: str) -> Part:
    """Liger's kernels (`key`: use_liger_kernel, LLaMA-Factory's enable_liger_kernel) with the default kernel set;
    a liger_kernel_config that changes it stays among the keys not modelled, and the step is counted without."""
    if not cfg.typed(key, bool):
        return {}, []
    config = cfg.data.get("liger_kernel_config")
    if isinstance(config, Mapping) and any(config.get(k, on) != on for k, on in LIGER_DEFAULTS.items()):
        return {}, [f"{key} with liger_kernel_config {dict(config)}: only Liger's default kernels are modelled; "
                    "counted without Liger"]  # fmt: skip
    cfg.get("liger_kernel_config")
    return {"liger_kernel": True}, [f"{key}: {LIGER_NOTE}"]


def int8_options(cfg: ConfigFile, key: str) -> Part:
    """8-bit LoRA (`key`, load_in_8bit, set): method qlora on bitsandbytes LLM.int8 base weights. 16-bit weights
    kept beside the codes (llm_int8_has_fp16_weight) are not modelled."""
    if cfg.typed("llm_int8_has_fp16_weight", bool):
        raise cfg.error("llm_int8_has_fp16_weight", "16-bit weights kept beside the int8 codes are not modelled")
    return dict(INT8), [f"{key}: LLM.int8 base weights (--quant-type int8)"]


# PEFT module names -> tunecost's LoRA target groups: the module sets that each cover a whole group
_WHOLE = {
    "attention": ("q_proj k_proj v_proj o_proj", "query_key_value dense", "wqkv out_proj", "qkv_proj o_proj", "c_attn"),
    "mlp": ("gate_proj up_proj down_proj", "gate_up_proj down_proj", "fc1 fc2", "c_fc c_proj", "w1 w2 w3",
            "dense_h_to_4h dense_4h_to_h"),
}  # fmt: skip
_WHOLE_TEXT = {"attention": "all four projections", "mlp": "gate, up and down projections"}
_NAME_GROUP = {name: group for group, sets in _WHOLE.items() for s in sets for name in s.split()}
_MOE_FFN = ("w1", "w2", "w3", "gate_up_proj")  # an MoE's experts (Mixtral's, gpt-oss's fused), else a dense MLP's
_ROUTER = ("gate", "router")
_ALL_LINEAR = ("all", "all-linear", "all_linear")
ADAPTED_NAMES = frozenset((*_NAME_GROUP, "experts", *_ROUTER))  # the module names tunecost reads as targets
_MOE_NAME = re.compile(r"(?i)mixtral|moe")
_MOE_ALL_LINEAR = (
    ": on an MoE model, attention and any dense MLP only (transformers >= 5 holds the routed experts as fused 3-D "
    "parameters and the router as a bare parameter, which no nn.Linear search finds; under transformers 4.x "
    "they were adapted too: --lora-targets attention,experts,router prices that)"
)


def peft_targets(cfg: ConfigFile, key: str, entries: Sequence[str], model: str | None) -> tuple[set[str], list[str]]:
    """tunecost's LoRA targets for PEFT module names, paths or patterns (`key`'s list) and the assumption lines
    they need; an error when none names a module tunecost adapts."""
    tokens = [re.findall(r"[A-Za-z0-9_]+", e) for e in entries]
    spelled = {t.lower(): t for ts in tokens for t in ts}  # as the file spells it, for the notes
    tokens = [[t.lower() for t in ts] for ts in tokens]
    moe = _is_moe(model) or any(t in _ROUTER or t == "experts" for ts in tokens for t in ts)
    found: dict[str, set[str]] = {}
    notes: list[str] = []
    for entry, ts in zip(entries, tokens):
        if entry.strip().lower() in _ALL_LINEAR:
            found.setdefault("attention", set()).add("all")
            found.setdefault("mlp", set()).add("all")
            notes.append(f"{key} {entry}: every nn.Linear, read as attention,mlp" + (_MOE_ALL_LINEAR if moe else ""))
            continue
        named = _named(entry, ts, moe)
        if not named:
            notes.append(f"{key} {entry}: not a module tunecost adapts (attention, mlp, experts, router); left out")
        for group, name in named:
            found.setdefault(group, set()).add(name)
    if not found:
        what = f"{entries[0]!r} is not" if len(entries) == 1 else f"none of {', '.join(entries)} is"
        raise cfg.error(key, f"{what} a module tunecost adapts (attention, mlp, experts, router)")
    if any(n in ("w1", "w2", "w3") for names in found.values() for n in names):
        notes.append(f"{key} w1/w2/w3: read as {'MoE experts' if moe else 'a dense MLP'} (from the model and targets)")
    targets: set[str] = set()
    for group, names in found.items():
        targets.update(narrowed := group_targets(group, names))
        whole = "all" in names or any(set(s.split()) <= names for s in _WHOLE.get(group, ()))
        if narrowed == (group,) and group in _WHOLE and not whole:
            listed = ",".join(sorted(spelled.get(n, n) for n in names))
            notes.append(f"{key} {listed}: tunecost adapts the whole {group} group ({_WHOLE_TEXT[group]}), not only "
                         "the listed ones")  # fmt: skip
    return targets, notes


def _candidates() -> tuple[tuple[str, str, str], ...]:
    """(module path, group, name) a PEFT pattern is matched against (re.fullmatch on a module's name): each
    target name where it sits in a Llama-, Mixtral-, Qwen-MoE- or GPT-style layer."""
    places = {
        "attention": ("self_attn", "attn", "self_attention"),
        "mlp": ("mlp", "mlp.shared_experts", "mlp.shared_expert"),
        "experts": ("block_sparse_moe.experts.0", "mlp.experts.0", "mlp.experts"),
    }
    out = []
    layers = ("model.layers.0", "transformer.h.0", "model.language_model.layers.0", "language_model.model.layers.0")
    for layer in (*layers, *(f"base_model.model.{layer}" for layer in layers)):
        for name, group in _NAME_GROUP.items():
            homes = places[group] + (places["experts"] if group == "mlp" else ())
            out += [
                (f"{layer}.{home}.{name}", "experts" if "experts" in home.split(".") else group, name) for home in homes
            ]
        out += [(f"{layer}.{home}.{n}", "router", "gate") for home in ("block_sparse_moe", "mlp") for n in _ROUTER]
        out += [(f"{layer}.{home}.experts", "experts", "experts") for home in ("block_sparse_moe", "mlp")]
    return tuple(out)


_CANDIDATES = _candidates()
_PATTERN = re.compile(r"[\\\[\]()|*+?^$]")


def _named(entry: str, tokens: list[str], moe: bool) -> list[tuple[str, str]]:
    """(group, module name) of one target: a name or path by its words, a PEFT pattern by the paths it matches."""
    try:
        pattern = re.compile(entry) if _PATTERN.search(entry) else None
    except re.error:
        pattern = None
    if pattern is not None:
        hits = [(g, n) for path, g, n in _CANDIDATES if pattern.fullmatch(path)]
        return list(dict.fromkeys(("experts", n) if g == "mlp" and moe and n in _MOE_FFN else (g, n) for g, n in hits))
    if "experts" in tokens:
        return [("experts", "experts")]
    if set(tokens) & set(_ROUTER):
        return [("router", "gate")]
    return [("experts" if moe and t in _MOE_FFN else _NAME_GROUP[t], t) for t in tokens if t in _NAME_GROUP]


def _is_moe(model: str | None) -> bool:
    """Whether the model has experts: from its config, else from its name."""
    if not model:
        return False
    try:
        return resolve_model(str(model)).is_moe
    except TunecostError:
        return bool(_MOE_NAME.search(str(model)))


# transformers' OptimizerNames -> tunecost's optimizers. adamw_torch_8bit is torchao's AdamW8bit: 8-bit states in
# blocks of 256 with an fp32 scale each, fp32 below 4096 elements, as bitsandbytes' (torchao/optim/adam.py).
OPTIMIZERS = {
    **dict.fromkeys(("adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw", "paged_adamw_32bit"), "adamw"),
    **dict.fromkeys(("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "bnb_8bit", "adamw_torch_8bit"), "adamw-8bit"),
    "adamw_torch_4bit": "adamw-4bit",  # torchao's AdamW4bit
    "sgd": "sgd",
}


def name_list(value: str | list | None) -> list[str]:
    """A comma list or a YAML list of names, as LLaMA-Factory's split_arg and PEFT read them."""
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value or []]
    return [n.strip() for n in items if n.strip()]


def modules_to_save(cfg: ConfigFile, key: str) -> dict[str, Any]:
    """modules_to_save of PEFT's modules_to_save (LLaMA-Factory's additional_target, axolotl's
    lora_modules_to_save): a list or a comma list of module names."""
    names = name_list(cfg.typed(key, (str, list)))
    return {"modules_to_save": ",".join(names)} if names else {}


def optimizer_options(cfg: ConfigFile, key: str, value: str) -> dict[str, Any]:
    """optimizer, and fused_adamw for the Trainer's adamw_torch_fused (torch's AdamW with fused=True)."""
    fused = {"fused_adamw": True} if value.strip().lower() == "adamw_torch_fused" else {}
    return {"optimizer": optimizer_name(cfg, key, value), **fused}


def optimizer_name(cfg: ConfigFile, key: str, value: str) -> str:
    """tunecost's optimizer for a Trainer/bitsandbytes optimizer name; an error for one it does not model."""
    if value.strip().lower() in OPTIMIZERS:
        return OPTIMIZERS[value.strip().lower()]
    names: dict[str, list[str]] = {}
    for name, tunecost in OPTIMIZERS.items():
        names.setdefault(tunecost, []).append(name)
    known = "; ".join(f"{tunecost} ({', '.join(group)})" for tunecost, group in names.items())
    raise cfg.error(key, f"{value!r} is not modelled; tunecost models {known}")


def fp8_options(cfg: ConfigFile, key: str, backend: str | None, torchao_recipe: str, whose: str) -> Part:
    """accelerate's FP8 training (mixed_precision "fp8", the other ops under bf16 autocast) with `backend`: torchao
    Float8Linear with `torchao_recipe`, Transformer Engine (TERecipeKwargs: delayed scaling), or unset / auto
    (torchao where installed, accelerate's first choice)."""
    name = (backend or "auto").strip().lower()
    if name in ("te", "transformer_engine", "transformer-engine"):
        line = (
            f"fp8 te-delayed: {key} {backend}: {whose} Transformer Engine linears with delayed scaling, the rest bf16"
        )
        return {"fp8": "te-delayed", "dtype": "bf16"}, [line]
    if name not in ("auto", "no", "ao", "torchao"):
        raise cfg.error(key, f"{backend}: tunecost models FP8 with torchao (ao) and Transformer Engine (te)")
    auto = "" if name in ("ao", "torchao") else " (backend auto: torchao where installed, accelerate's first choice)"
    line = f"fp8 {torchao_recipe}: {whose} torchao Float8Linear, {torchao_recipe} scaling{auto}, the rest bf16"
    return {"fp8": torchao_recipe, "dtype": "bf16"}, [line]


def deepspeed_options(cfg: ConfigFile, key: str) -> tuple[dict[str, Any], list[str]]:
    """strategy/offload of an inline DeepSpeed dict; for a file path, an assumption line asking for the file."""
    value = cfg.typed(key, (str, dict))
    if value is None:
        return {}, []
    if isinstance(value, str):
        return {}, [f"deepspeed config {value}: {PASS_DEEPSPEED}"]
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


def eval_split_of(cfg: ConfigFile, key: str) -> dict[str, float]:
    """`key`'s evaluation split as a job option (a fraction in [0, 1) or a whole count, as `datasets` takes it)."""
    value = cfg.typed(key, (int, float))
    if value is None or value == 0:
        return {}
    if value < 0 or (value >= 1 and value != int(value)):
        raise cfg.error(key, f"must be a fraction in [0, 1) or a whole count, got {value!r}")
    return {"eval_split": value}
