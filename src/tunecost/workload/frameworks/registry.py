"""Which framework wrote a config, and one job from several files (a Trainer's args beside its PEFT and DeepSpeed
files): each file read by its framework, the options merged, a contradiction between files one error."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tunecost.catalog.torchtune_configs import find_torchtune_config, torchtune_configs
from tunecost.errors import TunecostError
from tunecost.workload.frameworks import (
    PASS_DEEPSPEED,
    ConfigFile,
    ConfigJob,
    Framework,
    global_batch_divides,
    parse_config_file,
    torchtune,
)
from tunecost.workload.frameworks.accelerate import FRAMEWORK_DEEPSPEED
from tunecost.workload.frameworks.hf import BOTH_OFF
from tunecost.workload.frameworks.llamafactory import UPCASTS
from tunecost.workload.job import fp32_strategies
from tunecost.workload.parallel import ModelParallel, ParallelPlan

READER_MODULES = (
    "llamafactory",
    "llamafactory_v1",
    "axolotl",
    "torchtune",
    "litgpt",
    "torchtitan",
    "nemo",
    "hf",
    "adapters",
    "accelerate",
)


def frameworks() -> list[Framework]:
    """Every reader, in the order files are matched against them."""
    out: list[Framework] = []
    for name in READER_MODULES:
        module = importlib.import_module(f"tunecost.workload.frameworks.{name}")
        out += list(getattr(module, "FRAMEWORKS", ())) or [module.FRAMEWORK]
    return out


def check_global_batch(framework: str | None, options: dict[str, Any], num_gpus: int) -> None:
    """`frameworks.global_batch_divides` for the framework named `framework` (none, or one without the check: none)."""
    known = next((f for f in frameworks() if f.name == framework), None)
    if known is not None and known.global_batch_key is not None:
        global_batch_divides(known.global_batch_key, known.title, options, num_gpus)


def runnable_strategies(strategies: Sequence[str], framework: str | None) -> tuple[list[str], list[str]]:
    """Of `strategies`, those the job's framework (a config's, "a+b" for files read together) runs, with a note
    on the rest ("single", one GPU, always stays); all of them for a framework that runs every one."""
    runs = _restricting(framework, lambda f: bool(f.strategies))
    if runs is None:
        return list(strategies), []
    kept = [s for s in strategies if s in runs.strategies or s == "single"]
    dropped = [s for s in strategies if s not in kept]
    return kept, [f"{', '.join(dropped)}: not searched, {runs.strategies_why}"] if dropped else []


def runnable_layouts(choices: Sequence[ModelParallel], framework: str | None) -> list[ModelParallel]:
    """Of the searched model-parallel `choices`, those whose dimensions the job's framework runs (torchtune: TP and
    CP, no pipeline; litgpt: neither), TP without sequence parallelism where its TP shards no norms; all of them
    for a framework that runs every one."""
    runs = _restricting(framework, lambda f: f.model_parallel is not None)
    if runs is None:
        return list(choices)
    dims = runs.model_parallel or ()
    kept = [c for c in choices if all(getattr(c, d) == 1 or d in dims for d in ("tp", "pp", "cp"))]
    return (
        kept
        if runs.tp_shards_norms
        else list(dict.fromkeys(dataclasses.replace(c, sequence_parallel=False) for c in kept))
    )


def runnable_plans(plans: Sequence[ParallelPlan], framework: str | None) -> tuple[list[ParallelPlan], list[str]]:
    """Of `plans`, those whose TP the job's framework runs beside their data-parallel strategy (the HF stack's:
    FSDP2, or DeepSpeed AutoTP with ZeRO 0 to 2), with a note on the rest."""
    runs = _restricting(framework, lambda f: f.tp_strategies is not None)
    if runs is None or runs.tp_strategies is None:
        return list(plans), []
    kept = [p for p in plans if p.tp == 1 or p.strategy in runs.tp_strategies]
    if len(kept) == len(plans):
        return kept, []
    return kept, [f"TP beside other strategies: not searched, {runs.title}'s TP runs beside "
                  f"{', '.join(runs.tp_strategies)} only"]  # fmt: skip


def _restricting(framework: str | None, restricts: Callable[[Framework], bool]) -> Framework | None:
    """The first reader of `framework` ("a+b" for files read together) that `restricts` the search; None without."""
    if not framework:
        return None
    readers = {f.name: f for f in frameworks()}
    return next((readers[n] for n in framework.split("+") if n in readers and restricts(readers[n])), None)


def read_config(path: str | Path) -> ConfigJob:
    """One file, read by the framework whose config it is; a name `tune run` takes (`llama2/7B_lora`) where no
    such file exists, read as torchtune ships that config."""
    shipped = None if Path(path).exists() else find_torchtune_config(str(path))
    if shipped is not None:
        job = torchtune.FRAMEWORK.read(ConfigFile(path=f"torchtune's {shipped.name}", data=shipped.config))
        line = f"torchtune config {shipped.name}: as it ships for `tune run {shipped.recipe}` ({shipped.source})"
        notes = job.assumptions
        options = job.options
        if shipped.recipe.endswith("_single_device"):  # the file leaves the GPUs to the recipe: here it is known
            one = f"num_gpus 1: `tune run {shipped.recipe}` trains on one (--gpus prices its distributed recipe)"
            notes = tuple(one if a == torchtune.GPUS_UNSAID else a for a in notes)
        elif torchtune.GPUS_UNSAID in notes:  # a distributed recipe: FSDP2 over every rank (data_parallel_shard_dim -1)
            options = {**options, "strategy": "fsdp2"}
            every = (
                f"strategy fsdp2: `tune run {shipped.recipe}` shards over every GPU (--gpus N, or the fewest that fit)"
            )
            notes = tuple(every if a == torchtune.GPUS_UNSAID else a for a in notes)
        return dataclasses.replace(job, options=options, assumptions=(line, *notes))
    if not Path(path).exists() and not Path(path).suffix:
        close = difflib.get_close_matches(str(path), torchtune_configs(), n=3)
        hint = f" (close: {', '.join(close)})" if close else ""
        raise TunecostError(f"{path}: no such file, nor a config torchtune ships{hint}")
    data = parse_config_file(path)
    known = frameworks()
    matches = [f for f in known if f.detect(data)]
    if not matches:
        titles = ", ".join(dict.fromkeys(f.title for f in known))
        raise TunecostError(f"{path}: not a config tunecost reads (it reads {titles})")
    return matches[0].read(ConfigFile(path=str(path), data=data))


def defaulted(job: ConfigJob, name: str) -> bool:
    """Whether `job` filled option `name` with its framework's default (its assumptions name it first)."""
    return any(a.startswith((f"{name} ", f"{name}:")) for a in job.assumptions)


def merge_configs(jobs: Sequence[ConfigJob]) -> ConfigJob:
    """The job several files describe together: a value a file states wins over another file's default (the
    Trainer's fp32 default beside accelerate's bf16); two stated values that differ are an error (a PEFT adapter's
    lora beside a 4-bit BitsAndBytesConfig is qlora)."""
    options: dict[str, object] = {}
    source: dict[str, ConfigJob] = {}
    for job in jobs:
        for name, value in job.options.items():
            old = options.get(name)
            if name in options and defaulted(job, name) and not defaulted(source[name], name):
                continue  # a default beside a stated value: the stated one stands, with no assumption
            if name in options and old != value:
                if name == "method" and {old, value} == {"lora", "qlora"}:
                    value = "qlora"
                elif defaulted(job, name):
                    continue
                elif not defaulted(source[name], name):
                    raise TunecostError(f"{job.path}: {name} is {value!r} but {source[name].path} says {old!r}")
            options[name], source[name] = value, job
    kept = {(name, id(job)) for name, job in source.items()}
    precision = _trainer_precision_first(jobs, options)
    if options.get("fp32_params") and not _fp32_holds(jobs, options):
        options.pop("fp32_params")  # DeepSpeed's engine casts its module to its dtype
    if any(j.framework == "llamafactory" for j in jobs) and options.get("strategy") == "fsdp2":
        options["reentrant"] = False  # model_utils/checkpointing.py, under accelerate's FSDP_VERSION 2
        precision.append(f"reentrant off: {FSDP2_NOT_REENTRANT}")
    return ConfigJob(
        framework="+".join(dict.fromkeys(j.framework for j in jobs)),
        path=", ".join(j.path for j in jobs),
        options=options,
        assumptions=(
            *(
                a
                for j in jobs
                for a in j.assumptions
                if _kept(a, j, kept) and _asked(a, jobs) and _holds(a, jobs, options)
            ),
            *precision,
            *_other_deepspeed(jobs),
        ),
        not_modelled=tuple(k for j in jobs for k in j.not_modelled),
        architecture=next((j.architecture for j in jobs if j.architecture is not None), None),
    )


def _trainer_precision_first(jobs: Sequence[ConfigJob], options: dict[str, object]) -> list[str]:
    """The HF Trainer's precision beside accelerate's fp8: TrainingArguments.__post_init__ takes bf16 or fp16 (TRL's
    SFTConfig: bf16 by default) before accelerate's mixed precision, so the run is not FP8; with both false it
    takes accelerate's fp8, under bf16 autocast."""
    trainer = next((j for j in jobs if j.framework == "hf-training-args"), None)
    fp8 = next((j for j in jobs if j.framework == "accelerate" and "fp8" in j.options), None)
    if trainer is None or fp8 is None:
        return []
    if any(BOTH_OFF in line for line in trainer.assumptions):
        options["dtype"] = "bf16"
        return []
    options.pop("fp8", None)
    return [f"fp8 none: {trainer.path} runs {trainer.options['dtype']}, which the Trainer sets before {fp8.path}'s fp8"]


def configs_of(paths: Sequence[str | Path], names: Sequence[str]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Framework name -> (path, data) of the first of `paths` that is that framework's config, for each of `names`
    some file is (each file parsed once), to start a recipe from."""
    readers = [f for f in frameworks() if f.name in names]
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for path in (p for p in paths if Path(p).is_file()):
        data = parse_config_file(path)
        for reader in readers:
            if reader.name not in found and reader.detect(data):
                found[reader.name] = (str(path), data)
    return found


def read_configs(paths: Sequence[str | Path]) -> ConfigJob:
    jobs = [read_config(p) for p in paths]
    return merge_configs([*jobs, *_named_deepspeed(jobs)])


def _named_deepspeed(jobs: Sequence[ConfigJob]) -> list[ConfigJob]:
    """The DeepSpeed file a config names, read where it is a file (from the current folder, as the launcher reads
    it, else beside the config), unless a DeepSpeed file was given."""
    for job in jobs if not any(j.framework == "deepspeed" for j in jobs) else ():
        for named in filter(None, map(_deepspeed_file_named, job.assumptions)):
            found = next((p for p in (Path(named), Path(job.path).parent / named) if p.is_file()), None)
            if found is None:
                continue
            try:
                ds = FRAMEWORK_DEEPSPEED.read(ConfigFile(path=str(found), data=parse_config_file(found)))
            except TunecostError as err:
                raise TunecostError(f"{job.path} names DeepSpeed file {named}: {err}") from None
            line = f"deepspeed config {named}: read" + (f" from {found}" if found != Path(named) else "")
            return [dataclasses.replace(ds, assumptions=(line, *ds.assumptions))]
    return []


def _deepspeed_file_named(assumption: str) -> str | None:
    """The file of a line asking for a config's DeepSpeed file ("deepspeed config X (...): pass it too ...")."""
    if not (assumption.startswith("deepspeed config ") and assumption.endswith(PASS_DEEPSPEED)):
        return None
    named = assumption.removeprefix("deepspeed config ").removesuffix(f": {PASS_DEEPSPEED}")
    return re.sub(r" \([^()]*\)$", "", named)


def _other_deepspeed(jobs: Sequence[ConfigJob]) -> list[str]:
    """A line where a config names a DeepSpeed file by a name none of the given DeepSpeed files has: the given one
    is priced in its place (axolotl's `deepspeed: zero2.json` beside `--config zero3_offload.json`)."""
    given = [j for j in jobs if j.framework == "deepspeed"]
    out = []
    for job in jobs if given else ():
        for named in filter(None, map(_deepspeed_file_named, job.assumptions)):
            if named.endswith(".json") and all(Path(named).name != Path(ds.path).name for ds in given):
                out.append(f"strategy: {job.path} names DeepSpeed file {named}; {given[0].path} is priced instead")
    return out


FSDP2_NOT_REENTRANT = "LLaMA-Factory sets use_reentrant_gc false under FSDP2 (model_utils/checkpointing.py)"


def _fp32_holds(jobs: Sequence[ConfigJob], options: dict[str, object]) -> bool:
    """Whether fp32 parameters stay so: one GPU, DDP or FSDP (`fp32_strategies`), with no DeepSpeed engine (which
    casts its module to its own dtype) among the files."""
    held = fp32_strategies(str(options.get("method", "full")))
    return options.get("strategy", "single") in held and not any(j.framework == "deepspeed" for j in jobs)


def _holds(assumption: str, jobs: Sequence[ConfigJob], options: dict[str, object]) -> bool:
    """A config's fp32 parameters hold only without DeepSpeed (`_fp32_holds`), which a file read beside it can set;
    LLaMA-Factory's re-entrant checkpointing not under FSDP2."""
    if assumption.startswith("reentrant on") and options.get("reentrant") is False:
        return False
    return not ((UPCASTS in assumption or assumption.startswith("fp32_params:")) and not _fp32_holds(jobs, options))


def _asked(assumption: str, jobs: Sequence[ConfigJob]) -> bool:
    """A line asking for the DeepSpeed file is dropped once a DeepSpeed file is among the configs."""
    return not (assumption.endswith(PASS_DEEPSPEED) and any(j.framework == "deepspeed" for j in jobs))


def _kept(assumption: str, job: ConfigJob, kept: set[tuple[str, int]]) -> bool:
    """An assumption about a default another file overrode is dropped."""
    name = assumption.split(" ", 1)[0].rstrip(":")
    return name not in {n for n, _ in kept} or (name, id(job)) in kept


def _llamafactory(model: str, method: str) -> dict[str, object]:
    data: dict[str, object] = {"model_name_or_path": model, "stage": "sft"}
    data["finetuning_type"] = "full" if method == "full" else "lora"
    if method == "qlora":
        data["quantization_bit"] = 4
    return data


def _axolotl(model: str, method: str) -> dict[str, object]:
    data: dict[str, object] = {"base_model": model, "datasets": []}
    if method != "full":
        data["adapter"] = method
    if method == "qlora":
        data["load_in_4bit"] = True
    return data


def _torchtune(model: str, method: str) -> dict[str, object] | None:
    """A torchtune LoRA/QLoRA recipe as its shipped configs set it (`*_lora_single_device.yaml`): activation
    checkpointing on, LoRA on attention and MLP (`apply_lora_to_mlp: True`), the builder's rank 8 and alpha 16; the
    builder stands for any model. Its full fine-tune configs differ per GPU (low-memory 8-bit optimizers): none."""
    if method not in ("lora", "qlora"):
        return None
    lora = {"lora_attn_modules": ["q_proj", "v_proj", "output_proj"], "apply_lora_to_mlp": True}
    model_cfg = {"_component_": f"torchtune.models.llama2.{method}_llama2_7b", **lora}
    return {"model": model_cfg, "dtype": "bf16", "enable_activation_checkpointing": True}


def _nemo(model: str, method: str) -> dict[str, object]:
    """A NeMo 1.x GPT config (Megatron Core), its reader filling NeMo's defaults: no activation recomputation;
    LoRA (`model.peft`) rank 32 on the fused QKV projection."""
    model_cfg: dict[str, object] = {"mcore_gpt": True, "micro_batch_size": 1}
    if method != "full":
        model_cfg["peft"] = {"peft_scheme": "lora"}
    return {"trainer": {}, "model": model_cfg}


def _hf_trainer(model: str, method: str) -> dict[str, object]:
    """transformers' TrainingArguments as the HF Trainer (and DeepSpeed or accelerate around it) runs them by
    default: gradient checkpointing off."""
    return {"output_dir": "out", "per_device_train_batch_size": 8}


def _none(model: str, method: str) -> None:
    """A framework whose defaults tunecost does not read (NeMo AutoModel, named "nemo" too)."""
    return None


_HF_TRAINER = ("transformers", "hf trainer", "hf-trainer", "accelerate", "deepspeed")

# a framework named in a stack cell, the smallest config of it (its reader fills the framework's defaults), whose
# defaults they are, and the options the config states only to be read (not defaults)
_NAMED_FRAMEWORKS: tuple[tuple[str, Callable[[str, str], dict[str, object] | None], str, tuple[str, ...]], ...] = (
    ("llama-factory", _llamafactory, "", ()),
    ("llamafactory", _llamafactory, "", ()),
    ("axolotl", _axolotl, "", ()),
    ("torchtune", _torchtune, "as torchtune's shipped LoRA configs set it", ("model",)),
    ("automodel", _none, "", ()),
    ("nemo", _nemo, "", ()),
    ("megatron", _nemo, "", ()),
    # their own defaults (TRL's SFTConfig: checkpointing on in recent versions, off in older ones), not read
    *((name, _none, "", ()) for name in ("trl", "sft", "swift", "unsloth", "finetune.py")),
    *((name, _hf_trainer, "transformers TrainingArguments' default", ("batch_size",)) for name in _HF_TRAINER),
)


def framework_defaults(stack_cell: str, model: str, method: str) -> ConfigJob | None:
    """What a framework named in `stack_cell` does by default for `method` on `model` (None: no framework tunecost
    reads is named), for a published run that leaves a setting to its framework; `framework` says whose default."""
    key = stack_cell.strip().lower()
    named = next((n for n in _NAMED_FRAMEWORKS if n[0] in key), None)
    if named is None:
        return None
    _, build, label, stated = named
    data = build(model, method)
    if data is None:
        return None
    framework = next(f for f in frameworks() if f.detect(data))
    try:
        job = framework.read(ConfigFile(path=f"{framework.title} defaults", data=data))
    except TunecostError:
        return None
    options = {k: v for k, v in job.options.items() if k not in stated}
    return dataclasses.replace(job, framework=label or f"{framework.title}'s default", options=options)
