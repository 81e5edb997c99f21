"""One corpus row -> the `FineTuneJob` tunecost simulates, the stack, and the GPU memory; or why it cannot.

Sources and derivations: docs/validation.md, section `tunecost.validate.mapping`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.errors import TunecostError
from tunecost.limits import MAX_TOKENS
from tunecost.models.anatomy import SUPPORTED_FAMILIES
from tunecost.models.catalog import gptq_checkpoint, resolve_model
from tunecost.simulate.behaviour import ADAMW_FUSED, DEFAULT_BEHAVIOUR, DeepSpeedZero2, StackBehaviour
from tunecost.validate.corpus import CorpusRow
from tunecost.validate.stacks import Stack, behaviour_for, stack_for
from tunecost.workload.frameworks.registry import framework_defaults
from tunecost.workload.job import FineTuneJob, LoraConfig
from tunecost.workload.parallel import ParallelPlan

PEAK_MEMORY_QUANTITIES = ("peak_allocated_gib", "peak_reserved_gib", "nvidia_smi_gib")
MEMORY_QUANTITIES = (*PEAK_MEMORY_QUANTITIES, "oom")
THROUGHPUT_QUANTITIES = ("tokens_per_s_per_gpu", "samples_per_s", "s_per_step", "time_to_train_s")
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
_ALL_LINEAR_TARGETS = ("all-linear", "all_linear", "all")  # PEFT's name; LLaMA-Factory's `lora_target: all`
# "dense_h_to_4h" / "dense_4h_to_h": Falcon's MLP
_MLP_TARGETS = {"gate_proj", "up_proj", "down_proj", "w1", "w2", "w3", "gate_up_proj", "fc1", "fc2"}
_MLP_TARGETS |= {"dense_h_to_4h", "dense_4h_to_h"}
_BOTH_TARGETS = {"c_proj"}
_MODULES_TO_SAVE = {"wte": "embed_tokens", "embed_tokens": "embed_tokens", "lm_head": "lm_head"}  # -> transformers
_GPTQ_KERNELS = (("accelerated-peft-autogptq", "triton-v2"), ("qwen finetune.py", "torch"))  # corpus stack cell
NODE_GPUS = 8  # GPUs per node assumed for a row on more GPUs than one node holds (HGX / DGX servers)
# attention cell (case, spaces and punctuation ignored) -> FineTuneJob.attention: FlashAttention in any version,
# xformers' memory-efficient kernel and an unstated kernel keep what a fused kernel keeps (output and log-sum-exp)
_ATTENTION = {
    **dict.fromkeys(("", "unknown", "fa", "xformers", "memoryefficient"), "flash"),  # and `attention_for`'s prefixes
    **dict.fromkeys(("sdpa", "torchsdpa", "scaleddotproductattention"), "sdpa"),
    **dict.fromkeys(("eager", "math", "vanilla"), "eager"),
}
_GRAD_CKPT = {
    **dict.fromkeys(("on", "true", "yes", "1", "enabled", "full", "selective"), "on"),
    **dict.fromkeys(("off", "false", "no", "0", "disabled", "none"), "off"),
}
_ASIDE = re.compile(r"\s*[(\[][^)\]]*[)\]]")  # "sdpa (default)", "AdamW [DeepSpeed]": the aside a person skips


def _main(cell: str) -> str:
    """A free-text cell without its asides in brackets."""
    return _ASIDE.sub("", cell).strip()


def grad_ckpt_for(cell: str) -> tuple[str, bool | None] | None:
    """(on | off, re-entrant or not where the cell says) of a row's grad_ckpt cell; None: not stated. "non-reentrant",
    "use_reentrant=False" and the like are checkpointing on without re-entrance; "reentrant" with it."""
    key = cell.strip().lower()
    if key in _GRAD_CKPT:
        return _GRAD_CKPT[key], None
    compact = re.sub(r"[\s_\-]", "", key)
    if "nonreentrant" in compact or "usereentrant=false" in compact or "usereentrant:false" in compact:
        return "on", False
    if "reentrant" in compact:
        return "on", True
    return (_GRAD_CKPT[_main(key)], None) if _main(key) in _GRAD_CKPT else None


def attention_for(cell: str) -> str | None:
    """tunecost's attention for a row's attention cell (None: not known). "flash_attention_2", "flash-attn 2",
    "FA2" and "FlashAttention-2" are all flash."""
    key = _cell_key(cell)
    if key.startswith(("flash", "fa2", "fa3")):
        return "flash"
    return _ATTENTION.get(key) or (_ATTENTION.get(_cell_key(_main(cell))) if _main(cell) else None)


class Skip(Exception):
    """A row tunecost does not model; the message is the reason."""


@dataclass(frozen=True)
class MappedRow:
    job: FineTuneJob
    stack: Stack
    gpu_memory_bytes: int | None
    gpu_name: str | None = None  # the GPU catalog's name (None: not in the catalog)
    grad_accum: int = 1
    num_gpus: int = 1  # data-parallel ranks; above 1 the row is one rank of `strategy`
    strategy: str | None = None  # a `workload.parallel.STRATEGIES` name when num_gpus > 1 or DeepSpeed runs one rank
    offload: str = "none"  # CPU offload of the strategy (`workload.offload.OFFLOAD_CHOICES`)
    deepspeed: DeepSpeedZero2 | None = None  # the stack's ZeRO-1/2 gradient buckets (None: DeepSpeed's defaults)
    behaviour: StackBehaviour = DEFAULT_BEHAVIOUR  # library behaviours of the row's stack (see `stacks`)
    note: str = ""  # what the mapping read differently from the row's cells, and why (shown as the row's reason)

    @property
    def simulator_job(self) -> FineTuneJob:
        """The job under the simulator stack of the row's named stack (`tunecost` where it names none)."""
        return self.job.with_(stack=self.stack.simulator_stack or "tunecost")

    def plan(self) -> ParallelPlan:
        """The row's data-parallel layout: one node up to `NODE_GPUS` GPUs, whole nodes of `NODE_GPUS` above; a
        single-GPU row of a DeepSpeed stack is one rank of its ZeRO stage."""
        if self.strategy is None:
            return ParallelPlan()
        per_node = min(self.num_gpus, NODE_GPUS)
        plan = ParallelPlan(
            num_gpus=self.num_gpus, gpus_per_node=per_node, strategy=self.strategy, offload=self.offload
        )
        if self.deepspeed is None:
            return plan
        return dataclasses.replace(
            plan, reduce_bucket_elements=self.deepspeed.reduce_bucket_elements, overlap_comm=self.deepspeed.overlap_comm
        )


def _int(row: CorpusRow, column: str) -> int:
    value = row.get(column)
    try:
        n = int(float(value))
    except (ValueError, OverflowError):  # OverflowError: inf
        raise Skip(f"{column} {value!r} is not a number") from None
    if n < 1:
        raise Skip(f"{column} {value!r} must be >= 1")
    if n > MAX_TOKENS:  # no count in a measurement row (batch, tokens, rank, GPUs) comes near it
        raise Skip(f"{column} {value!r} is larger than {MAX_TOKENS}")
    return n


def _target_names(cell: str) -> list[str]:
    return [t.strip() for t in cell.split(";") if t.strip()]


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


def lora_targets(cell: str, *, is_moe: bool = False) -> tuple[str, ...]:
    """tunecost's LoRA targets of a row's target names. PEFT's "all-linear" adapts every Linear but the output
    layer: the attention and the MLPs of a dense model; of an MoE model the attention, the experts and the router
    (each an nn.Linear in the transformers 4 MoE code that such rows ran)."""
    names = [n for n in _target_names(cell) if not ("trained fully" in n or n.split()[0] in _MODULES_TO_SAVE)]
    if not names:
        raise Skip("LoRA targets not stated")
    out: set[str] = set()
    for name in names:
        if name.lower() in _ALL_LINEAR_TARGETS:
            out |= {"attention", "experts", "router"} if is_moe else {"attention", "mlp"}
        elif name in _ATTENTION_TARGETS:
            out.add("attention")
        elif name in _MLP_TARGETS:
            out.add("mlp")
        elif name in _BOTH_TARGETS:
            out |= {"attention", "mlp"}
        else:
            raise Skip(f"LoRA target {name!r} not known")
    return tuple(sorted(out))


_OPTIMIZERS = {  # normalised optimizer cell -> FineTuneJob.optimizer
    **dict.fromkeys(
        ("", "adamw", "adam", "adamwtorch", "adamwtorchfused", "adamwhf", "adamwapexfused", "fusedadam", "torchadamw"),
        "adamw",
    ),
    **dict.fromkeys(("adamw8bit", "adamwbnb8bit", "8bitadamw", "bnbadamw8bit", "adam8bit"), "adamw-8bit"),
    "sgd": "sgd",
}
_FUSED_ADAMW = ("adamwtorchfused", "adamwapexfused", "fusedadam")  # one kernel per step: no foreach temporaries


def _cell_key(cell: str) -> str:
    """A cell without case, spaces or punctuation ("Paged AdamW 8-bit" -> "pagedadamw8bit")."""
    return re.sub(r"[^0-9a-z]+", "", cell.lower())


def adamw_impl_for(cell: str, stack_impl: str) -> str:
    """The AdamW implementation a row's optimizer cell names (`simulate.behaviour.ADAMW_IMPLS`): a fused kernel where
    the cell says so, else the stack's own."""
    fused = _cell_key(cell) in _FUSED_ADAMW or ("adam" in cell.lower() and "fused" in cell.lower())
    return ADAMW_FUSED if fused else stack_impl


def optimizer_for(cell: str, *, adapters_only: bool = False) -> tuple[str, str]:
    """tunecost's optimizer for a row's optimizer cell (case, spaces and punctuation ignored), and a note on how it
    was read ("" if as named); `Skip` for one the simulator does not run. A paged optimizer (bitsandbytes: its states
    in CUDA unified memory, outside PyTorch's allocator) is read as its unpaged self where it updates LoRA adapters
    alone (`adapters_only`), whose states are a few MiB; where it holds a model's states, skipped."""
    key = _cell_key(cell)
    note = ""
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
    if key not in _OPTIMIZERS:
        first = (re.findall(r"[a-z0-9]+", cell.lower()) or [""])[0]  # "adamw (DeepSpeed, fused)": AdamW
        named = "adamw-8bit" if first.startswith("adam") and "8bit" in key else "adamw" * first.startswith("adam")
        if not named:
            raise Skip(f"optimizer {cell!r} not modelled (tunecost runs AdamW, 8-bit AdamW and SGD)")
        return named, "; ".join(filter(None, (note, f"optimizer {cell!r} read as {named}")))
    return _OPTIMIZERS[key], note


def gpu_unknown_reason(name: str) -> str:
    """Why a corpus GPU spelling has no catalog entry: not in the catalog, or ambiguous (the catalog's message,
    naming the candidates)."""
    try:
        resolve_gpu_name(name.strip())
    except TunecostError as exc:
        if str(exc).startswith("ambiguous"):
            return str(exc).splitlines()[0]
    return f"GPU {name!r} not in the GPU catalog"


def catalog_gpu(name: str):
    """The GPU catalog entry of a corpus GPU spelling (None: not in the catalog)."""
    key = name.strip()
    if not key:
        return None
    try:
        return resolve_gpu_name(key).gpu  # the catalog resolves the spellings sources print (nvidia-smi's too)
    except TunecostError:
        return None


def gpu_memory_bytes(name: str) -> int | None:
    gpu = catalog_gpu(name)
    return None if gpu is None else gpu.usable_memory_bytes


def map_row(row: CorpusRow) -> MappedRow:
    """The job of one single-GPU row; raises `Skip` with the reason for anything tunecost does not model."""
    quantity = row.get("quantity")
    throughput = quantity in THROUGHPUT_QUANTITIES
    if quantity == "time_to_train_s":
        raise Skip("time_to_train_s not modelled (the number of steps is not in the row)")
    if not throughput and quantity not in MEMORY_QUANTITIES:
        raise Skip(f"unsupported quantity {quantity!r}")
    num_gpus = _int(row, "num_gpus")
    strategy, offload = multi_gpu_layout(row) if num_gpus != 1 else (None, "none")
    quantization = row.get("quantization") or "none"
    if quantization not in ("none", "bnb-nf4", "gptq-int4"):
        raise Skip(f"{quantization} quantization not modelled")
    stack = stack_for(row.get("stack"), quantization, framework_of(row))
    if stack is None:
        raise Skip(f"unknown stack {row.get('stack')!r}")
    if stack.simulator_stack is None and not throughput:
        raise Skip(stack.skip_reason or f"stack {stack.name} not modelled")
    if strategy == "fsdp1" and stack.name == "torchtune" and "fsdp1" not in row.get("parallelism").lower():
        strategy = "fsdp2"  # torchtune's distributed recipes shard with FSDP2's fully_shard, not accelerate's FSDP1
    try:
        spec = resolve_model(row.get("model"))
    except TunecostError:
        raise Skip(f"unknown model {row.get('model')!r} (not in the catalog)") from None
    if spec.family not in SUPPORTED_FAMILIES:
        raise Skip(f"architecture {spec.family!r} not simulated")
    method = row.get("method")
    if method not in ("full", "lora", "qlora"):
        raise Skip(f"unknown method {method!r}")
    if (method == "qlora") != (quantization in ("bnb-nf4", "gptq-int4")):
        raise Skip(f"method {method} with quantization {quantization} not modelled")
    gptq = gptq_settings(row) if quantization == "gptq-int4" else {}
    deepspeed = stack.deepspeed_for(method, num_gpus) if method == "full" else None
    if method == "full" and not stack.full_finetune_modelled and deepspeed is None and not throughput:
        raise Skip(f"full fine-tune under stack {stack.name} not modelled ({stack.full_skip_reason})")
    if deepspeed is not None and not throughput:  # one rank of DeepSpeed ZeRO-2
        strategy = "zero2"
    kind = row.get("seq_len_kind") or "fixed"
    if kind not in ("fixed", "packed", "max"):
        raise Skip(f"sequence lengths {kind!r} (a dataset's lengths are not in the row)")
    if throughput and kind == "max":
        raise Skip(
            "throughput with sequences up to seq_len (the dataset's lengths, which set the work, are not in the row)"
        )
    if kind == "max" and not row.get("dataset"):
        raise Skip(
            "peak memory with sequences up to seq_len of a dataset the row does not name (whether a batch reaches "
            "seq_len, the worst case tunecost sizes, is not known)"
        )
    if not throughput and names_torch_compile(row):
        raise Skip("torch.compile not modelled for memory (Inductor's partitioner chooses what the forward keeps)")
    defaults = framework_defaults(row.get("stack"), row.get("model"), method)
    defaulted: list[str] = []
    stated = grad_ckpt_for(row.get("grad_ckpt"))
    if stated is None and defaults is not None and "gradient_checkpointing" in defaults.options:
        on = defaults.options["gradient_checkpointing"]
        stated = ("on" if on else "off", defaults.options.get("reentrant") if on else None)
        defaulted.append(f"gradient checkpointing {stated[0]}: {defaults.framework}")
    if stated is None:
        raise Skip("gradient checkpointing not stated")
    ckpt, reentrant = stated
    attention = attention_for(row.get("attention"))
    if attention is None:
        raise Skip(f"attention {row.get('attention')!r} not known")
    dtype = row.get("compute_dtype") or "bf16"
    saved = modules_to_save(row.get("lora_targets")) if method != "full" else ()
    optimizer, optimizer_note = optimizer_for(row.get("optimizer"), adapters_only=method != "full" and not saved)
    if throughput and method == "full" and optimizer != "adamw":
        raise Skip(f"throughput with optimizer {row.get('optimizer')!r} (the counts price AdamW's step)")
    lora = LoraConfig()
    if method != "full":
        rank = _int(row, "lora_rank") if row.get("lora_rank") else None
        default_alpha = None
        if rank is None and defaults is not None and "lora_rank" in defaults.options:
            rank, default_alpha = int(defaults.options["lora_rank"]), defaults.options.get("lora_alpha")
            defaulted.append(f"LoRA rank {rank}: {defaults.framework}")
        if rank is None:
            raise Skip("LoRA rank not stated")
        try:
            alpha = float(row.get("lora_alpha") or default_alpha or 2 * rank)
            targets = None
            if not row.get("lora_targets") and defaults is not None and "lora_targets" in defaults.options:
                targets = tuple(str(defaults.options["lora_targets"]).split(","))
                defaulted.append(f"LoRA targets {','.join(targets)}: {defaults.framework}")
            lora = LoraConfig(
                rank=rank, alpha=alpha, targets=targets or lora_targets(row.get("lora_targets"), is_moe=spec.is_moe)
            )
        except (ValueError, TunecostError) as exc:
            raise Skip(f"LoRA settings not usable: {exc}") from None
    seq_len, note = _int(row, "seq_len"), "; ".join(filter(None, (optimizer_note, *defaulted)))
    if spec.max_positions is not None and seq_len > spec.max_positions:
        positions = (
            f"seq_len {seq_len} is beyond the model's {spec.max_positions} learned positions, which no run can "
            f"exceed: modelled at {spec.max_positions} (the stack cut the sequences)"
        )
        note = "; ".join(filter(None, (note, positions)))
        seq_len = spec.max_positions
    try:
        job = FineTuneJob(
            model=spec.name,
            method=method,  # type: ignore[arg-type]
            lora=lora,
            compute_dtype=dtype,
            gradient_checkpointing=ckpt == "on",
            attention=attention,
            optimizer=optimizer,
            batch_size=_int(row, "batch_size_per_gpu"),
            seq_len=seq_len,
            modules_to_save=saved,
            **gptq,
        )
    except TunecostError as exc:
        raise Skip(str(exc)) from None
    gpu = catalog_gpu(row.get("gpu"))
    if quantity == "oom" and gpu is None:
        raise Skip(f"{gpu_unknown_reason(row.get('gpu'))} (its memory decides out-of-memory)")
    if throughput and gpu is None:
        raise Skip(f"{gpu_unknown_reason(row.get('gpu'))} (its peak rate and bandwidth set the step time)")
    grad_accum = _int(row, "grad_accum") if row.get("grad_accum") else 1
    behaviour = behaviour_for(
        stack,
        model_id=row.get("model"),
        stack_versions=row.get("stack_versions"),
        stack_cell=row.get("stack"),
        num_gpus=num_gpus,
        strategy=strategy,
        family=spec.family,
        method=method,
    )
    return MappedRow(
        job=job,
        stack=stack,
        gpu_memory_bytes=None if gpu is None else gpu.usable_memory_bytes,
        gpu_name=None if gpu is None else gpu.name,
        grad_accum=grad_accum,
        num_gpus=num_gpus,
        strategy=strategy,
        offload=offload,
        deepspeed=deepspeed,
        behaviour=dataclasses.replace(
            behaviour,
            adamw_impl=adamw_impl_for(row.get("optimizer"), behaviour.adamw_impl),
            reentrant_checkpointing=reentrant,
        ),
        note=note,
    )


def names_torch_compile(row: CorpusRow) -> bool:
    """True when a row's stack_versions or notes say the step ran under torch.compile."""
    stated = f"{row.get('stack_versions')} ; {row.get('notes')}".lower()
    return "compile" in stated and "compile off" not in stated


def framework_of(row: CorpusRow) -> str:
    """fms-acceleration's framework configuration, stated in its rows' notes as "framework NAME" ("" if none)."""
    first = row.get("notes").split(";")[0].strip()
    return first.removeprefix("framework ").strip() if first.startswith("framework ") else ""


def gptq_settings(row: CorpusRow) -> dict[str, Any]:
    """The job fields of a gptq-int4 row: the checkpoint's group size (catalog) and the kernel its stack loads."""
    checkpoint = gptq_checkpoint(row.get("model"))
    if checkpoint is None:
        raise Skip(f"gptq-int4: {row.get('model')!r} is not a GPTQ checkpoint in the catalog (group size unknown)")
    corpus_stack = row.get("stack").lower()
    kernel = next((k for sub, k in _GPTQ_KERNELS if sub in corpus_stack), None)
    if kernel is None:
        raise Skip(f"gptq-int4 under stack {row.get('stack')!r}: the GPTQ kernel it loads is not known")
    return {"quant_type": "gptq", "gptq_group_size": checkpoint.group_size, "gptq_kernel": kernel}


_ZERO_STAGE = re.compile(r"zero[\s_-]*(?:stage[\s_-]*)?([123])")


def multi_gpu_layout(row: CorpusRow) -> tuple[str, str]:
    """(strategy, offload) of a multi-GPU row, read from its `parallelism` cell (case-insensitive):
    - DeepSpeed ZeRO: "zero1/2/3", "zero-2", "zero stage 3" -> zeroN; with "offload": "params" where the cell
      names parameters, "optimizer" where it names the optimizer only, else ZeRO-3's common offload configuration
      (parameters and optimizer: "params") and ZeRO-1/2's only one ("optimizer");
    - DDP ("ddp", "data parallel") -> ddp;
    - FSDP: FULL_SHARD (a bare "fsdp" included) -> fsdp1, the torch FullyShardedDataParallel that accelerate's FSDP
      plugin runs (the corpus's FSDP rows), or fsdp2 where the cell says "fsdp2" or "fully_shard";
      SHARD_GRAD_OP -> fsdp2-shard-grad-op; with "offload": FSDP's CPU offload (parameter and gradient shards and
      the optimizer step on the host: "params");
    `Skip` for anything else (tensor, pipeline, hybrid sharding; DeepSpeed without a stage) and for a GPU count
    that fills no whole nodes of `NODE_GPUS`."""
    parallelism = (row.get("parallelism") or "").strip().lower()
    num_gpus = _int(row, "num_gpus")
    if num_gpus > NODE_GPUS and num_gpus % NODE_GPUS:
        raise Skip(f"{num_gpus} GPUs fill no whole nodes of {NODE_GPUS} GPUs (the node layout is not in the row)")
    offload = "offload" in parallelism
    unknown = f"multi-GPU parallelism {parallelism or 'unstated'!r} not modelled (DDP, DeepSpeed ZeRO 1-3, FSDP)"
    if any(word in parallelism for word in ("tensor", "pipeline", "hybrid", "no_shard", "megatron")):
        raise Skip(unknown)
    stage = _ZERO_STAGE.search(parallelism)
    if stage:
        strategy = f"zero{stage.group(1)}"
        if not offload:
            return strategy, "none"
        if "param" in parallelism:
            return strategy, "params"
        return strategy, "params" if strategy == "zero3" and "optim" not in parallelism else "optimizer"
    if "ddp" in parallelism or "data parallel" in parallelism:
        if offload:
            raise Skip(f"multi-GPU parallelism {parallelism!r}: DDP has no CPU offload")
        return "ddp", "none"
    if "fsdp" in parallelism or "fully_shard" in parallelism:
        if "shard_grad_op" in parallelism or "shard grad op" in parallelism:
            if offload:
                raise Skip(f"multi-GPU parallelism {parallelism!r}: CPU offload with SHARD_GRAD_OP not modelled")
            return "fsdp2-shard-grad-op", "none"
        strategy = "fsdp2" if "fsdp2" in parallelism or "fully_shard" in parallelism else "fsdp1"
        return strategy, "params" if offload else "none"
    raise Skip(unknown)
