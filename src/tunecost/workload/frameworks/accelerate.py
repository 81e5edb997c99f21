"""Readers for the launcher files of the Hugging Face stack: accelerate's config YAML (`accelerate config`) and a
DeepSpeed JSON config. Each reports its own file and its own library's defaults only: `--config` merges the files.
"""

# Defaults filled (installed accelerate 1.15.0; DeepSpeed master edaa722 = 0.19.6; transformers 5.23.0):
#   num_machines 1, fsdp_version 1, FSDP1 sharding FULL_SHARD, FSDP2 reshard_after_forward True,
#   DeepSpeed zero_stage 2 (DeepSpeedPlugin), mixed_precision "no" (launch): accelerate commands/config/config_args.py,
#   commands/launch.py, utils/dataclasses.py (FullyShardedDataParallelPlugin, DeepSpeedPlugin)
#   FSDP activation checkpointing non-reentrant: accelerate accelerator.py / utils/fsdp_utils.py (checkpoint_wrapper)
#   zero_optimization.stage 0, offload device "none", bf16/fp16 off: deepspeed runtime/zero/config.py,
#   runtime/zero/offload_config.py, runtime/precision_config.py; tensor_parallel.autotp_size 0 (AutoTP training
#   off): runtime/tensor_parallel/config.py TPTrainingConfig (0.16+)
#   "auto" values: the Trainer's TrainingArguments fill them (transformers integrations/deepspeed.py)
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tunecost.workload.frameworks import ConfigFile, ConfigJob, Framework, KnownKeys, dotted_keys
from tunecost.workload.frameworks.hf import not_modelled
from tunecost.workload.frameworks.hf_common import (
    AUTOTP_STRATEGIES,
    PARALLELISM_CONFIG_STRATEGIES,
    Part,
    fp8_options,
    truthy,
)
from tunecost.workload.parallel import config_node_size

ACCELERATE, DEEPSPEED = "accelerate's", "DeepSpeed's"
ACCELERATE_KEYS = KnownKeys(f"{ACCELERATE} config", ("accelerate",))
DEEPSPEED_KEYS = KnownKeys(f"{DEEPSPEED} config", ("deepspeed",))
# FSDP1 sharding strategies (accelerate's FSDP_SHARDING_STRATEGY, numbered from 1 as torch's ShardingStrategy)
FSDP1 = {"FULL_SHARD": "fsdp1", "SHARD_GRAD_OP": "fsdp2-shard-grad-op", "NO_SHARD": "ddp", "HYBRID_SHARD": "hsdp"}
FSDP1_BY_NUMBER = dict(zip("12345", ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")))
# what the HF Trainer puts in a DeepSpeed "auto" value (transformers integrations/deepspeed.py trainer_config_process)
AUTO = {
    "train_micro_batch_size_per_gpu": "per_device_train_batch_size",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "train_batch_size": "world size x per_device_train_batch_size x gradient_accumulation_steps",
    "bf16.enabled": "bf16",
    "fp16.enabled": "fp16",
}


def section(cfg: ConfigFile, key: str) -> ConfigFile:
    """A nested mapping as a ConfigFile whose errors name the file and section: "FILE: zero_optimization: stage"."""
    return ConfigFile(path=f"{cfg.path}: {key}", data=cfg.typed(key, dict) or {})


def nested_not_modelled(cfg: ConfigFile, *sections: tuple[str, ConfigFile]) -> tuple[str, ...]:
    inner = (f"{name}.{key}" for name, sub in sections for key in not_modelled(sub))
    return tuple(k for k in (*not_modelled(cfg), *inner) if k not in (name for name, _ in sections))


def _gpus(cfg: ConfigFile, distributed: str) -> Part:
    processes, machines = cfg.typed("num_processes", int), cfg.typed("num_machines", int)
    if distributed == "NO":
        return {"num_gpus": 1}, []
    if processes is None or processes < 1:
        return {}, ["num_processes unset: accelerate launch runs one process per visible GPU"]
    if processes % (machines or 1):
        raise cfg.error("num_processes", f"{processes} processes do not fill {machines} machines evenly")
    notes = [] if machines else [f"num_machines 1: {ACCELERATE} default"]
    return {"num_gpus": processes, **config_node_size(processes // (machines or 1), machines or 1)}, notes


def _fsdp(fsdp: ConfigFile) -> Part:
    version = str(fsdp.get("fsdp_version", 1))
    notes = [] if "fsdp_version" in fsdp.data else [f"fsdp_version 1: {ACCELERATE} default (FSDP plugin)"]
    if version == "2":
        reshard = str(fsdp.get("fsdp_reshard_after_forward", True)).lower()
        if reshard not in ("true", "false", "1", "0", "yes", "no"):
            raise fsdp.error("fsdp_reshard_after_forward", f"{reshard}: FSDP2 takes true or false")
        out: dict[str, Any] = {"strategy": "fsdp2" if truthy(reshard) else "fsdp2-shard-grad-op"}
        notes += (
            [] if "fsdp_reshard_after_forward" in fsdp.data else [f"reshard_after_forward true: {ACCELERATE} default"]
        )
    elif version == "1":  # the deprecated fsdp_sharding_strategy wins over fsdp_reshard_after_forward
        key = "fsdp_sharding_strategy" if "fsdp_sharding_strategy" in fsdp.data else "fsdp_reshard_after_forward"
        given = str(fsdp.get(key, "FULL_SHARD")).upper()
        given = FSDP1_BY_NUMBER.get(given, given)
        if given not in FSDP1:
            raise fsdp.error(key, f"{given} is not modelled; tunecost models {', '.join(FSDP1)}")
        out = {"strategy": FSDP1[given]}
        notes += [] if key in fsdp.data else [f"sharding FULL_SHARD: {ACCELERATE} default (FSDP1)"]
        notes += [f"{given}: tunecost models it as {FSDP1[given]}"] if given in ("SHARD_GRAD_OP", "NO_SHARD") else []
    else:
        raise fsdp.error("fsdp_version", f"{version}: FSDP versions are 1 and 2")
    if truthy(fsdp.get("fsdp_offload_params", False)):
        if out["strategy"] not in ("fsdp1", "fsdp2"):
            raise fsdp.error("fsdp_offload_params", f"CPU offload with {out['strategy']} is not modelled")
        out["offload"] = "params"
    if truthy(fsdp.get("fsdp_activation_checkpointing", False)):
        out.update(gradient_checkpointing=True, reentrant=False)
        notes.append("fsdp_activation_checkpointing: FSDP's own, non-reentrant (torch checkpoint_wrapper)")
    return out, notes


def _zero(ds: ConfigFile) -> Part:
    """The DeepSpeed plugin's zero_stage and offload devices, or the DeepSpeed file it names."""
    path = ds.typed("deepspeed_config_file", str)
    if path:
        return {}, [f"deepspeed_config_file {path}: pass that file too (--config); its ZeRO stage is the strategy"]
    stage = ds.typed("zero_stage", int)
    notes = [] if stage is not None else [f"zero_stage 2: {ACCELERATE} default (DeepSpeed plugin)"]
    stage = 2 if stage is None else stage
    return offload_of(ds, stage, "offload_optimizer_device", "offload_param_device", notes)


def offload_of(cfg: ConfigFile, stage: int, optimizer_key: str, param_key: str, notes: list[str]) -> Part:
    """strategy and offload of a ZeRO stage with its optimizer and parameter offload devices (none, cpu, nvme)."""
    if stage not in (0, 1, 2, 3):
        raise cfg.error("zero_stage" if "zero_stage" in cfg.data else "stage", f"{stage}: ZeRO stages are 0 to 3")
    devices = {}
    for key in (optimizer_key, param_key):
        device = str(cfg.get(key) or "none").lower()
        if device not in ("none", "cpu"):
            raise cfg.error(key, f"{device} offload is not modelled; tunecost models none and cpu")
        devices[key] = device == "cpu"
    out: dict[str, Any] = {"strategy": f"zero{stage}" if stage else "ddp"}
    notes += [] if stage else ["ZeRO stage 0: plain data parallelism, tunecost's ddp"]
    if devices[param_key] and stage != 3:
        notes.append(f"{param_key} cpu: DeepSpeed offloads parameters with ZeRO-3 only; ignored")
    if devices[param_key] and stage == 3 and not devices[optimizer_key]:
        # DeepSpeed keeps the fp32 master weights, gradients and optimizer states on the GPU unless
        # offload_optimizer is set (runtime/zero/stage3.py): only the compute-dtype parameter shards move
        raise cfg.error(
            param_key,
            "cpu without the optimizer offloaded: parameter-only offload is not modelled (tunecost models the "
            f"optimizer offloaded, or parameters and optimizer); set {optimizer_key} cpu too, or drop {param_key}",
        )
    if devices[optimizer_key] or (devices[param_key] and stage == 3):
        if not stage:
            raise cfg.error(optimizer_key, "CPU offload needs ZeRO stage 1 to 3")
        out["offload"] = "params" if devices[param_key] and stage == 3 else "optimizer"
    return out, notes


def _check_accelerate_keys(cfg: ConfigFile) -> list[str]:
    """An error for an unknown top-level key (accelerate refuses the file); a note for one inside a section, which
    `accelerate launch` copies onto its arguments where nothing reads it (it adds fsdp_ to fsdp_config's keys)."""
    fsdp = {f"fsdp_config.{k}": f"fsdp_config.fsdp_{k}" for k in dotted_keys(section(cfg, "fsdp_config").data)}
    notes = []
    for key in dotted_keys(cfg.data):
        checked = key if key.startswith("fsdp_config.fsdp") else fsdp.get(key, key)
        unknown = ACCELERATE_KEYS.unknown(checked)
        if unknown is not None and "." not in unknown:
            raise cfg.error(unknown, ACCELERATE_KEYS.not_a_key(unknown))
        if unknown is not None:
            notes.append(f"{key}: {ACCELERATE_KEYS.not_a_key(unknown)}; ignored, as `accelerate launch` ignores it")
    return notes


def _parallelism(cfg: ConfigFile, out: dict[str, Any], notes: list[str]) -> ConfigFile:
    """tp, cp, the GPUs and the data-parallel layout of a parallelism_config section (accelerate's
    ParallelismConfig: every size 1 unless set, their product the processes; HSDP where shards are replicated)."""
    par = section(cfg, "parallelism_config")
    sizes = {}
    for name in ("dp_replicate", "dp_shard", "tp", "cp", "sp"):
        key = f"parallelism_config_{name}_size"
        sizes[name] = par.typed(key, int, 1)
        if sizes[name] < 1:
            raise par.error(key, f"must be at least 1, got {sizes[name]}")
    if sizes["sp"] > 1:
        raise par.error("parallelism_config_sp_size", f"{sizes['sp']}: ALST/Ulysses sequence parallelism "
                        "(DeepSpeed, all-to-all heads) is not modelled; context parallelism (cp_size) is")  # fmt: skip
    total = math.prod(sizes.values())
    if total == 1:
        return par
    if out.get("num_gpus", total) != total:
        raise par.error("parallelism_config_dp_shard_size", f"the sizes' product {total} is not num_processes "
                        f"{out['num_gpus']} (accelerate checks they are equal)")  # fmt: skip
    out["num_gpus"] = total
    strategy, inner = out.get("strategy"), sizes["tp"] * sizes["cp"]
    if inner > 1 and strategy not in ("fsdp2", "fsdp2-shard-grad-op", "ddp"):
        raise par.error("parallelism_config_tp_size" if sizes["tp"] > 1 else "parallelism_config_cp_size",
                        "tensor and context parallelism run with FSDP2 or MULTI_GPU (ParallelismConfig)")  # fmt: skip
    if sizes["tp"] > 1:
        out.update(tp=sizes["tp"], sequence_parallel=False)
        notes.append(f"tp {sizes['tp']}: transformers' tp_plan; sequence parallelism off (the norms are not sharded)")
    if sizes["cp"] > 1:
        out["cp"] = sizes["cp"]
        notes.append(f"cp {sizes['cp']}: torch's context parallelism (ring attention), as tunecost models it")
    shard = sizes["dp_shard"] * sizes["cp"]  # FSDP2 shards over dp_shard x cp
    if strategy in ("fsdp2", "fsdp2-shard-grad-op") and shard == 1:
        raise par.error("parallelism_config_dp_shard_size", "1 with cp_size 1 under FSDP: nothing to shard over")
    if strategy in ("fsdp2", "fsdp2-shard-grad-op") and sizes["dp_replicate"] > 1:
        out.update(strategy="hsdp", gpus_per_node=shard * sizes["tp"])
        notes.append(f"hsdp: dp_replicate_size {sizes['dp_replicate']} copies of shard groups of {shard}; "
                     f"gpus_per_node {shard * sizes['tp']} (tunecost's HSDP shards within a node)")  # fmt: skip
    return par


def _read_accelerate(cfg: ConfigFile) -> ConfigJob:
    ignored = _check_accelerate_keys(cfg)
    distributed = (cfg.typed("distributed_type", str) or "").upper()
    if distributed not in ("NO", "MULTI_GPU", "FSDP", "DEEPSPEED"):
        raise cfg.error("distributed_type", f"{distributed} is not modelled (NO, MULTI_GPU, FSDP, DEEPSPEED)")
    if cfg.typed("use_cpu", bool):
        raise cfg.error("use_cpu", "true: tunecost estimates GPU jobs")
    out, notes = _gpus(cfg, distributed)
    precision = str(cfg.get("mixed_precision") or "no").lower()
    if precision not in ("no", "bf16", "fp16", "fp8"):
        raise cfg.error("mixed_precision", f"{precision} is not modelled; tunecost models bf16, fp16, fp8 and no")
    fp8 = section(cfg, "fp8_config")
    if precision == "fp8":
        more, lines = fp8_options(fp8, "backend", fp8.typed("backend", str), "tensorwise", ACCELERATE)
        lines.append("mixed_precision fp8: an HF Trainer keeps it only with bf16 and fp16 false in its arguments "
                     "(TrainingArguments sets its mixed precision from those first)")  # fmt: skip
        lines.append("dtype bf16: accelerate's fp8 runs the ops outside the FP8 linears under bf16 autocast")
        out, notes = {**out, **more}, notes + lines
    elif precision == "no":  # the Trainer's bf16/fp16 still turn mixed precision on: no dtype from this file
        unset = "" if "mixed_precision" in cfg.data else f" ({ACCELERATE} default)"
        notes.append(f"mixed_precision no{unset}: accelerate adds none; the script's bf16/fp16, else fp32, decides")
    else:
        out["dtype"] = precision
    fsdp, ds = section(cfg, "fsdp_config"), section(cfg, "deepspeed_config")
    if distributed == "MULTI_GPU":
        out["strategy"] = "ddp"
    elif distributed in ("FSDP", "DEEPSPEED"):
        more, lines = _fsdp(fsdp) if distributed == "FSDP" else _zero(ds)
        out, notes = {**out, **more}, notes + lines
    par = _parallelism(cfg, out, notes)
    sections = (("fsdp_config", fsdp), ("deepspeed_config", ds), ("fp8_config", fp8), ("parallelism_config", par))
    unused = nested_not_modelled(cfg, *sections)
    skip = (
        "compute_environment",
        "machine_rank",
        "main_",
        "rdzv_",
        "same_network",
        "debug",
        "downcast",
        "tpu_",
        "gpu_ids",
    )
    return ConfigJob(
        framework=FRAMEWORK_ACCELERATE.name,
        path=cfg.path,
        options=out,
        assumptions=(*notes, *ignored),
        not_modelled=tuple(k for k in unused if not k.startswith(skip)),
    )


def _auto_lines(cfg: ConfigFile) -> list[str]:
    """One line per "auto" value: what the HF Trainer fills it with; a DeepSpeed file alone cannot resolve them."""
    flat = {k: v for k, v in cfg.data.items() if not isinstance(v, dict)}
    flat |= {f"{k}.{n}": v for k, sub in cfg.data.items() if isinstance(sub, dict) for n, v in sub.items()}
    flat |= {f"optimizer.params.{n}": v for n, v in ((cfg.data.get("optimizer") or {}).get("params") or {}).items()}
    autos = [k for k, v in flat.items() if v == "auto"]
    lines = [f"{k} auto: the Trainer's {AUTO[k]}" for k in autos if k in AUTO]
    rest = [k for k in autos if k not in AUTO]
    return lines + ([f"{', '.join(rest)} auto: the Trainer fills them (TrainingArguments, model size)"] if rest else [])


def _ds_precision(cfg: ConfigFile) -> Part:
    """dtype of the bf16 (or old bfloat16) and fp16 sections; "auto" or no section leaves it to the launcher."""
    flags = {}
    for name, key in (("bf16", "bf16" if "bf16" in cfg.data else "bfloat16"), ("fp16", "fp16")):
        if key in cfg.data:
            sub = section(cfg, key)
            flags[name] = sub.get("enabled", False)
            if flags[name] != "auto" and not isinstance(flags[name], bool):
                raise sub.error("enabled", f"must be true, false or auto, got {flags[name]!r}")
    if not flags:
        return {}, ["no bf16/fp16 section: accelerate fills one from its mixed_precision (DeepSpeed alone: fp32)"]
    if "auto" in flags.values():
        return {}, []
    return {"dtype": "bf16" if flags.get("bf16") else "fp16" if flags.get("fp16") else "fp32"}, []


def _ignored_keys(cfg: ConfigFile) -> list[str]:
    """A note per top-level key DeepSpeed does not read (a comment, another version's key): its config ignores
    them, and so does tunecost; keys inside its sections are checked."""
    keys = dotted_keys(cfg.data)
    ignored = [k for k in dict.fromkeys(k.split(".")[0] for k in keys) if DEEPSPEED_KEYS.unknown(k) == k]
    cfg.check_keys(DEEPSPEED_KEYS, [k for k in keys if k.split(".")[0] not in ignored])
    cfg.used.update(ignored)
    return [f"{k}: {DEEPSPEED_KEYS.not_a_key(k)}; ignored, as DeepSpeed ignores it at the top level" for k in ignored]


def _stated_batch(cfg: ConfigFile, micro: int | None, notes: list[str]) -> dict[str, Any]:
    """grad_accum of a stated gradient_accumulation_steps, and the GPUs a stated train_batch_size then implies
    (DeepSpeed: train_batch_size = micro-batch x accumulation x world size, checked at start-up)."""
    accum = None if cfg.get("gradient_accumulation_steps") == "auto" else cfg.typed("gradient_accumulation_steps", int)
    if accum is not None and accum < 1:
        raise cfg.error("gradient_accumulation_steps", f"must be at least 1, got {accum}")
    out: dict[str, Any] = {} if accum is None else {"grad_accum": accum}
    total = None if cfg.get("train_batch_size") == "auto" else cfg.typed("train_batch_size", int)
    if total is not None and micro is not None and accum is not None:
        if total % (micro * accum):
            raise cfg.error("train_batch_size", f"{total} is not micro-batch {micro} x accumulation {accum} x GPUs")
        out["num_gpus"] = total // (micro * accum)
        notes.append(
            f"num_gpus {out['num_gpus']}: train_batch_size {total} / (micro-batch {micro} x accumulation {accum})"
        )
    return out


def _read_deepspeed(cfg: ConfigFile) -> ConfigJob:
    notes = _ignored_keys(cfg) + _auto_lines(cfg)
    out: dict[str, Any] = {}
    if cfg.get("train_micro_batch_size_per_gpu") != "auto":
        micro = cfg.typed("train_micro_batch_size_per_gpu", int)
        out.update({} if micro is None else {"batch_size": micro})
        if micro is None and cfg.get("train_batch_size") not in (None, "auto"):
            notes.append("train_batch_size: the micro-batch is train_batch_size / (GPUs x gradient_accumulation_steps)")
    out |= _stated_batch(cfg, out.get("batch_size"), notes)
    zero = section(cfg, "zero_optimization")
    stage = zero.typed("stage", int)
    notes += [] if stage is not None else [f"zero_optimization.stage 0: {DEEPSPEED} default"]
    offload = {k: section(zero, k) for k in ("offload_optimizer", "offload_param")}
    devices = ConfigFile(path=zero.path, data={k: sub.get("device") for k, sub in offload.items()})
    for part in (offload_of(devices, stage or 0, "offload_optimizer", "offload_param", []), _ds_precision(cfg)):
        out.update(part[0])
        notes += part[1]
    tensor_parallel = section(cfg, "tensor_parallel")
    tp = tensor_parallel.typed("autotp_size", int)
    if tp is not None and tp < 0:
        raise tensor_parallel.error("autotp_size", f"must be 0 (off) or more, got {tp}")
    if tp is not None and tp > 1:
        out.update(tp=tp, sequence_parallel=False)
        notes.append("sequence parallelism off: DeepSpeed's AutoTP all-reduces the row-parallel layers' outputs")
    optimizer = section(cfg, "optimizer")
    kind = str(optimizer.get("type") or "").lower()
    if kind and kind not in ("adam", "adamw", "sgd"):
        raise optimizer.error("type", f"{optimizer.data['type']} is not modelled; tunecost models Adam(W) and SGD")
    out.update({"optimizer": "sgd" if kind == "sgd" else "adamw"} if kind else {})
    notes += [] if kind else ["no optimizer section: the Trainer's optim (TrainingArguments) runs"]
    optimizer.get("params")
    if cfg.get("activation_checkpointing"):
        notes.append(
            "activation_checkpointing section: DeepSpeed's checkpointing for models that call it "
            "(Megatron-style); the Trainer's gradient_checkpointing decides for HF models"
        )
    subs = [("zero_optimization", zero), *((f"zero_optimization.{k}", s) for k, s in offload.items())]
    unused = nested_not_modelled(cfg, *subs, ("optimizer", optimizer), ("tensor_parallel", tensor_parallel))
    return ConfigJob(
        framework=FRAMEWORK_DEEPSPEED.name, path=cfg.path, options=out, assumptions=tuple(notes), not_modelled=unused
    )


def detect_accelerate(data: Mapping[str, Any]) -> bool:
    keys = ("compute_environment", "num_processes", "mixed_precision", "machine_rank", "num_machines")
    return "distributed_type" in data and any(k in data for k in keys)


def detect_deepspeed(data: Mapping[str, Any]) -> bool:
    """zero_optimization, a DeepSpeed batch size, or a bf16/fp16 section with "enabled"; no launcher/Trainer keys."""
    sections = any(isinstance(data.get(k), dict) and "enabled" in data[k] for k in ("bf16", "bfloat16", "fp16"))
    ours = any(k in data for k in ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size"))
    return (ours or sections) and not any(k in data for k in ("distributed_type", "per_device_train_batch_size"))


FRAMEWORK_ACCELERATE = Framework(
    name="accelerate",
    title="accelerate config",
    suffixes=(".yaml", ".yml", ".json"),
    detect=detect_accelerate,
    read=_read_accelerate,
    model_parallel=("tp", "cp"),  # parallelism_config
    tp_shards_norms=False,
    tp_strategies=PARALLELISM_CONFIG_STRATEGIES,
)
FRAMEWORK_DEEPSPEED = Framework(
    name="deepspeed",
    title="DeepSpeed",
    suffixes=(".json",),
    detect=detect_deepspeed,
    read=_read_deepspeed,
    model_parallel=("tp",),  # tensor_parallel.autotp_size (AutoTP training)
    tp_shards_norms=False,
    tp_strategies=AUTOTP_STRATEGIES,
)
FRAMEWORKS = (FRAMEWORK_ACCELERATE, FRAMEWORK_DEEPSPEED)
