"""One corpus row -> the `FineTuneJob` tunecost simulates, the stack, and the GPU memory; or why it cannot.

Sources and derivations: docs/validation.md, section `tunecost.validate.mapping`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.catalog.held_out_errors import THROUGHPUT_QUANTITIES
from tunecost.errors import TunecostError
from tunecost.estimate.throughput.lengths import SeqLengths
from tunecost.models.catalog import gptq_checkpoint, resolve_model
from tunecost.models.families import SUPPORTED_FAMILIES
from tunecost.simulate.behaviour import DEFAULT_BEHAVIOUR, DeepSpeedZero2, StackBehaviour
from tunecost.validate.cells import (
    Skip,
    adamw_impl_for,
    attention_for,
    count_of,
    gpu_count_of,
    grad_ckpt_for,
    lora_targets,
    method_for,
    modules_to_save,
    optimizer_for,
    precision_of,
    software_of,
    tokens_of,
)
from tunecost.validate.corpus import CorpusRow
from tunecost.validate.model_parallel_cells import (
    NODE_GPUS,
    grad_accum_of,
    micro_batch_of,
    model_parallel_row,
    multi_gpu_layout,
    row_expert_parallel,
)
from tunecost.validate.row_lengths import check_lengths, max_lengths
from tunecost.validate.stack_behaviour import behaviour_for
from tunecost.validate.stacks import Stack, stack_for
from tunecost.workload.frameworks.registry import framework_defaults
from tunecost.workload.job import FineTuneJob, LoraConfig
from tunecost.workload.parallel import ModelParallel, ParallelPlan

PEAK_MEMORY_QUANTITIES = ("peak_allocated_gib", "peak_reserved_gib", "nvidia_smi_gib")
MEMORY_QUANTITIES = (*PEAK_MEMORY_QUANTITIES, "oom")
_NOT_QUANTIZED = ("no", "n/a", "-", "bf16", "fp16", "fp32", "bfloat16", "float16")  # the weights' own dtype
QUANTIZED = ("bnb-nf4", "bnb-int8", "gptq-int4")  # a row's quantization cell under QLoRA (8-bit LoRA: bnb-int8)
QUANT_JOB_FIELDS = {"bnb-int8": {"quant_type": "int8"}}  # gptq-int4's come from the catalog (`gptq_settings`)
_GPTQ_KERNELS = (("accelerated-peft-autogptq", "triton-v2"), ("qwen finetune.py", "torch"))  # corpus stack cell
_GPU_COUNT = re.compile(r"^\d+\s*[x\u00d7]\s*", re.IGNORECASE)  # "8xH100", "8 x A100-80GB"


@dataclass(frozen=True)
class MappedRow:
    job: FineTuneJob
    stack: Stack
    gpu_memory_bytes: int | None
    gpu_name: str | None = None  # the GPU catalog's name (None: not in the catalog)
    num_gpus: int = 1  # data-parallel ranks; above 1 the row is one rank of `strategy`
    strategy: str | None = None  # a `workload.parallel.STRATEGIES` name when num_gpus > 1 or DeepSpeed runs one rank
    offload: str = "none"  # CPU offload of the strategy (`workload.offload.OFFLOAD_CHOICES`)
    deepspeed: DeepSpeedZero2 | None = None  # the stack's ZeRO-1/2 gradient buckets (None: DeepSpeed's defaults)
    behaviour: StackBehaviour = DEFAULT_BEHAVIOUR  # library behaviours of the row's stack (see `stacks`)
    model_parallel: ModelParallel | None = None  # the row's TP/PP/CP degrees (None: data parallelism only)
    expert_parallel: int = 1  # ranks of the data-parallel group that share the routed experts
    lengths: SeqLengths | None = None  # a micro-batch's lengths where they run up to seq_len (None: seq_len each)
    note: str = ""  # what the mapping read differently from the row's cells, and why (shown as the row's reason)

    @property
    def grad_accum(self) -> int:
        return self.job.grad_accum

    @property
    def simulator_job(self) -> FineTuneJob:
        """The job under the simulator stack of the row's named stack (`tunecost` where it names none)."""
        return self.job.with_(stack=self.stack.simulator_spec.name)

    def plan(self) -> ParallelPlan:
        """The row's data-parallel layout: one node up to `NODE_GPUS` GPUs, whole nodes of `NODE_GPUS` above; a
        single-GPU row of a DeepSpeed stack is one rank of its ZeRO stage."""
        if self.strategy is None:
            return ParallelPlan()
        per_node = min(self.num_gpus, NODE_GPUS)
        mp = dataclasses.asdict(self.model_parallel) if self.model_parallel is not None else {}
        plan = ParallelPlan(
            num_gpus=self.num_gpus,
            gpus_per_node=per_node,
            strategy=self.strategy,
            offload=self.offload,
            expert_parallel=self.expert_parallel,
            **mp,
        )
        if self.deepspeed is None:
            return plan
        return dataclasses.replace(
            plan, reduce_bucket_elements=self.deepspeed.reduce_bucket_elements, overlap_comm=self.deepspeed.overlap_comm
        )


def gpu_unknown_reason(name: str) -> str:
    """Why a corpus GPU spelling has no catalog entry: not in the catalog, or ambiguous (the catalog's message,
    naming the candidates)."""
    try:
        resolve_gpu_name(_GPU_COUNT.sub("", name.strip()))
    except TunecostError as exc:
        if str(exc).startswith("ambiguous"):
            return str(exc).splitlines()[0]
    return f"GPU {name!r} not in the GPU catalog"


def catalog_gpu(name: str):
    """The GPU catalog entry of a corpus GPU spelling (None: not in the catalog); a count before it ("8xH100")
    is the `num_gpus` cell's."""
    key = _GPU_COUNT.sub("", name.strip())
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
    throughput = modelled_quantity(row.get("quantity")) == "throughput"
    num_gpus = gpu_count_of(row)
    stack, strategy, offload, quantization = stack_and_layout(row, num_gpus, throughput)
    spec, method = model_and_method(row, quantization)
    gptq = gptq_settings(row) if quantization == "gptq-int4" else QUANT_JOB_FIELDS.get(quantization, {})
    deepspeed = stack.deepspeed_for(method, num_gpus) if method == "full" else None
    if method == "full" and not stack.full_finetune_modelled and deepspeed is None and not throughput:
        raise Skip(f"full fine-tune under stack {stack.name} not modelled ({stack.full_skip_reason})")
    if deepspeed is not None and not throughput:  # one rank of DeepSpeed ZeRO-2
        strategy = "zero2"
    check_lengths(row, throughput)
    compiled, liger = software_of(
        row.get("stack"), f"{row.get('stack_versions')} ; {row.get('notes')}", stack, throughput
    )
    defaults = framework_defaults(row.get("stack"), row.get("model"), method)
    defaulted: list[str] = []
    ckpt, reentrant = checkpointing_of(row, defaults, defaulted)
    attention = attention_for(row.get("attention"))
    if attention is None:
        raise Skip(f"attention {row.get('attention')!r} not known")
    dtype, fp8, fp8_params = precision_of(row.get("compute_dtype"), quantization, row.get("stack"))
    saved = modules_to_save(row.get("lora_targets")) if method != "full" else ()
    optimizer, optimizer_note = optimizer_for(
        row.get("optimizer"), adapters_only=method != "full" and not saved, offloaded=offload != "none"
    )
    if throughput and method == "full" and optimizer != "adamw":
        raise Skip(f"throughput with optimizer {row.get('optimizer')!r} (the counts price AdamW's step)")
    lora = lora_of(row, spec, defaults, defaulted) if method != "full" else LoraConfig()
    micro_batch = micro_batch_of(row, num_gpus, defaulted)
    implied_accum = grad_accum_of(row, num_gpus, micro_batch, defaulted)
    seq_len, note = within_positions(
        tokens_of(row, "seq_len"), spec, "; ".join(filter(None, (optimizer_note, *defaulted)))
    )
    try:
        job = FineTuneJob(
            model=spec.name,
            method=method,  # type: ignore[arg-type]
            lora=lora,
            compute_dtype=dtype,
            gradient_checkpointing=ckpt == "on",
            selective_recompute=ckpt == "selective",
            attention=attention,
            optimizer=optimizer,
            batch_size=micro_batch,
            grad_accum=count_of(row, "grad_accum") if row.get("grad_accum") else implied_accum or 1,
            seq_len=seq_len,
            modules_to_save=saved,
            fp8=fp8,
            fp8_params=fp8_params,
            torch_compile=compiled,
            liger_kernel=liger,
            **gptq,
        )
    except TunecostError as exc:
        raise Skip(str(exc)) from None
    gpu = row_gpu(row, throughput)
    layout_noted: list[str] = []
    mp = model_parallel_row(row, spec, job, num_gpus, stack=stack, noted=layout_noted) if num_gpus > 1 else None
    ep = row_expert_parallel(row, spec, mp, num_gpus, strategy=strategy, throughput=throughput, noted=layout_noted)
    behaviour = row_behaviour(row, stack, num_gpus=num_gpus, strategy=strategy, family=spec.family, method=method)
    lengths = max_lengths(row, job.batch_size, seq_len) if throughput else None
    return MappedRow(
        job=job,
        stack=stack,
        gpu_memory_bytes=None if gpu is None else gpu.usable_memory_bytes,
        gpu_name=None if gpu is None else gpu.name,
        num_gpus=num_gpus,
        strategy=strategy,
        offload=offload,
        deepspeed=deepspeed,
        behaviour=dataclasses.replace(behaviour, reentrant_checkpointing=reentrant),
        note="; ".join(filter(None, (note, *layout_noted, lengths.source if lengths else ""))),
        model_parallel=mp,
        expert_parallel=ep,
        lengths=lengths,
    )


def row_gpu(row: CorpusRow, throughput: bool) -> Any:
    """The row's catalog GPU (None: not in the catalog); `Skip` where the row's quantity needs it."""
    gpu = catalog_gpu(row.get("gpu"))
    if gpu is None and (row.get("quantity") == "oom" or throughput):
        why = "its peak rate and bandwidth set the step time" if throughput else "its memory decides out-of-memory"
        raise Skip(f"{gpu_unknown_reason(row.get('gpu'))} ({why})")
    return gpu


def modelled_quantity(quantity: str) -> str:
    """The kind of a quantity tunecost models ("throughput" or "memory"); `Skip` for one it does not."""
    if quantity == "time_to_train_s":
        raise Skip("time_to_train_s not modelled (the number of steps is not in the row)")
    if quantity in THROUGHPUT_QUANTITIES:
        return "throughput"
    if quantity not in MEMORY_QUANTITIES:
        raise Skip(f"unsupported quantity {quantity!r}")
    return "memory"


def row_behaviour(
    row: CorpusRow, stack: Stack, *, num_gpus: int, strategy: str | None, family: str, method: str
) -> StackBehaviour:
    """The library behaviours of a row's stack, with the AdamW its optimizer cell names."""
    behaviour = behaviour_for(
        stack,
        model_id=row.get("model"),
        stack_versions=row.get("stack_versions"),
        stack_cell=row.get("stack"),
        num_gpus=num_gpus,
        strategy=strategy,
        family=family,
        method=method,
    )
    return dataclasses.replace(behaviour, adamw_impl=adamw_impl_for(row.get("optimizer"), behaviour.adamw_impl))


def stack_and_layout(row: CorpusRow, num_gpus: int, throughput: bool) -> tuple[Stack, str | None, str, str]:
    """(stack, strategy, offload, quantization) of a row; `Skip` for a stack or quantization not modelled."""
    strategy, offload = multi_gpu_layout(row) if num_gpus != 1 else (None, "none")
    quantization = (row.get("quantization") or "none").strip().lower()
    quantization = "none" if quantization in _NOT_QUANTIZED else quantization
    quantization = "fp8" if re.search(r"fp8|float8|e4m3", quantization) else quantization  # "FP8 params", "te-fp8"
    if quantization not in ("none", "fp8", *QUANTIZED):
        raise Skip(f"{quantization} quantization not modelled")
    stack = stack_for(row.get("stack"), quantization, framework_of(row))
    if stack is None:
        raise Skip(f"unknown stack {row.get('stack')!r}")
    if stack.simulator_stack is None and not throughput:
        raise Skip(stack.skip_reason or f"stack {stack.name} not modelled")
    if strategy == "fsdp1" and "fsdp1" not in row.get("parallelism").lower():
        strategy = stack.fsdp  # "FSDP" without a version: the stack's own
    return stack, strategy, offload, quantization


def model_and_method(row: CorpusRow, quantization: str) -> tuple[Any, str]:
    """(catalog model, method) of a row; `Skip` for a model or method not modelled."""

    try:
        spec = resolve_model(row.get("model"))
    except TunecostError as exc:
        raise Skip(str(exc)) from None
    if spec.family not in SUPPORTED_FAMILIES:
        raise Skip(f"architecture {spec.family!r} not simulated")
    method = method_for(row.get("method"))
    if method == "full" != row.get("method").lower() and (row.get("lora_rank") or row.get("lora_targets")):
        raise Skip(f"method {row.get('method')!r} with LoRA cells: full fine-tune or LoRA?")
    if method not in ("full", "lora", "qlora"):
        raise Skip(f"unknown method {method!r}")
    if method == "lora" and quantization in QUANTIZED:
        method = "qlora"  # LoRA on quantized weights
    if (method == "qlora") != (quantization in QUANTIZED):
        raise Skip(f"method {method} with quantization {quantization} not modelled")
    return spec, method


def checkpointing_of(row: CorpusRow, defaults: Any, defaulted: list[str]) -> tuple[str, bool | None]:
    """("on" | "off" | "selective", re-entrant) of the row, else of its framework's defaults (noted in
    `defaulted`)."""
    stated = grad_ckpt_for(row.get("grad_ckpt"))
    if stated is None and row.get("grad_ckpt").lower() not in ("", "unknown", "n/a", "?"):
        raise Skip(f"grad_ckpt {row.get('grad_ckpt')!r} not understood (on, off, selective)")
    if stated is None and defaults is not None and "gradient_checkpointing" in defaults.options:
        on = defaults.options["gradient_checkpointing"]
        off = "selective" if defaults.options.get("selective_recompute") else "off"
        stated = ("on" if on else off, defaults.options.get("reentrant") if on else None)
        defaulted.append(f"gradient checkpointing {stated[0]}: {defaults.framework}")
    if stated is None:
        raise Skip("gradient checkpointing not stated")
    return stated


def lora_of(row: CorpusRow, spec: Any, defaults: Any, defaulted: list[str]) -> LoraConfig:
    """The row's LoRA rank, alpha and targets, else its framework's defaults (noted in `defaulted`), and the
    framework's LoRA dropout."""
    rank = count_of(row, "lora_rank") if row.get("lora_rank") else None
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
        dropout = 0.0
        if defaults is not None and defaults.options.get("lora_dropout"):
            dropout = float(defaults.options["lora_dropout"])
            defaulted.append(f"LoRA dropout {dropout:g}: {defaults.framework}")
        targets = targets or lora_targets(row.get("lora_targets"), is_moe=spec.is_moe)
        return LoraConfig(rank=rank, alpha=alpha, targets=targets, dropout=dropout)
    except (ValueError, TunecostError) as exc:
        raise Skip(f"LoRA settings not usable: {exc}") from None


def within_positions(seq_len: int, spec: Any, note: str) -> tuple[int, str]:
    """`seq_len` cut to the model's learned positions, with a note saying so."""
    if spec.max_positions is None or seq_len <= spec.max_positions:
        return seq_len, note
    positions = (
        f"seq_len {seq_len} is beyond the model's {spec.max_positions} learned positions, which no run can "
        f"exceed: modelled at {spec.max_positions} (the stack cut the sequences)"
    )
    return spec.max_positions, "; ".join(filter(None, (note, positions)))


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
