"""`--config FILE` on the job commands: read first (an eager option), its job options (and, for a command that
takes --framework, its framework) become the command's defaults (click's `default_map`), so flags override them
and each is converted as the flag would be; the defaults the framework filled and the keys tunecost does not model
are printed on stderr."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from tunecost.catalog.datasets import TRAIN_SPLIT, find_dataset_facts
from tunecost.cli.common import err_console
from tunecost.cli.options import CONFIG_OPTIONS, CONFIG_PATH, ParameterSource, get_current_context, opt
from tunecost.errors import TunecostError
from tunecost.workload.known_datasets import data_files
from tunecost.workload.parallel import ModelParallel, micro_batches_per_step

if TYPE_CHECKING:
    from tunecost.workload.frameworks.megatron_model import Architecture

CONFIG_HELP = (
    "Your framework's training config: LLaMA-Factory or axolotl YAML, a torchtune recipe config (a file, or the "
    "name of one torchtune ships: llama3_1/8B_lora_single_device), HF TrainingArguments / "
    "SFTConfig, PEFT adapter_config.json, BitsAndBytesConfig, accelerate YAML, DeepSpeed JSON, litgpt YAML, "
    "torchtitan TOML or NeMo / Megatron-LM YAML; repeat for files read together. Flags override it."
)


def _read_config(ctx: typer.Context, paths: list[Path] | None) -> list[Path] | None:
    """The config's job options as the command's defaults, before any other option is read."""
    if not paths:
        return paths
    from tunecost.workload.frameworks import DERIVED_ACCUMULATION
    from tunecost.workload.frameworks.model_parallel import PLAN_OPTIONS
    from tunecost.workload.frameworks.registry import read_configs

    try:
        job = read_configs(paths)
    except TunecostError as exc:
        raise typer.BadParameter(str(exc)) from None
    params = {p.name for p in ctx.command.params}
    options = {**job.options, "framework": job.framework, **_aliases(job.options, params)}
    ctx.default_map = {**(ctx.default_map or {}), **{k: v for k, v in options.items() if k in params}}
    ctx.meta[CONFIG_OPTIONS] = job.options
    ctx.meta[CONFIG_PATH] = job.path
    ctx.meta[CONFIG_ARCHITECTURE] = job.architecture
    # a framework's defaults; grad_accum from a stated global batch is the config's (`frameworks.accumulation`)
    defaulted = (_subject(line) for line in job.assumptions if DERIVED_ACCUMULATION not in line)
    ctx.meta[CONFIG_DEFAULTED] = frozenset(defaulted)
    notes = [(_option_of(line, params), f"assumed: {line}") for line in job.assumptions]
    method = next((p for p in ctx.command.params if p.name == "method"), None)
    said = any(line.startswith("method") for line in job.assumptions)  # the reader's own line on the method
    if method is not None and "method" not in job.options:  # e.g. an accelerate or DeepSpeed file
        default = "all three weighed" if method.default is None else method.default
        line = f"method: {job.path} does not say; --method decides (default {default})"
        notes.append(("method", f"assumed: method {default}: --method's default" if said else f"assumed: {line}"))
    if job.not_modelled:
        notes.append((None, f"warning: not modelled from {job.path}: {', '.join(job.not_modelled)}"))
    taken_elsewhere = (*PLAN_OPTIONS, "modules_to_save")  # options only some commands take (a layout: estimate)
    weighed = LAYOUT_OPTIONS if ctx.info_name == "plan" else ()  # plan weighs them among its layouts (`config_layout`)
    ignored = [f"{k} {job.options[k]}" for k in taken_elsewhere if k in job.options and k not in (*params, *weighed)]
    if ignored:
        notes.append((None, f"warning: this command does not take {', '.join(ignored)} from {job.path} (ignored)"))
    ctx.meta[CONFIG_NOTES] = notes
    return paths


def _subject(line: str) -> str:
    """The job option an assumption line is about: its first word ("packing per-document: ...")."""
    return line.split(" ", 1)[0].rstrip(":")


def _option_of(line: str, params: set[str]) -> str | None:
    """The command's option an assumption line is about (`_subject`), None where the command has no such option."""
    word = _subject(line)
    return word if word in params else None


def print_config_notes(ctx: typer.Context) -> None:
    """The config's assumption and warning lines on stderr, once every option is read: a line about an option the
    command line gives is left out, as the flag replaces the config's value. A config that does not say full,
    LoRA or QLoRA is an error where the command prices one method and --method is not given."""
    method = next((p for p in ctx.command.params if p.name == "method"), None)
    config = ctx.meta.get(CONFIG_OPTIONS)
    unsaid = config is not None and "method" not in config and method is not None and method.default is not None
    if unsaid and ctx.get_parameter_source("method") != ParameterSource.COMMANDLINE:
        raise typer.BadParameter(
            f"{ctx.meta.get(CONFIG_PATH)} does not say full, LoRA or QLoRA (no PEFT, bitsandbytes or adapter key in "
            "the files given); give --method full, lora or qlora",
            param=cast(Any, method),  # click's Option: typer types the argument as its own
        )
    for option, line in ctx.meta.pop(CONFIG_NOTES, ()):
        if option is None or ctx.get_parameter_source(option) != ParameterSource.COMMANDLINE:
            err_console.print(line)
    arch = ctx.meta.get(CONFIG_ARCHITECTURE)
    if arch is not None and ctx.get_parameter_source("model") == ParameterSource.COMMANDLINE:
        _check_architecture(arch, str(ctx.params.get("model")), str(ctx.meta.get(CONFIG_PATH)))


def _check_architecture(arch: Architecture, model: str, path: str) -> None:
    """A warning where --model is not the architecture the config states (the estimate is --model's)."""
    from tunecost.models.catalog import resolve_model

    try:
        spec = resolve_model(model)
    except TunecostError:
        return  # the command says it
    if not arch.of(spec):
        err_console.print(f"warning: --model {model} is not the architecture {path} states ({arch.text}); the "
                          "estimate is --model's")  # fmt: skip


def _aliases(options: dict[str, Any], params: set[str]) -> dict[str, Any]:
    """The job options under the names of the measuring commands' sweep options (`profile --batch-sizes 2`)."""
    out: dict[str, Any] = {}
    if "batch_sizes" in params and options.get("batch_size") is not None:
        out["batch_sizes"] = str(options["batch_size"])
    if "no_checkpointing" in params and options.get("gradient_checkpointing") is not None:
        out["no_checkpointing"] = not options["gradient_checkpointing"]
    return out


CONFIG_ARCHITECTURE = "tunecost.config_architecture"  # ctx.meta: the model's sizes the config states, or None
CONFIG_NOTES = "tunecost.config_notes"  # ctx.meta: (option or None, line) printed before the command runs
RUN_IN_RANK_STEPS = "tunecost.run_in_rank_steps"  # ctx.meta: the run's queries count the data-parallel ranks
CONFIG_DEFAULTED = "tunecost.config_defaulted"  # ctx.meta: the job options the config left to its framework
ConfigFiles = Annotated[list[Path] | None, opt("--config", CONFIG_HELP, is_eager=True, callback=_read_config)]


def layout_is_fixed() -> bool:
    """Whether the job's layout is the one stated (none stated: data-parallel only), not one to search: a --config
    states it, whatever it leaves to defaults; a run in steps of a per-device batch counted its queries on it."""
    meta = get_current_context().meta
    return CONFIG_PATH in meta or bool(meta.get(RUN_IN_RANK_STEPS))


def nothing_fits_hint(count_given: bool, layout_given: bool) -> str:
    """What to try when no multi-GPU setup fits: more GPUs (unless the run's queries count the ranks), a
    model-parallel layout where the search did not weigh one."""
    hints = (
        ["--gpus auto finds the counts that do"]
        if count_given and not get_current_context().meta.get(RUN_IN_RANK_STEPS)
        else []
    )
    hints += ["--tp, --pp or --cp name a model-parallel layout"] if layout_is_fixed() and not layout_given else []
    return "".join(f"; {h}" for h in hints)


def config_cuts_the_data() -> bool:
    """Whether the --config files cut the data to a number of queries (LLaMA-Factory's max_samples)."""
    return get_current_context().meta.get(CONFIG_OPTIONS, {}).get("max_queries") is not None


LAYOUT_OPTIONS = ("strategy", "offload", "num_gpus")  # what `config_layout` names


def config_layout() -> str:
    """The layout the --config files state ("zero2, offload optimizer, 2 GPUs"), "" where they state none."""
    config = get_current_context().meta.get(CONFIG_OPTIONS, {})
    said = [config.get("strategy")] if config.get("strategy") not in (None, "single") else []
    said += [f"offload {config['offload']}"] if config.get("offload") not in (None, "none") else []
    said += [f"{config['num_gpus']} GPUs"] if (config.get("num_gpus") or 1) > 1 else []
    return ", ".join(said)


def config_global_batch() -> tuple[int, str] | None:
    """The global batch the --config files state (their micro-batch, accumulation and GPUs, none of them a
    framework's default) where no flag changes the micro-batch or the accumulation, and how it was counted: the
    optimisation a plan keeps while it changes the setup. None: the config leaves it to defaults, or states only a
    micro-batch per GPU for a launcher to multiply (torchtitan's global_batch_size -1)."""
    from tunecost.workload.run_length import global_batch_of

    ctx = get_current_context()
    batch = ("batch_size", "grad_accum")
    if ctx.meta.get(CONFIG_DEFAULTED, frozenset()) & set(batch) or any(on_command_line(name) for name in batch):
        return None
    options = ctx.meta.get(CONFIG_OPTIONS, {})
    launched = options.get("num_gpus") is None and options.get("queries_per_step") is None
    if launched and options.get("pp", 1) == 1 and (options.get("grad_accum") or 1) == 1:
        return None  # a micro-batch per GPU, times the GPUs the launcher starts
    return global_batch_of(options)


def config_data_file(dataset: str | None) -> str | None:
    """`dataset`, or None where a --config names a data file this machine does not have (a cluster's path), said
    on stderr: the run's size and lengths then come from --queries and --seq-len."""
    ctx = get_current_context()
    if dataset is None or ctx.get_parameter_source("dataset") != ParameterSource.DEFAULT_MAP:
        return dataset
    path = Path(dataset).expanduser()
    a_file = path.is_absolute() or dataset.startswith(".") or path.suffix in (".json", ".jsonl", ".csv", ".parquet")
    if not a_file or path.exists() or data_files(dataset) is not None:
        return dataset
    err_console.print(
        f"assumed: dataset {dataset} (from --config {ctx.meta.get(CONFIG_PATH)}) is not on this machine: its size "
        "and lengths are not read (--queries and --seq-len, or --dataset)"
    )
    return None


def required(name: str, value: Any) -> Any:
    """A job option the command needs, from the flags or the config."""
    if value is None:
        raise TunecostError(f"give --{name.replace('_', '-')} (or a --config that sets it)")
    return value


def run_length(
    epochs: float | None,
    max_steps: int | None,
    dataset_queries: int | None,
    global_batch=None,
    searching=False,
    queries_per_row: float = 1.0,
) -> Any:
    """The run's queries x epochs (`workload.run_length`) from --epochs / --max-steps or the config's run length
    (its steps, epochs and global batch; `global_batch`: --global-batch instead); the line saying how steps became
    queries is printed among the assumptions. A run length on the command line replaces the config's.
    `searching`: the command searches GPU counts (plan; estimate without a GPU count). `queries_per_row`: the
    queries a packed row holds (a step's batch counts rows)."""
    from tunecost.workload.run_length import global_batch_of
    from tunecost.workload.run_length import run_length as queries_x_epochs

    config = get_current_context().meta.get(CONFIG_OPTIONS, {})
    given = [n for n in ("epochs", "max_steps") if on_command_line(n)]
    if len(given) == 2:
        raise TunecostError("give --epochs or --max-steps, not both (each is the run's whole length)")
    if given == ["max_steps"] and on_command_line("queries"):
        raise TunecostError("give --queries or --max-steps, not both (the steps x the global batch are the queries)")
    cap = config.get("max_steps_per_epoch")
    if given == ["max_steps"]:
        epochs, cap = None, None
    elif given == ["epochs"]:
        max_steps, cap = None, None
    if not on_command_line("queries"):
        dataset_queries = _trained_queries(config, dataset_queries)
    how = None if global_batch is None else (global_batch, f"global batch {global_batch} (--global-batch)")
    if (max_steps or cap) and how is None and config.get("queries_per_step") is None:
        _check_rank_count(searching)
        get_current_context().meta[RUN_IN_RANK_STEPS] = True
    length = queries_x_epochs(
        dataset_queries=dataset_queries,
        epochs=epochs,
        max_steps=max_steps,
        max_steps_per_epoch=cap,
        global_batch=how or global_batch_of(_batch_options(config)),
        queries_per_row=queries_per_row,
    )
    if length.note:
        err_console.print(f"assumed: {length.note}")
    return length


def _trained_queries(config: dict[str, Any], dataset_queries: int | None) -> int | None:
    """The data's queries per epoch as the config loads them: its mixture's, or its split's slice, cut to its
    max_samples, less its evaluation split; each step said."""
    from tunecost.workload.run_length import sliced_queries, training_queries

    if on_command_line("dataset"):  # the command line's data: one dataset, not the config's mixture or split
        config = {k: v for k, v in config.items() if k not in ("mixture_queries", "dataset_split")}
        config["max_queries"] = config.get("max_queries_per_dataset", config.get("max_queries"))
    if (mixed := config.get("mixture_queries")) is not None:
        dataset_queries = mixed  # counted by the reader, each dataset at its split and weight
    spec = config.get("dataset_split")
    if spec and dataset_queries is not None:
        counted = getattr(find_dataset_facts(str(config.get("dataset"))), "split", "") or TRAIN_SPLIT
        taken = sliced_queries(spec, dataset_queries, counted)
        if taken is None:
            err_console.print(f"assumed: {dataset_queries} queries per epoch: the {counted} split's, not the "
                              f"config's split {spec} (give --queries)")  # fmt: skip
        elif taken < 1:
            raise TunecostError(f"the config's dataset split {spec} takes none of the {dataset_queries} queries")
        else:
            err_console.print(f"assumed: {taken} queries per epoch: the config's split {spec} of {dataset_queries}")
            dataset_queries = taken
    limit = config.get("max_queries") if mixed is None else None  # a counted mixture is cut part by part
    if limit is not None and (dataset_queries is None or dataset_queries > limit):
        of = "" if dataset_queries is None else f" of {dataset_queries}"
        err_console.print(f"assumed: {limit} queries per epoch: the config cuts the data there{of}")
        dataset_queries = limit
    split = config.get("eval_split")
    if split and dataset_queries is not None:
        train = training_queries(dataset_queries, split)
        err_console.print(f"assumed: {train} queries per epoch: the config sets {dataset_queries - train} of "
                          f"{dataset_queries} aside for evaluation (their evaluation passes not counted)")  # fmt: skip
        dataset_queries = train
    return dataset_queries


# options that size the global batch of a run in steps, when the command line gives them over the config's
_BATCH_OPTIONS = ("batch_size", "grad_accum", "num_gpus", "tp", "pp", "cp", "micro_batches")


def _batch_options(config: dict[str, Any]) -> dict[str, Any]:
    """The config's options with the command line's micro-batch, GPU count and model-parallel degrees over them
    (each a whole number: `--gpus auto` or one count per GPU leaves the config's)."""
    params, out = get_current_context().params, dict(config)
    for name in _BATCH_OPTIONS:
        value = params.get(name)
        if value is None or not on_command_line(name):
            continue
        if isinstance(value, str):
            if not value.strip().isdigit():
                continue
            value = int(value)
        out[name] = value
    return out


def _check_rank_count(searching: bool) -> None:
    """A run in steps of a per-rank batch processes more queries on more ranks: refuse a GPU count searched
    (`plan`, `--gpus auto`) or one per GPU type, whose setups would each need their own run length."""
    if searching:
        command = get_current_context().info_name
        instead = "the queries per step (--global-batch)" if command == "plan" else "the GPU count (--gpus N)"
        raise TunecostError(
            f"{command}: a run in optimizer steps (max_steps) of a per-device batch takes more queries on more "
            f"ranks, and the GPU count is searched; give {instead}, or the run's length as --epochs or --queries"
        )
    gpus = get_current_context().params.get("num_gpus")
    if isinstance(gpus, str) and on_command_line("num_gpus") and not gpus.strip().isdigit():
        raise TunecostError(
            f"--gpus {gpus.strip()}: a run in optimizer steps of a per-device batch takes more queries on more "
            "ranks; give one count (--gpus N), or the run's length as --epochs or --queries"
        )


def check_config_global_batch(num_gpus: int) -> None:
    """The --config's global batch, where its framework refuses it on `num_gpus` GPUs: one error naming its key."""
    from tunecost.workload.frameworks.registry import check_global_batch

    ctx = get_current_context()
    if config := ctx.meta.get(CONFIG_OPTIONS):
        check_global_batch(ctx.params.get("framework"), _batch_options(config), num_gpus)


def on_command_line(name: str) -> bool:
    """Whether the running command's option `name` was given on the command line (not by --config)."""
    return get_current_context().get_parameter_source(name) == ParameterSource.COMMANDLINE


def pipeline_micro_batches(mp: ModelParallel | None, num_gpus, micro_batch: int | None) -> ModelParallel | None:
    """`mp` with the micro-batches per step of a config that states its global batch and not them at this GPU
    count (Megatron: global batch / (micro-batch x data-parallel ranks); a Megatron-LM file names no GPU count,
    a NeMo file's may differ from --gpus); `mp` as given where --micro-batches or the config sets them."""
    config = get_current_context().meta.get(CONFIG_OPTIONS, {})
    global_batch = config.get("queries_per_step")
    if mp is None or mp.pp == 1 or global_batch is None or not isinstance(num_gpus, int) or micro_batch is None:
        return mp
    dp = num_gpus // mp.degree
    if on_command_line("micro_batches"):
        if num_gpus % mp.degree == 0 and micro_batch * dp * mp.num_micro_batches != global_batch:
            err_console.print(
                f"assumed: a step of {micro_batch * dp * mp.num_micro_batches} queries (micro-batch {micro_batch} x "
                f"data-parallel {dp} x --micro-batches {mp.num_micro_batches}), not the config's global batch "
                f"{global_batch}; the run keeps its length in queries"
            )
        return mp
    if config.get("num_gpus", num_gpus) == num_gpus and "micro_batches" in config:
        return mp
    try:
        count = micro_batches_per_step(global_batch, micro_batch, dp) if num_gpus % mp.degree == 0 else None
    except ValueError:
        count = None
    if count is None:
        raise TunecostError(
            f"the config's global batch {global_batch} is not a multiple of micro-batch {micro_batch} x "
            f"data-parallel {dp} on --gpus {num_gpus} (tp x pp x cp {mp.degree}); give --micro-batches"
        )
    err_console.print(
        f"assumed: micro_batches {count}: the config's global batch {global_batch} / (micro-batch {micro_batch} x "
        f"data-parallel {dp})"
    )
    return dataclasses.replace(mp, micro_batches=count)
