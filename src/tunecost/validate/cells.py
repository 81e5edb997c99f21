"""The cells of a measurement corpus row read as tunecost's job options: attention, checkpointing, LoRA targets,
optimizer."""

from __future__ import annotations

import re
from typing import Any

from tunecost.limits import MAX_TOKENS
from tunecost.simulate.behaviour import ADAMW_FUSED
from tunecost.validate.corpus import CorpusRow
from tunecost.workload.job import group_targets


class Skip(Exception):
    """A row tunecost does not model; the message is the reason."""


# "2x8" / "2 nodes x 8 GPUs" (nodes x GPUs), else a count before other words: "8 GPUs", "8x", "8x H100", "8 (1 node)"
_GPU_COUNT = re.compile(r"^\s*(\d+)\s*(?:(?:nodes?\s*)?[x\u00d7*]\s*(\d+)\s*(?:gpus?)?\s*$|(?![\d.e,]))", re.IGNORECASE)


def gpu_count_of(row: CorpusRow) -> int:
    """A row's num_gpus: a count, or as sources write it ("8 GPUs", "8x", "2x8": nodes x GPUs, "8 (1 node)")."""
    found = _GPU_COUNT.match(row.get("num_gpus"))
    if found is None:
        return count_of(row, "num_gpus")
    return count_of(CorpusRow(row.path, row.line, {"num_gpus": str(int(found[1]) * int(found[2] or 1))}), "num_gpus")


_TOKENS = re.compile(r"^\s*(\d{1,3}(?:,\d{3})+|\d+)\s*(k)?\s*(?:tokens?)?\s*$", re.IGNORECASE)


def tokens_of(row: CorpusRow, column: str) -> int:
    """A token count as sources write it: "2048", "2,048", "2048 tokens", "8k" (8192: context lengths are powers of
    two)."""
    found = _TOKENS.match(row.get(column))
    if found is None:
        return count_of(row, column)
    number = int(found[1].replace(",", "")) * (1024 if found[2] else 1)
    return count_of(CorpusRow(row.path, row.line, {column: str(number)}), column)


_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+")


def plain_number(text: str) -> float:
    """`text` as a number, its thousands separators read ("1,024", "1,234.5"); ValueError for anything else."""
    if "," in text and not _THOUSANDS.fullmatch(text.split(".")[0]):
        raise ValueError(f"could not convert string to float: {text!r}")
    return float(text.replace(",", ""))


def count_of(row: CorpusRow, column: str) -> int:
    """A row's whole count in `column` (batch, tokens, rank, GPUs); `Skip` for one that is not a number, below 1,
    or larger than any count a measurement row holds (`MAX_TOKENS`)."""
    value = row.get(column)
    try:
        number = plain_number(value)
        n = int(number)
    except (ValueError, OverflowError):  # OverflowError: inf
        raise Skip(f"{column} {value!r} is not a number") from None
    if n != number:
        raise Skip(f"{column} {value!r} is not a whole number")
    if n < 1:
        raise Skip(f"{column} {value!r} must be >= 1")
    if n > MAX_TOKENS:
        raise Skip(f"{column} {value!r} is larger than {MAX_TOKENS}")
    return n


_MEASURED = re.compile(r"(?:~|≈|about|approx\.?|approximately)?\s*([0-9][0-9,]*(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)\s*(.*)")


def measured_value(row: CorpusRow) -> float:
    """A row's measured `value`: a number, with thousands separators ("1,234.5"), marked approximate ("~30") or
    followed by the row's own unit ("30 GB" where the unit is GB); ValueError for anything else."""
    cell = row.get("value").strip()
    found = _MEASURED.fullmatch(cell.lower())
    if found is None or found.group(2) not in ("", row.get("unit").strip().lower()):
        return float(cell)  # "inf", "nan", or the ValueError naming the cell
    return plain_number(found.group(1))


def software_of(stack_cell: str, stated: str, stack: Any, throughput: bool) -> tuple[bool, bool]:
    """(torch_compile, liger_kernel) of a row's job: compile from its versions and notes (`stated`), Liger from those
    and its stack cell; a memory row under torch.compile, or Liger named under a stack without it, is skipped."""
    text = stated.lower()
    compiled = "compile" in text and "compile off" not in text
    text = f"{stack_cell.lower()} ; {text}"
    liger = "liger" in text and not any(f"{no} liger" in text for no in ("no", "without", "not"))
    if liger and not stack.simulator_spec.liger:
        raise Skip(f"--liger-kernel: Liger named under stack {stack.name}, which does not run it")
    if compiled and not throughput:
        raise Skip("torch.compile not modelled for memory (Inductor's partitioner chooses what the forward keeps)")
    return compiled, liger


# "dense" is Phi's and Falcon's attention output projection, "query_key_value" Falcon's fused q, k, v
_ATTENTION_TARGETS = {
    "query_key_value",
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "c_attn",
    "output_proj",
    "qkv_proj",
    "wqkv",
    "wo",
    "dense",
}
# NeMo 1 (`lora_tuning.target_modules`) and Megatron Core / NeMo 2 module names; NeMo's "attention" is qkv + dense
_ATTENTION_TARGETS |= {"attention_qkv", "attention_dense", "linear_qkv", "linear_proj", "attention"}
# NeMo / Megatron Core linears as the projections of transformers' model (linear_qkv and linear_fc1 are fused)
_MEGATRON_PROJECTIONS = {
    **dict.fromkeys(("attention_qkv", "linear_qkv"), ("q_proj", "k_proj", "v_proj")),
    **dict.fromkeys(("attention_dense", "linear_proj"), ("o_proj",)),
    **dict.fromkeys(("mlp_fc1", "linear_fc1"), ("gate_proj", "up_proj")),
    **dict.fromkeys(("mlp_fc2", "linear_fc2"), ("down_proj",)),
}
_ALL_LINEAR_TARGETS = ("all-linear", "all_linear", "all")  # PEFT's name; LLaMA-Factory's `lora_target: all`
# "dense_h_to_4h" / "dense_4h_to_h": Falcon's MLP
_MLP_TARGETS = {"gate_proj", "up_proj", "down_proj", "w1", "w2", "w3", "gate_up_proj", "fc1", "fc2"}
_MLP_TARGETS |= {"dense_h_to_4h", "dense_4h_to_h", "mlp_fc1", "mlp_fc2", "linear_fc1", "linear_fc2", "mlp"}
_BOTH_TARGETS = {"c_proj"}
_MODULES_TO_SAVE = {"wte": "embed_tokens", "embed_tokens": "embed_tokens", "lm_head": "lm_head"}  # -> transformers
# attention cell (case, spaces and punctuation ignored) -> FineTuneJob.attention: FlashAttention in any version,
# xformers' memory-efficient kernel and an unstated kernel keep what a fused kernel keeps (output and log-sum-exp)
_ATTENTION = {
    **dict.fromkeys(("", "unknown", "fa", "xformers", "memoryefficient"), "flash"),  # and `attention_for`'s prefixes
    **dict.fromkeys(("sdpa", "torchsdpa", "scaleddotproductattention"), "sdpa"),
    **dict.fromkeys(("eager", "math", "vanilla"), "eager"),
    # Transformer Engine's / cuDNN's fused attention: a FlashAttention-style kernel (no L x L scores kept)
    **dict.fromkeys(("te", "transformerengine", "cudnn", "cudnnfusedattention", "fusedattention", "fused"), "flash"),
}
_FLASH_WORDS = ("flashattention", "cudnn", "fmha", "fusedattention", "transformerengine", "memoryefficient")
_DTYPE_NAMES = (  # (cell pattern, compute dtype): "bfloat16", "bf16-mixed", "16-mixed" (Lightning's fp16),
    # "torch.bfloat16", "AMP (bf16)", "mixed_precision=bf16", ...: the first named, bf16 before fp16 before fp32
    (re.compile(r"(?<![a-z0-9])(?:bf16|bfloat16)(?![a-z0-9])"), "bf16"),
    (re.compile(r"(?<![a-z0-9])(?:fp16|float16|half|16)(?![a-z0-9])"), "fp16"),
    (re.compile(r"(?<![a-z0-9])(?:fp32|float32|32)(?![a-z0-9])"), "fp32"),
)
_GRAD_CKPT = {
    **dict.fromkeys(("on", "true", "yes", "y", "1", "enabled", "full", "\u2713", "\u2714", "gc", "ckpt"), "on"),
    "selective": "selective",  # Megatron's: the core attention only
    **dict.fromkeys(("off", "false", "no", "0", "disabled", "none"), "off"),
}
_RECOMPUTE_WORD = r"(?:recompute|recomputation|checkpoint|ckpt)"
# "no activation checkpointing", "recompute_num_layers=0", "recompute_granularity: null" (not "checkpointing, no
# offload")
_NO_RECOMPUTE = re.compile(
    rf"\b(?:no|without|disabled?)\s+(?:activation\s+|gradient\s+|grad\s+)?{_RECOMPUTE_WORD}"
    rf"|{_RECOMPUTE_WORD}\w*\s*[=:]?\s*(?:none|null|off|false|0|disabled|no)\b"
)
_ASIDE = re.compile(r"\s*[(\[][^)\]]*[)\]]")  # "sdpa (default)", "AdamW [DeepSpeed]": the aside a person skips


def _main(cell: str) -> str:
    """A free-text cell without its asides in brackets."""
    return _ASIDE.sub("", cell).strip()


def grad_ckpt_for(cell: str) -> tuple[str, bool | None] | None:
    """(on | off | selective, re-entrant or not where the cell says) of a row's grad_ckpt cell; None: not stated.
    "non-reentrant",
    "use_reentrant=False" and the like are checkpointing on without re-entrance; "reentrant" with it."""
    key = cell.strip().lower()
    if key in _GRAD_CKPT:
        return _GRAD_CKPT[key], None
    compact = re.sub(r"[\s_\-]", "", key)
    if "nonreentrant" in compact or "usereentrant=false" in compact or "usereentrant:false" in compact:
        return "on", False
    if "reentrant" in compact:
        return "on", True
    first = re.match(r"[^\s,;(]+", key)  # "on, no offload", "yes (default)"
    if _main(key) in _GRAD_CKPT or (first and first[0] in _GRAD_CKPT):
        return _GRAD_CKPT[_main(key) if _main(key) in _GRAD_CKPT else first[0]], None  # type: ignore[index]
    if "selective" in compact:  # "selective recompute", "recompute_granularity=selective"
        return "selective", None
    if any(word in compact for word in ("recompute", "recomputation", "checkpoint", "ckpt")):  # "activation recompute"
        negated = _NO_RECOMPUTE.search(key)
        return ("off" if negated else "on"), None
    return None


def attention_for(cell: str) -> str | None:
    """tunecost's attention for a row's attention cell (None: not known). "flash_attention_2", "flash-attn 2",
    "FA2" and "FlashAttention-2" are all flash."""
    key = _cell_key(cell)
    if key.startswith(("flash", "fa2", "fa3")) or any(word in key for word in _FLASH_WORDS):
        return "flash"
    if "sdpa" in key or "scaleddotproduct" in key:  # "PyTorch SDPA", "attn_implementation=sdpa"
        return "sdpa"
    if "eager" in key:  # "attn_implementation=eager"
        return "eager"
    return _ATTENTION.get(key) or (_ATTENTION.get(_cell_key(_main(cell))) if _main(cell) else None)


_TARGET_SEPARATOR = re.compile(r"[;,+|]|\s+and\s+")


def _target_names(cell: str) -> list[str]:
    """The names of a targets cell: "a;b", "a, b", "['a', 'b']", "a b" (a name with a note in parentheses kept
    whole: "lm_head (trained fully)")."""
    out: list[str] = []
    for item in _TARGET_SEPARATOR.split(cell):
        item = item.strip("[]'\" ")
        out += [item] if "(" in item else item.split()
    return [t for t in out if t]


def modules_to_save(cell: str) -> tuple[str, ...]:
    """The whole modules a LoRA targets cell trains beside the adapters, as transformers names them."""
    out = []
    for name in _target_names(cell):
        module = name.split()[0]
        if "trained fully" in name or module in _MODULES_TO_SAVE:
            if module not in _MODULES_TO_SAVE:
                raise Skip(f"fully trained {module} beside LoRA not modelled (not an embedding or output head)")
            out.append(_MODULES_TO_SAVE[module])
    return tuple(out)


# short names: "q,k,v,o", "qkv, proj" (Megatron's fused linear_qkv and linear_proj)
_SHORT_TARGETS = {short: f"{short}_proj" for short in ("q", "k", "v", "o", "gate", "up", "down")}
_SHORT_TARGETS |= {"qkv": "linear_qkv", "proj": "linear_proj", "dense": "dense"}


def lora_targets(cell: str, *, is_moe: bool = False) -> tuple[str, ...]:
    """tunecost's LoRA targets of a row's target names. PEFT's "all-linear" adapts every Linear but the output
    layer: the attention and the MLPs of a dense model; of an MoE model the attention, the experts and the router
    (each an nn.Linear in the transformers 4 MoE code that such rows ran)."""
    if re.match(r"all\W*(?:linear|proj)", cell.strip().lower()):  # "all linear layers (except lm_head)"
        cell = "all-linear"
    cell = re.sub(r"\s*\((?!trained)[^)]*\)", "", cell)  # "attention (qkv, proj)", "all-linear (7 modules)"
    names = [
        _SHORT_TARGETS.get(n.lower(), n.lower())
        for n in _target_names(cell)
        if not ("trained fully" in n or n.split()[0] in _MODULES_TO_SAVE)
    ]
    if not names:
        raise Skip("LoRA targets not stated")
    found: dict[str, set[str]] = {}  # group -> its names in the row ("*": the whole group)
    for name in names:
        if name.lower() in _ALL_LINEAR_TARGETS:
            groups = ("attention", "experts", "router") if is_moe else ("attention", "mlp")
        elif name in _ATTENTION_TARGETS or name in _MLP_TARGETS:
            group = "attention" if name in _ATTENTION_TARGETS else "mlp"
            found.setdefault(group, set()).update(_MEGATRON_PROJECTIONS.get(name, (name,)))
            continue
        elif name in _BOTH_TARGETS:
            groups = ("attention", "mlp")
        else:
            raise Skip(f"LoRA target {name!r} not known")
        for group in groups:
            found.setdefault(group, set()).add("*")
    return tuple(sorted(t for group, listed in found.items() for t in group_targets(group, listed)))


_OPTIMIZERS = {  # normalised optimizer cell -> FineTuneJob.optimizer
    **dict.fromkeys(
        ("", "adamw", "adam", "adamwtorch", "adamwtorchfused", "adamwhf", "adamwapexfused", "fusedadam", "torchadamw"),
        "adamw",
    ),
    # NeMo's / Apex's: fused AdamW kernels (the distributed one shards like Megatron's distributed optimizer)
    **dict.fromkeys(
        ("distributedfusedadam", "distributedadam", "fusedadamw", "apexfusedadam", "mcoredistributedoptim"), "adamw"
    ),
    **dict.fromkeys(("adamw8bit", "adamwbnb8bit", "8bitadamw", "bnbadamw8bit", "adam8bit"), "adamw-8bit"),
    **dict.fromkeys(("adamwtorch4bit", "adamw4bit", "4bitadamw", "torchaoadamw4bit"), "adamw-4bit"),
    "sgd": "sgd",
}
_FUSED_ADAMW = (
    "adamwtorchfused",
    "adamwapexfused",
    "fusedadam",
    "distributedfusedadam",
    "fusedadamw",
    "apexfusedadam",
)  # one kernel per step: no foreach temporaries


_METHODS = {  # a method cell without case or punctuation -> tunecost's method
    **dict.fromkeys(("full", "sft", "fullsft", "fft", "fullfinetune", "fullfinetuning", "fullparameter"), "full"),
    **dict.fromkeys(("lora", "peftlora", "lorasft"), "lora"),
    "qlora": "qlora",
}


def method_for(cell: str) -> str:
    """tunecost's method for a row's method cell ("SFT", "full fine-tune", "LoRA (r=16)", "SFT (LoRA)", "PEFT"),
    else the cell lower-cased."""
    key = _cell_key(cell)
    if "qlora" in key:
        return "qlora"
    if "lora" in key or key in ("peft", "lowrankadaptation"):
        return "lora"
    if key.startswith(("full", "sft", "supervised", "pretrain", "continuedpretrain")) or key in ("ft", "cpt"):
        return "full"  # "Full FT", "SFT full", "Supervised fine-tuning"; pre-training's step is a full fine-tune's
    return _METHODS.get(key, _METHODS.get(_cell_key(_main(cell)), cell.lower()))


def _cell_key(cell: str) -> str:
    """A cell without case, spaces or punctuation ("Paged AdamW 8-bit" -> "pagedadamw8bit")."""
    return re.sub(r"[^0-9a-z]+", "", cell.lower())


def adamw_impl_for(cell: str, stack_impl: str) -> str:
    """The AdamW implementation a row's optimizer cell names (`simulate.behaviour.ADAMW_IMPLS`): a fused kernel where
    the cell says so, else the stack's own."""
    fused = _cell_key(cell) in _FUSED_ADAMW or ("adam" in cell.lower() and "fused" in cell.lower())
    return ADAMW_FUSED if fused else stack_impl


_OPTIMIZER_PREFIX = re.compile(r"^(?:torchoptim|torch|deepspeed|ds|apex)")


def optimizer_for(cell: str, *, adapters_only: bool = False, offloaded: bool = False) -> tuple[str, str]:
    """tunecost's optimizer for a row's optimizer cell (case, spaces and punctuation ignored), and a note on how it
    was read ("" if as named); `Skip` for one the simulator does not run. A paged optimizer (bitsandbytes: its states
    in CUDA unified memory, outside PyTorch's allocator) is read as its unpaged self where it updates LoRA adapters
    alone (`adapters_only`), whose states are a few MiB; where it holds a model's states, skipped. DeepSpeed's CPU
    Adam is AdamW run on the host where the row offloads the optimizer (`offloaded`); without that, skipped."""
    key = _cell_key(cell)
    note = ""
    if "cpuadam" in key:  # "cpu_adam", "DeepSpeedCPUAdam", "deepspeed.ops.adam.DeepSpeedCPUAdam"
        if not offloaded:
            raise Skip(f"optimizer {cell!r} runs on the host, but the row offloads no optimizer state")
        return "adamw", f"optimizer {cell!r}: AdamW's step on the host, where the row's offload puts it"
    if "paged" in key:
        if not adapters_only:
            raise Skip(
                f"optimizer {cell!r} not modelled beside trained model weights (paged optimizer states live in "
                "CUDA unified memory, outside PyTorch's allocator)"
            )
        key = key.replace("paged", "").replace("32bit", "")
        note = (
            f"optimizer {cell!r} read as its unpaged self: the adapters' states (a few MiB) counted in the allocator, "
            "where the paged ones live in CUDA unified memory"
        )
    key = key if key in _OPTIMIZERS else _OPTIMIZER_PREFIX.sub("", key)  # "torch.optim.AdamW", "DeepSpeed FusedAdam"
    if key not in _OPTIMIZERS:
        first = (re.findall(r"[a-z0-9]+", cell.lower()) or [""])[0]  # "adamw (DeepSpeed, fused)": AdamW
        low_bit = next((f"adamw-{b}" for b in ("8bit", "4bit") if b in key), "adamw")
        named = low_bit if first.startswith("adam") else ""
        if not named:
            raise Skip(f"optimizer {cell!r} not modelled (tunecost runs AdamW, 8- and 4-bit AdamW and SGD)")
        return named, "; ".join(filter(None, (note, f"optimizer {cell!r} read as {named}")))
    return _OPTIMIZERS[key], note


_FP8_PARAMS = (
    "fp8 params",
    "fp8_params",
    "fp8-params",
    "fp8 weights",
    "fp8_model_init",
    "param gather",
    "param_gather",
)


def fp8_params_of(cell: str) -> bool:
    """Whether a `compute_dtype` cell says the weights are kept in FP8 (Transformer Engine's `fp8_model_init`:
    NeMo `fp8_params`, Megatron-LM `--fp8-param-gather`)."""
    return any(word in cell.strip().lower() for word in _FP8_PARAMS)


def precision_of(compute_cell: str, quantization: str, stack_cell: str) -> tuple[str, str, bool]:
    """(compute dtype, FP8 recipe, weights kept in FP8) of a row: its `compute_dtype` cell (`fp8_of`,
    `fp8_params_of`); a `quantization` of fp8 is weights kept in FP8 under Transformer Engine's FP8 compute (MLPerf's
    LoRA on NeMo), `Skip` outside Transformer Engine."""
    cell = compute_cell or "bf16"
    if quantization == "fp8":
        cell = f"{cell} fp8 params" if "fp8" in cell.lower() else "fp8 params"
    dtype, fp8 = fp8_of(cell, stack_cell)
    fp8_params = fp8 == "te-delayed" and fp8_params_of(cell)
    if quantization == "fp8" and not fp8_params:
        raise Skip("fp8 weights outside Transformer Engine (NeMo, Megatron) not modelled")
    return dtype, fp8, fp8_params


def fp8_of(cell: str, stack_cell: str) -> tuple[str, str]:
    """(compute dtype, FP8 recipe) of a `compute_dtype` cell: "fp8" (or "fp8-hybrid", "fp8 (te)") is bf16 with FP8
    linears, Transformer Engine's delayed scaling under NeMo / Megatron or a cell naming TE, else torchao's
    tensorwise scaling."""
    text = re.sub(r"float8|e4m3", "fp8", cell.strip().lower())  # "float8 (e4m3)"
    if "fp8" not in text:
        return next((dtype for pattern, dtype in _DTYPE_NAMES if pattern.search(text)), cell), "none"
    te = any(name in f"{text} {stack_cell.lower()}" for name in ("te", "transformer engine", "nemo", "megatron"))
    return "bf16", "te-delayed" if te else "tensorwise"
