"""One corpus row -> the `FineTuneJob` tunecost simulates, the stack, and the GPU memory; or why it cannot.

Reading rules (each is stated, none is tuned to the data):
- `seq_len_kind` fixed, packed (every sequence filled to seq_len) and max (padded or cut to seq_len; the worst
  batch holds a sequence of that length) all give a batch of `seq_len` tokens per sequence;
- LoRA target names map to tunecost's targets: q/k/v/o projections and Qwen's fused `c_attn` -> attention;
  gate/up/down and Qwen's `w1`/`w2` -> mlp; Qwen's `c_proj` names both the attention output and the MLP output
  -> attention and mlp. A subset of the attention projections is modelled as all four (a small over-count);
  SantaCoder's rows name q/k/v/o_proj and c_attn, of which GPTBigCode has only the fused c_attn: attention LoRA
  there wraps c_attn and the attention's c_proj (the same kind of over-count);
- an empty optimizer is transformers' default AdamW; an unknown attention is FlashAttention-2;
- bnb-nf4 is QLoRA with nf4 and double quantization (the QLoRA recipe);
- a memory row on several GPUs under FSDP (`parallelism` "fsdp" or "fsdp (FULL_SHARD)") is one rank of the
  fsdp2 full-shard layout (`distributed.rank_memory`), all GPUs in one node; other layouts and multi-GPU
  throughput rows are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunecost.errors import TunecostError
from tunecost.limits import MAX_TOKENS
from tunecost.validate.corpus import CorpusRow
from tunecost.validate.stacks import Stack, stack_for
from tunecost.workload.job import FineTuneJob, LoraConfig

PEAK_MEMORY_QUANTITIES = ("peak_allocated_gib", "peak_reserved_gib", "nvidia_smi_gib")
MEMORY_QUANTITIES = (*PEAK_MEMORY_QUANTITIES, "oom")
THROUGHPUT_QUANTITIES = ("tokens_per_s_per_gpu", "samples_per_s", "s_per_step", "time_to_train_s")
_ATTENTION_TARGETS = {"q_proj", "k_proj", "v_proj", "o_proj", "c_attn", "output_proj", "qkv_proj", "wqkv", "wo"}
_MLP_TARGETS = {"gate_proj", "up_proj", "down_proj", "w1", "w2", "w3", "gate_up_proj", "fc1", "fc2"}
_BOTH_TARGETS = {"c_proj"}
_FSDP_FULL_SHARD = ("fsdp", "fsdp (full_shard)")
_ATTENTION = {"flash2": "flash", "flash": "flash", "sdpa": "sdpa", "eager": "eager", "": "flash", "unknown": "flash"}
# Corpus GPU spellings -> the GPU catalog (only the memory is used, for out-of-memory rows).
_GPU_NAMES = {
    "a100-sxm4-80gb": "A100-80GB-SXM",
    "a100 (80gb)": "A100-80GB-SXM",
    "a100-80gb": "A100-80GB-SXM",
    "rtx-4090": "RTX4090-24GB",
}


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
    strategy: str | None = None  # a `distributed.plan.STRATEGIES` name when num_gpus > 1


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


def lora_targets(cell: str) -> tuple[str, ...]:
    names = [t.strip() for t in cell.split(";") if t.strip()]
    if not names:
        raise Skip("LoRA targets not stated")
    out: set[str] = set()
    for name in names:
        if "trained fully" in name or name in ("wte", "lm_head", "embed_tokens"):
            raise Skip(f"fully trained {name.split()[0]} beside LoRA not modelled")
        if name in _ATTENTION_TARGETS:
            out.add("attention")
        elif name in _MLP_TARGETS:
            out.add("mlp")
        elif name in _BOTH_TARGETS:
            out |= {"attention", "mlp"}
        else:
            raise Skip(f"LoRA target {name!r} not known")
    return tuple(sorted(out))


def catalog_gpu(name: str):
    """The GPU catalog entry of a corpus GPU spelling (None: not in the catalog)."""
    from tunecost.catalog.gpus import resolve_gpu_name

    key = name.strip()
    if not key:
        return None
    try:
        return resolve_gpu_name(_GPU_NAMES.get(key.lower(), key)).gpu
    except TunecostError:
        return None


def gpu_memory_bytes(name: str) -> int | None:
    gpu = catalog_gpu(name)
    return None if gpu is None else gpu.memory_bytes


def map_row(row: CorpusRow) -> MappedRow:
    """The job of one single-GPU row; raises `Skip` with the reason for anything tunecost does not model."""
    from tunecost.catalog.models import resolve_model
    from tunecost.models.anatomy import SUPPORTED_FAMILIES

    quantity = row.get("quantity")
    throughput = quantity in THROUGHPUT_QUANTITIES
    if quantity == "time_to_train_s":
        raise Skip("time_to_train_s not modelled (the number of steps is not in the row)")
    if not throughput and quantity not in MEMORY_QUANTITIES:
        raise Skip(f"unsupported quantity {quantity!r}")
    num_gpus = _int(row, "num_gpus")
    strategy = multi_gpu_strategy(row, throughput) if num_gpus != 1 else None
    quantization = row.get("quantization") or "none"
    if quantization not in ("none", "bnb-nf4"):
        raise Skip(f"{quantization} quantization not modelled")
    stack = stack_for(row.get("stack"), quantization)
    if stack is None:
        raise Skip(f"unknown stack {row.get('stack')!r}")
    if stack.simulator_stack is None and not throughput:
        raise Skip(stack.skip_reason or f"stack {stack.name} not modelled")
    try:
        spec = resolve_model(row.get("model"))
    except TunecostError:
        raise Skip(f"unknown model {row.get('model')!r} (not in the catalog)") from None
    if spec.family not in SUPPORTED_FAMILIES:
        raise Skip(f"architecture {spec.family!r} not simulated")
    method = row.get("method")
    if method not in ("full", "lora", "qlora"):
        raise Skip(f"unknown method {method!r}")
    if (method == "qlora") != (quantization == "bnb-nf4"):
        raise Skip(f"method {method} with quantization {quantization} not modelled")
    if method == "full" and not stack.full_finetune_modelled and not throughput:
        raise Skip(f"full fine-tune under stack {stack.name} not modelled ({stack.full_skip_reason})")
    kind = row.get("seq_len_kind") or "fixed"
    if kind not in ("fixed", "packed", "max"):
        raise Skip(f"sequence lengths {kind!r} (a dataset's lengths are not in the row)")
    if throughput and kind == "max":
        raise Skip(
            "throughput with sequences up to seq_len (the dataset's lengths, which set the work, are not in the row)"
        )
    ckpt = row.get("grad_ckpt")
    if ckpt not in ("on", "off"):
        raise Skip("gradient checkpointing not stated")
    attention = _ATTENTION.get(row.get("attention"))
    if attention is None:
        raise Skip(f"attention {row.get('attention')!r} not known")
    dtype = row.get("compute_dtype") or "bf16"
    lora = LoraConfig()
    if method != "full":
        rank = _int(row, "lora_rank") if row.get("lora_rank") else None
        if rank is None:
            raise Skip("LoRA rank not stated")
        try:
            alpha = float(row.get("lora_alpha") or 2 * rank)
            lora = LoraConfig(rank=rank, alpha=alpha, targets=lora_targets(row.get("lora_targets")))
        except (ValueError, TunecostError) as exc:
            raise Skip(f"LoRA settings not usable: {exc}") from None
    try:
        job = FineTuneJob(
            model=spec.name,
            method=method,  # type: ignore[arg-type]
            lora=lora,
            compute_dtype=dtype,
            gradient_checkpointing=ckpt == "on",
            attention=attention,
            optimizer="adamw",
            batch_size=_int(row, "batch_size_per_gpu"),
            seq_len=_int(row, "seq_len"),
        )
    except TunecostError as exc:
        raise Skip(str(exc)) from None
    gpu = catalog_gpu(row.get("gpu"))
    if quantity == "oom" and gpu is None:
        raise Skip(f"GPU {row.get('gpu')!r} not in the GPU catalog (its memory decides out-of-memory)")
    if throughput and gpu is None:
        raise Skip(f"GPU {row.get('gpu')!r} not in the GPU catalog (its peak rate and bandwidth set the step time)")
    grad_accum = _int(row, "grad_accum") if row.get("grad_accum") else 1
    return MappedRow(
        job=job,
        stack=stack,
        gpu_memory_bytes=None if gpu is None else gpu.memory_bytes,
        gpu_name=None if gpu is None else gpu.name,
        grad_accum=grad_accum,
        num_gpus=num_gpus,
        strategy=strategy,
    )


def multi_gpu_strategy(row: CorpusRow, throughput: bool) -> str:
    """The strategy of a multi-GPU memory row (FSDP full shard: fsdp2); `Skip` for anything else."""
    parallelism = (row.get("parallelism") or "").strip().lower()
    if throughput:
        raise Skip("multi-GPU throughput not modelled (communication time is not validated)")
    if parallelism not in _FSDP_FULL_SHARD:
        raise Skip(f"multi-GPU parallelism {parallelism or 'unstated'!r} not modelled (FSDP full shard only)")
    return "fsdp2"
