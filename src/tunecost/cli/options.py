"""Options shared by the commands, each checked where it enters: one home for an option's name, help and bounds.

`refuse_blank_values` makes every text, path or list option of every command refuse an empty or blank value given
on the command line (`--gpu ''` is a usage error, never "the default"); the `Annotated` types below bound the
numbers. A bad value is a usage error naming the option (`error: --seed: must be between 0 and 4294967295, got -1`),
exit code 2, raised before the command runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from tunecost.limits import (
    MAX_BATCH_SIZE,
    MAX_EPOCHS,
    MAX_EXPERTS,
    MAX_GRAD_ACCUM,
    MAX_LAYERS,
    MAX_LORA_ALPHA,
    MAX_LORA_RANK,
    MAX_QUERIES,
    MAX_SEED,
    MAX_SEQ_LEN,
    MAX_STEPS,
)

try:  # typer >= 0.22 carries its own copy of click
    from typer._click.core import Command, Context, Parameter, ParameterSource
    from typer._click.globals import get_current_context as get_current_context  # re-exported (cli.jobconfig)
except ImportError:  # pragma: no cover - older typer on the real click
    from click import get_current_context as get_current_context  # type: ignore[no-redef]
    from click.core import Command, Context, Parameter, ParameterSource  # type: ignore[assignment]


def _is_blank(value: Any) -> bool:
    return isinstance(value, str) and not value.strip()


def _refusing_blank(param: Parameter, process_value: Callable[[Context, Any], Any]) -> Callable[[Context, Any], Any]:
    def process(ctx: Context, value: Any) -> Any:
        given = ctx.get_parameter_source(param.name) == ParameterSource.COMMANDLINE if param.name else False
        values = value if isinstance(value, (list, tuple)) else (value,)
        if given and any(_is_blank(v) for v in values):
            raise typer.BadParameter("must not be empty")
        return process_value(ctx, value)

    return process


def refuse_blank_values(command: Command) -> None:
    """Every option and argument of `command` and its subcommands that takes text (a name, a path, a list) refuses
    an empty or whitespace-only value given on the command line: `Path('')` is the current folder and `''` would
    otherwise stand for the default. Numbers need no such check: their conversion already refuses ''."""
    for param in command.params:
        if not getattr(param, "is_flag", False):
            param.process_value = _refusing_blank(param, param.process_value)  # type: ignore[method-assign,assignment]
    for sub in getattr(command, "commands", {}).values():
        refuse_blank_values(sub)


def whole_number(minimum: int | None, maximum: int) -> Callable[[Any], int]:
    """A typer `parser`: a whole number in [minimum, maximum], else a usage error saying the bounds. With `minimum`
    None only the maximum is checked here (the command checks the lower bound with its own words)."""

    def parse(value: Any) -> int:
        try:
            number = int(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else None
        except ValueError:
            number = None
        if number is None:
            raise typer.BadParameter(f"must be a whole number, got {value!r}")
        if number > maximum or (minimum is not None and number < minimum):
            bounds = {None: "at most", 1: "positive and at most"}.get(minimum, f"between {minimum} and")
            raise typer.BadParameter(f"must be {bounds} {maximum}, got {number}")
        return number

    return parse


def positive_number(maximum: float) -> Callable[[Any], float]:
    """A typer `parser`: a finite number in (0, maximum], else a usage error saying the bounds."""

    def parse(value: Any) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise typer.BadParameter(f"must be a number, got {value!r}") from None
        if not (math.isfinite(number) and 0 < number <= maximum):
            raise typer.BadParameter(f"must be a positive number at most {maximum:g}, got {number!r}")
        return number

    return parse


def opt(option: str, help: str | None = None, **settings: Any) -> Any:
    """`typer.Option(option, help=help, ...)`: one option a line in a command's signature."""
    return typer.Option(option, help=help, **settings)


def count_option(option: str, help: str, maximum: int, minimum: int | None = 1) -> Any:
    """An option that takes a whole number in [minimum, maximum]."""
    return typer.Option(option, help=help, parser=whole_number(minimum, maximum))


# What is fine-tuned, how.
ModelName = Annotated[
    str, opt("--model", "Catalog model (tiny-mixtral, mixtral-8x7b, ...), local folder or cached hub id.")
]
MethodName = Annotated[str, opt("--method", "full | lora | qlora")]
# The job options every job command takes, with one name, type and default (`--config` may set them instead)
JobModel = Annotated[
    str | None,
    opt(
        "--model",
        "Catalog model (tiny-mixtral, mixtral-8x7b, ...), local folder or hub id (its config.json; or from --config).",
    ),
]
LoraRank = Annotated[int, count_option("--lora-rank", "LoRA rank.", MAX_LORA_RANK)]
# The run's length: epochs, or optimizer steps (x the config's global batch: workload.run_length)
Epochs = Annotated[float | None, opt("--epochs", "Epochs (or from --config).", parser=positive_number(MAX_EPOCHS))]
MAX_STEPS_HELP = (
    "Optimizer steps of the run instead of --epochs (or from --config: max_steps, trainer.max_steps, "
    "training.steps): queries = steps x the config's global batch."
)
MaxSteps = Annotated[int | None, count_option("--max-steps", MAX_STEPS_HELP, MAX_QUERIES)]
FRAMEWORK_HELP = (
    "The framework that runs the job (torchtune, nemo, litgpt, torchtitan, axolotl, ...; set by --config): a "
    "framework outside the calibrated stack family gets its family's throughput prior and a wider interval."
)
Framework = Annotated[str | None, opt("--framework", FRAMEWORK_HELP)]
GRAD_ACCUM_HELP = (
    "Micro-batches accumulated per optimizer step (or from --config: gradient_accumulation_steps): the optimizer "
    "step's time is spread over them. Default 1."
)
GradAccum = Annotated[int | None, count_option("--grad-accum", GRAD_ACCUM_HELP, MAX_GRAD_ACCUM)]
LoraAlpha = Annotated[
    float, opt("--lora-alpha", "LoRA alpha (scaling alpha / rank).", parser=positive_number(MAX_LORA_ALPHA))
]
LoraDropout = Annotated[float, opt("--lora-dropout", "Dropout on each LoRA adapter's input (PEFT's lora_dropout).")]
LoraTargets = Annotated[
    str | None,
    opt(
        "--lora-targets",
        "attention, mlp, experts, router, or single projections q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
        "down_proj (default: experts,router for MoE, attention,mlp dense).",
    ),
]
Attention = Annotated[str, opt("--attention", "flash | sdpa | eager.")]
PACKING_HELP = (
    "none | per-document | cross-document: queries packed into rows of --seq-len tokens (the batch counts rows), "
    "attention within each query or across the row."
)
Packing = Annotated[str, opt("--packing", PACKING_HELP)]
Optimizer = Annotated[str, opt("--optimizer", "adamw | adamw-8bit | adamw-4bit (torchao) | sgd.")]
ModulesToSave = Annotated[
    str,
    opt("--modules-to-save", "Modules trained fully beside LoRA (PEFT modules_to_save), e.g. embed_tokens,lm_head."),
]
Dtype = Annotated[str | None, opt("--dtype", "Compute dtype: bf16 | fp16 | fp32 (default bf16; fp16 for GPTQ).")]
QuantType = Annotated[
    str | None,
    opt(
        "--quant-type",
        "Base weights of qlora: nf4 | fp4 | gptq (4-bit) | int8 (bitsandbytes LLM.int8, load_in_8bit) "
        "(default: gptq for a GPTQ checkpoint, else nf4).",
    ),
]
DoubleQuant = Annotated[bool, opt("--double-quant/--no-double-quant", "bitsandbytes' double quantization (qlora).")]
# FP8 training (docs/fp8.md): its own block beside the job options.
FP8_HELP = (
    "FP8 linear GEMMs: none | tensorwise | rowwise (torchao float8, dynamic scaling) | te-delayed (Transformer "
    "Engine, delayed per-tensor scaling); needs a GPU with FP8 tensor cores (Hopper, Ada, Blackwell, MI300)."
)
Fp8 = Annotated[str, opt("--fp8", FP8_HELP, metavar="RECIPE")]
FP8_PARAMS_HELP = (
    "With --fp8 te-delayed: the linears' weights kept in FP8 only (Transformer Engine fp8_model_init; NeMo "
    "model.fp8_params, Megatron-LM --fp8-param-gather)."
)
Fp8Params = Annotated[bool, opt("--fp8-params/--no-fp8-params", FP8_PARAMS_HELP)]
SELECTIVE_RECOMPUTE_HELP = (
    "Recompute the core attention in backward and keep the rest of each layer (Megatron's selective "
    "recomputation; NeMo activations_checkpoint_granularity selective); gradient checkpointing then defaults off."
)
SelectiveRecompute = Annotated[bool, opt("--selective-recompute/--no-selective-recompute", SELECTIVE_RECOMPUTE_HELP)]
TORCH_COMPILE_HELP = (
    "The step runs under torch.compile (Inductor; torchtune compile, torchtitan compile.enable, HF torch_compile): "
    "the throughput model fuses each layer's element-wise chains; peak memory stays the eager step's."
)
TorchCompile = Annotated[bool, opt("--torch-compile/--no-torch-compile", TORCH_COMPILE_HELP)]
LIGER_KERNEL_HELP = (
    "Liger's Triton kernels as the HF Trainer's use_liger_kernel applies them (TRL, axolotl's Liger plugin, "
    "LLaMA-Factory enable_liger_kernel): RMSNorm, SwiGLU/GEGLU and RoPE fused, the fused linear cross-entropy "
    "keeps no logits."
)
FP32_PARAMS_HELP = (
    "The model's weights in fp32 (a full fine-tune's gradients and AdamW states too), computed in --dtype: autocast "
    "on one GPU or DDP, FSDP's mixed precision (LLaMA-Factory's full fine-tune, TRL's default fp32 load, litgpt's "
    "bf16-mixed, torchtitan's default)."
)
Fp32Params = Annotated[bool, opt("--fp32-params/--no-fp32-params", FP32_PARAMS_HELP)]
LigerKernel = Annotated[bool, opt("--liger-kernel/--no-liger-kernel", LIGER_KERNEL_HELP)]
RECOMPUTE_LAYERS_HELP = (
    "Under gradient checkpointing, how many decoder layers recompute their forward (Megatron's recompute_method "
    "block, torchtitan's every-Nth-layer selective_ac_option); the rest keep their activations. Default: every layer."
)
RecomputeLayers = Annotated[int | None, count_option("--recompute-layers", RECOMPUTE_LAYERS_HELP, MAX_LAYERS)]
DEFAULT_LORA_RANK = 16
DEFAULT_LORA_ALPHA = 32.0
STACK_HELP = (
    "tunecost | hf-2024 (the paper's software stack) | hf-peft (Trainer + PEFT >= 0.7) | torchtune (its single-device "
    "recipes: bf16 adapters, fp32 logits)."
)
Stack = Annotated[str, opt("--stack", "Software stack the step is simulated on: " + STACK_HELP)]
DEFAULT_STACK_NAME = "tunecost"
ChunkedLoss = Annotated[
    bool,
    opt(
        "--chunked-loss",
        "With --stack torchtune: CEWithChunkedOutputLoss (the logits in 8 chunks, each upcast alone); with --stack "
        "hf-peft: TRL's chunked_nll (SFTConfig's default loss_type since TRL 1.7: the head per 256 tokens, "
        "checkpointed).",
    ),
]
OffloadActivations = Annotated[
    bool, opt("--offload-activations", "With --stack torchtune: activation offload (saved tensors to host memory).")
]
Reentrant = Annotated[
    bool | None,
    opt(
        "--reentrant/--non-reentrant",
        "How checkpointed layers are recomputed: torch.utils.checkpoint's use_reentrant (default: the stack's own; "
        "re-entrant for hf-peft and hf-2024, as transformers' Trainer without gradient_checkpointing_kwargs).",
    ),
]
FusedAdamw = Annotated[
    bool | None,
    opt(
        "--fused-adamw/--no-fused-adamw",
        "AdamW as one fused kernel (torch's fused=True: the HF Trainer's adamw_torch_fused), with no multi-tensor "
        "temporaries, or not (default: the stack's own; fused under torchtune, else foreach).",
    ),
]
OptimizerInBackward = Annotated[
    bool,
    opt("--optimizer-in-backward", "With --stack torchtune: optimizer_in_bwd (each gradient freed once applied)."),
]
TOP_K_HELP = "Top-k: experts per token for this job (default: the model's; dense = the number of experts)."
ExpertsPerToken = Annotated[int | None, count_option("--experts-per-token", TOP_K_HELP, MAX_EXPERTS)]
EXPERTS_IMPL_HELP = (
    "stock | peft-fused | qlora-linear4bit | fast | fast-4bit (default: stock for full, peft-fused for lora, "
    "qlora-linear4bit for qlora)."
)
ExpertsImpl = Annotated[str | None, opt("--experts-impl", EXPERTS_IMPL_HELP)]
RandomWeights = Annotated[bool, opt("--random-weights", "Random weights from the config (no downloaded weights).")]
NoCheckpointing = Annotated[bool, opt("--no-gradient-checkpointing", "Train without activation checkpointing.")]
GradientCheckpointing = Annotated[
    bool | None,
    opt(
        "--gradient-checkpointing/--no-gradient-checkpointing",
        "Activation checkpointing (default: on for lora/qlora, off for a full fine-tune, as the paper ran them).",
    ),
]
DEFAULT_SEQ_LEN = 512  # the paper's eq. (1) length: a job's tokens per query when neither flags nor data say
SeqLen = Annotated[
    int | None, count_option("--seq-len", "Tokens per query (default 512 unless the data says).", MAX_SEQ_LEN)
]
BatchSize = Annotated[int, count_option("--batch-size", "Queries per step.", MAX_BATCH_SIZE)]
Seed = Annotated[int, count_option("--seed", "Random seed (0 to 2^32-1).", MAX_SEED, minimum=0)]
WarmupSteps = Annotated[int, count_option("--warmup-steps", "Untimed steps first.", MAX_STEPS, minimum=0)]
RUN_QUERIES_HELP = (
    "Throughput of runs of N queries, start-up included (the paper measured runs of 1000); default: the "
    "calibration's run length (predict) or steady state (estimate)."
)
RunQueries = Annotated[int | None, count_option("--run-queries", RUN_QUERIES_HELP, MAX_QUERIES)]
HostCpuOpt = Annotated[
    str | None,
    opt(
        "--host-cpu",
        "CPU of the machine that runs the GPU (8480C, EPYC 7763, ...): scales the host time of the step and, "
        "with --offload, runs the optimizer step (default: the GPU's reference system's CPU where NVIDIA sells one, "
        "else the paper's Xeon 8380).",
    ),
]
NumExamples = Annotated[int | None, count_option("--limit", "Use the first N examples.", MAX_QUERIES)]

# Inputs: datasets, tokenizers, templates.
Tokenizer = Annotated[str, opt("--tokenizer", "Tokenizer: 'mistral' (offline Mixtral), a local path or a hub id.")]
Template = Annotated[str, opt("--template", "Prompt template: none | mistral | alpaca | chat.")]
MaxLength = Annotated[int, count_option("--max-length", "Cut dataset queries to this many tokens.", MAX_SEQ_LEN)]
SkipBadRows = Annotated[bool, opt("--skip-bad-rows", "Skip malformed dataset rows instead of failing.")]
AllowDownload = Annotated[bool, opt("--allow-download", "Allow hub downloads (model, tokenizer, dataset).")]

# Where the job runs, at what price.
Device = Annotated[str, opt("--device", "cpu | cuda | auto (cuda when available).")]
Gpu = Annotated[str | None, opt("--gpu", "Only this GPU of the catalog (see `tunecost gpus`).")]
GpuMemoryGb = Annotated[float | None, opt("--gpu-memory-gb", "Device memory in GB (10^9 bytes, as datasheets).")]
GpuMemoryGib = Annotated[float | None, opt("--gpu-memory-gib", "Device memory in GiB (2^30 bytes, as CUDA reports).")]
Provider = Annotated[str | None, opt("--provider", "Only prices from this provider.")]
PricesFile = Annotated[Path | None, opt("--prices", "A CSV overriding or extending the price catalog.")]

# Output.
Force = Annotated[bool, opt("--force", "Replace an existing output file (never one of the inputs).")]
JsonOut = Annotated[bool, opt("--json", "Print JSON on stdout, nothing else.")]
RecordsOut = Annotated[Path | None, opt("--out", "Run directory to add the records to (for `tunecost report`).")]
ReplaceRecords = Annotated[bool, opt("--force", "With --out: replace records of the same kind already there.")]


CONFIG_OPTIONS = "tunecost.config_options"  # ctx.meta: the config's job options (the run length's global batch)
CONFIG_PATH = "tunecost.config_path"  # ctx.meta: the --config file(s) they came from


def blame_config(message: str, ctx: Context | None = None) -> str:
    """`message`, naming the --config file and the value where the option it is about took its value from the
    config (no flag gave it): "--seq-len: must be positive (seq_len -5 from --config lf.yaml)"."""
    ctx = ctx or get_current_context(silent=True)
    if ctx is None or CONFIG_PATH not in ctx.meta or "--config" in message:
        return message
    for name, value in ctx.meta.get(CONFIG_OPTIONS, {}).items():
        flag = "--" + name.replace("_", "-")
        # the flag, or an option's own name where it is no English word ("seq_len", not "optimizer steps")
        bare = rf"|(?<![\w-]){name}(?![\w-])" if "_" in name else ""
        said = re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-]){bare}", message)
        if said and ctx.get_parameter_source(name) == ParameterSource.DEFAULT_MAP:
            return f"{message} ({name} {value!r} from --config {ctx.meta[CONFIG_PATH]})"
    return message
