"""A fine-tuning job read from the config a framework runs it with (`--config FILE`).

Each framework's reader (`FRAMEWORKS`, one module each) turns its parsed file into a `ConfigJob`: the job options
in tunecost's names (`JOB_OPTIONS`), every default the framework fills that the file leaves out (named among the
assumptions, with whose default it is), and the keys tunecost does not model. Command-line flags override the file.
A key the framework itself does not know (`KnownKeys`, lists in keys/) is an error.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tunecost.errors import TunecostError
from tunecost.workload.run_length import data_parallel_ranks

if TYPE_CHECKING:
    from tunecost.workload.frameworks.megatron_model import Architecture

# what a config's torch.compile switch does to the estimate
COMPILE_NOTE = "the throughput model fuses each layer's element-wise chains; peak memory is the eager step's"
# what a config's Liger switch does to the estimate
LIGER_NOTE = (
    "Liger's RMSNorm, SwiGLU/GEGLU and RoPE kernels and its fused linear cross-entropy (no logits kept) in the "
    "simulated step and the throughput model"
)
# Liger's kernel switches (liger_kernel_config, axolotl's liger_* keys) as use_liger_kernel sets them by default
LIGER_DEFAULTS = {"rope": True, "rms_norm": True, "swiglu": True, "fused_linear_cross_entropy": True}
SFT_ONLY = "tunecost estimates supervised fine-tuning (full, LoRA, QLoRA) only"
PASS_DEEPSPEED = "pass it too with --config"  # ends the line of a config that names its DeepSpeed file

# tunecost's job options a config may set, and the type each value takes
JOB_OPTIONS: dict[str, type | tuple[type, ...]] = {
    "model": str,
    "method": str,  # full | lora | qlora
    "lora_rank": int,
    "lora_alpha": (int, float),
    "lora_dropout": (int, float),
    "lora_targets": str,  # comma list of LORA_TARGETS: attention, mlp, experts, router, or projections (q_proj, ...)
    "quant_type": str,  # nf4 | fp4
    "double_quant": bool,
    "dtype": str,  # bf16 | fp16 | fp32
    "gradient_checkpointing": bool,
    "selective_recompute": bool,  # the core attention recomputed in backward
    "recompute_layers": int,  # under gradient checkpointing, the layers recomputed (None: every layer)
    "reentrant": bool,
    "fused_adamw": bool,  # torch's fused AdamW kernel (the HF Trainer's adamw_torch_fused)
    "modules_to_save": str,  # modules trained fully beside LoRA (PEFT's modules_to_save), comma-separated
    "attention": str,  # flash | sdpa | eager
    "packing": str,  # none | per-document | cross-document: queries packed into rows of seq_len tokens
    "torch_compile": bool,  # the step under torch.compile (Inductor)
    "liger_kernel": bool,  # Liger's kernels as use_liger_kernel applies them
    "optimizer": str,  # adamw | adamw-8bit | adamw-4bit | sgd
    "seq_len": int,  # the cutoff: longer examples are cut, each batch padded to its longest
    "batch_size": int,  # per device (micro-batch)
    "dataset": str,
    "epochs": (int, float),
    "max_steps": int,  # optimizer steps of the run (workload.run_length)
    "max_steps_per_epoch": int,  # optimizer steps that end each epoch (torchtune)
    "grad_accum": int,  # micro-batches accumulated per optimizer step
    "queries_per_step": int,  # the global batch the config states outright (NeMo, Megatron-LM)
    "dataset_split": str,  # the Hugging Face split spec the data is loaded as, where it slices ("train[:95%]")
    "mixture_queries": int,  # a mixture's queries per epoch, each dataset at its split and weight (first: lengths)
    "max_queries": int,  # the data cut to at most this many queries (LLaMA-Factory's max_samples x datasets)
    "max_queries_per_dataset": int,  # each dataset cut to this many (max_samples): the cap of one given dataset
    "eval_split": (int, float),  # then set aside for evaluation: a fraction below 1 or a count (val_size)
    "stack": str,
    "chunked_loss": bool,
    "offload_activations": bool,
    "optimizer_in_backward": bool,
    "num_gpus": int,
    "gpus_per_node": int,
    "strategy": str,
    "offload": str,  # none | optimizer | params
    "tp": int,  # tensor-parallel degree
    "pp": int,  # pipeline-parallel degree
    "cp": int,  # context-parallel degree
    "sequence_parallel": bool,
    "tp_impl": str,  # torchtitan | megatron (TP_IMPLS): whose tensor parallelism
    "tp_comm_overlap": bool,  # TP collectives overlapped with the GEMMs (TE userbuffers)
    "micro_batches": int,  # pipeline micro-batches per step
    "pipeline_schedule": str,  # 1f1b | gpipe | interleaved-1f1b
    "virtual_stages": int,  # pipeline stages per rank (interleaved-1f1b)
    "first_stage_less_layers": int,  # the layers the embedding counts as in the pipeline split
    "last_stage_less_layers": int,  # ... and the head
    "expert_parallel": int,  # the routed experts split over this many data-parallel ranks
    "first_stage_layers": int,  # the first pipeline stage's decoder layers (Megatron's uneven pipeline)
    "last_stage_layers": int,  # ... and the last's
    "fp8": str,  # none | tensorwise | rowwise | te-delayed (FP8_RECIPES)
    "fp8_params": bool,  # te-delayed: the linears' weights kept in FP8 only
    "fp32_params": bool,  # full fine-tune: fp32 parameters, the step under autocast (torch AMP)
}


@dataclass(frozen=True, kw_only=True)
class ConfigJob:
    """What a framework's config says about the job, in tunecost's option names."""

    framework: str
    path: str
    options: dict[str, Any]
    assumptions: tuple[str, ...] = ()  # "lora_rank 8: LLaMA-Factory's default"
    not_modelled: tuple[str, ...] = ()  # keys of the file tunecost does not model
    architecture: Architecture | None = None  # the model's sizes the file states: --model is checked against them

    def __post_init__(self) -> None:
        for name, value in self.options.items():
            expected = JOB_OPTIONS.get(name)
            if expected is None:
                raise TunecostError(f"{self.path}: reader for {self.framework} set unknown option {name!r}")
            if value is not None and (
                (isinstance(value, bool) and expected is not bool) or not isinstance(value, expected)
            ):
                raise TunecostError(f"{self.path}: {name} must be {_type_name(expected)}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class Framework:
    """One framework's reader: `detect` says whether a parsed file is its config, `read` turns it into a job."""

    name: str
    title: str  # as people write it: "LLaMA-Factory"
    suffixes: tuple[str, ...]  # file types its configs come in
    detect: Callable[[Mapping[str, Any]], bool]
    read: Callable[[ConfigFile], ConfigJob]
    strategies: tuple[str, ...] = ()  # the several-GPU strategies it runs, and why (empty: every one tunecost models)
    strategies_why: str = ""
    model_parallel: tuple[str, ...] | None = None  # the TP/PP/CP dimensions it runs ("tp", "pp", "cp"; None: all)
    tp_shards_norms: bool = True  # its TP runs sequence parallelism; False: transformers' tp_plan, DeepSpeed AutoTP
    tp_strategies: tuple[str, ...] | None = None  # the data-parallel strategies its TP runs beside (None: every one)
    # its key of a global batch it stops on unless a multiple of micro-batch x data-parallel ranks (None: no check)
    global_batch_key: str | None = None


@dataclass(frozen=True, kw_only=True)
class ConfigFile:
    """A parsed config, with helpers that name the file and key in every error."""

    path: str
    data: Mapping[str, Any]
    used: set[str] = field(default_factory=set)

    def get(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        return self.data.get(key, default)

    def typed(self, key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        """The value of `key` (None or `default` when absent), which must be of `kind`; else one error naming it."""
        value = self.get(key, default)
        if value is None or value is default:
            return value
        if isinstance(value, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else ()):
            raise self.error(key, f"must be {_type_name(kind)}, got {value!r}")
        if kind in (int, float, (int, float)) and isinstance(value, str):
            try:
                value = float(value) if kind is not int else int(value)
            except ValueError:
                raise self.error(key, f"must be {_type_name(kind)}, got {value!r}") from None
        if not isinstance(value, kind):
            raise self.error(key, f"must be {_type_name(kind)}, got {value!r}")
        return value

    def or_default(self, key: str, kind: Any, default: Any, notes: list[str], line: str) -> Any:
        """The key's value, or the framework's `default` with its assumption `line` noted when the file has none."""
        value = self.typed(key, kind)
        if value is None:
            notes.append(line)
            return default
        return value

    def error(self, key: str, what: str) -> TunecostError:
        return TunecostError(f"{self.path}: {key}: {what}")

    def unused_keys(self) -> tuple[str, ...]:
        return tuple(k for k in self.data if k not in self.used)

    def check_keys(self, known: KnownKeys, keys: Iterable[Any] | None = None) -> None:
        """One error for the first key (of `keys`, else the file's) that is not a key of the framework's config."""
        for key in self.data if keys is None else keys:
            unknown = known.unknown(str(key))
            if unknown is not None:
                raise self.error(unknown, known.not_a_key(unknown))


KEYS_DIR = Path(__file__).parent / "keys"  # one key per line; each file's header names its source


@functools.cache
def framework_keys(*names: str) -> frozenset[str]:
    """The keys listed in keys/NAME.txt for each name."""
    keys: set[str] = set()
    for name in names:
        lines = (KEYS_DIR / f"{name}.txt").read_text(encoding="utf-8").splitlines()
        keys.update(line.strip() for line in lines if line.strip() and not line.startswith("#"))
    return frozenset(keys)


@dataclass(frozen=True)
class KnownKeys:
    """The keys a framework's config takes, nested ones as "section.key". A key under a listed key (a dict value
    such as a component's arguments) is not checked; a key under a section is, against the section's keys."""

    title: str  # what the error says the key is not a key of: "LLaMA-Factory's config"
    files: tuple[str, ...]  # key lists in keys/
    extra: tuple[str, ...] = ()  # keys the reader also reads (an older version's name)

    @functools.cached_property
    def keys(self) -> frozenset[str]:
        return framework_keys(*self.files) | set(self.extra)

    @functools.cached_property
    def sections(self) -> frozenset[str]:
        return frozenset(k.rsplit(".", i)[0] for k in self.keys for i in range(1, k.count(".") + 1))

    def unknown(self, key: str) -> str | None:
        """The shortest dotted part of `key` that is neither a key nor a section (None: `key` is known)."""
        parts = key.split(".")
        for end in range(1, len(parts) + 1):
            head = ".".join(parts[:end])
            if head in self.keys:
                return None
            if head not in self.sections:
                return head
        return None

    def not_a_key(self, key: str) -> str:
        """What the error says about an unknown `key`, with the closest key of its section."""
        section, _, name = key.rpartition(".")
        prefix = f"{section}." if section else ""
        names = sorted({k[len(prefix) :].split(".")[0] for k in self.keys if k.startswith(prefix)})
        close = difflib.get_close_matches(name, names, n=1)
        return f"not a key of {self.title}" + (f" (did you mean {prefix}{close[0]}?)" if close else "")


def dotted_keys(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The keys of nested mappings as "section.key" ("zero_optimization.stage"); an empty mapping is its own key."""
    out: list[str] = []
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            out += dotted_keys(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out


def _type_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "a whole number", float: "a number", str: "text", bool: "true or false", dict: "a mapping"}
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in kinds))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once (json keeps the last of a repeated key, silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} is given twice in one object")
        out[key] = value
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml's safe loader refusing a key given twice in one mapping (it keeps the last, silently); a merge key's
    (`<<`) values stay overridable."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping (line {key_node.start_mark.line + 1})"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_config_file(path: str | Path) -> dict[str, Any]:
    """The file as a mapping: YAML (safe loader), JSON or TOML by its suffix; one error naming the file otherwise."""
    p = Path(path)
    if not p.is_file():
        raise TunecostError(f"{path}: {'a folder, not a config file' if p.is_dir() else 'no such file'}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TunecostError(f"{path}: cannot be read ({exc.__class__.__name__})") from None
    suffix = p.suffix.lower()
    try:
        if suffix == ".json":
            data = json.loads(text, object_pairs_hook=_unique_keys)
        elif suffix == ".toml":
            try:
                import tomllib
            except ImportError:  # Python 3.10
                raise TunecostError(f"{path}: reading TOML needs Python 3.11 or newer") from None
            data = tomllib.loads(text)
        else:
            data = yaml.load(text, Loader=_UniqueKeyLoader)  # a yaml.SafeLoader: no arbitrary objects
    except (ValueError, yaml.YAMLError) as exc:  # tomllib.TOMLDecodeError and json's errors are ValueErrors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise TunecostError(f"{path}: not valid {suffix.lstrip('.').upper() or 'YAML'}: {first}") from None
    if not isinstance(data, dict):
        raise TunecostError(f"{path}: a config is a mapping of keys to values, got {type(data).__name__}")
    return data


DERIVED_ACCUMULATION = " / (micro-batch "  # the line of grad_accum derived from a stated global batch


def global_batch_divides(key: str, title: str, options: dict[str, Any], num_gpus: int) -> None:
    """The config's global batch (`key`) is a multiple of its micro-batch x the data-parallel ranks of `num_gpus`
    GPUs, or one error naming the key (a framework that stops there: `Framework.global_batch_key`)."""
    global_batch, micro, ranks = (
        options.get("queries_per_step"),
        options.get("batch_size"),
        data_parallel_ranks(options, num_gpus),
    )
    if global_batch and micro and global_batch % (micro * ranks):
        raise TunecostError(
            f"{key} {global_batch}: not a multiple of micro-batch {micro} x {ranks} data-parallel ranks on "
            f"{num_gpus} GPUs, where {title} stops"
        )


def accumulation_of(options: dict[str, Any], key: str) -> list[str]:
    """grad_accum from a stated global batch (`options["queries_per_step"]`, under `key`) = global / (micro-batch x
    data-parallel ranks), where the file also gives the micro-batch and GPUs and no pipeline takes the micro-batches
    (torchtitan's, litgpt's and LLaMA-Factory v1's own division); the assumption line, else nothing."""
    tp, pp, cp = (options.get(k, 1) for k in ("tp", "pp", "cp"))
    global_batch, micro, gpus = options.get("queries_per_step"), options.get("batch_size"), options.get("num_gpus")
    if pp > 1 or not (global_batch and micro and gpus) or gpus % (tp * cp):
        return []
    ranks = gpus // (tp * cp)
    count, left = divmod(global_batch, micro * ranks)
    if left or count <= 1:
        return []
    options["grad_accum"] = count
    return [f"grad_accum {count}: {key} {global_batch}{DERIVED_ACCUMULATION}{micro} x {ranks} data-parallel ranks)"]


def steps_options(
    cfg: ConfigFile, keys: tuple[str, str], title: str, notes: list[str], option: str = "max_steps"
) -> dict[str, Any]:
    """`option` (max_steps > 0: the run's length in optimizer steps, which replaces the epochs; torchtune's
    max_steps_per_epoch: each epoch's cap) and grad_accum (the optimizer's share of the step time, and the global
    batch of a run in steps), from the config's steps and accumulation `keys`."""
    steps_key, accumulation_key = keys
    steps, accumulation = cfg.typed(steps_key, int), cfg.typed(accumulation_key, int)
    out: dict[str, Any] = {}
    if accumulation is not None:
        if accumulation < 1:
            raise cfg.error(accumulation_key, f"must be >= 1, got {accumulation}")
        out["grad_accum"] = accumulation
    if steps is None or steps <= 0:
        return out
    out[option] = steps
    how = f"{title} ignores the epochs beside it" if option == "max_steps" else "each epoch ends there at the latest"
    notes.append(f"run length: {steps_key} {steps} optimizer steps ({how})")
    if accumulation is None:
        notes.append(f"grad_accum 1: {title}'s default {accumulation_key}")
    return out
