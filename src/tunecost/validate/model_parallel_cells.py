"""A corpus row's parallelism cell: its data-parallel layout ("zero3 + cpu offload", "fsdp (FULL_SHARD)") and its
tensor, pipeline and context parallelism ("TP=8, PP=4", "tensor parallel 8 + sequence parallel", "tp4 pp2 cp2 vp5
distributed optimizer", "tp4 sp tp comm overlap")."""

from __future__ import annotations

import dataclasses
import re

from tunecost.distributed.expert_parallel import EP_STRATEGIES
from tunecost.distributed.pipeline import uneven_split_note
from tunecost.errors import TunecostError
from tunecost.validate.cells import Skip, count_of, gpu_count_of
from tunecost.validate.corpus import CorpusRow
from tunecost.validate.stacks import Stack
from tunecost.workload.job import FineTuneJob
from tunecost.workload.parallel import ModelParallel, ParallelPlan

NODE_GPUS = 8  # GPUs per node assumed for a row on more GPUs than one node holds (HGX / DGX servers)
_PAR = r"(?:[ _-]?(?:model[ _-]?)?parallel(?:ism|[ _]size|[ _]degree)?)"
_DEGREES = {  # after a digit or an "x" too: "tp8pp2", "TP4xPP1xCP2"; "VP-5", "TPx4"
    "tp": re.compile(rf"(?<![a-wyz])(?:tp|tensor{_PAR})\s*[=:x-]?\s*(\d+)"),
    "pp": re.compile(rf"(?<![a-wyz])(?<!virtual[ _-])(?:pp|pipeline{_PAR})\s*[=:x-]?\s*(\d+)"),
    "cp": re.compile(rf"(?<![a-wyz])(?:cp|context{_PAR})\s*[=:x-]?\s*(\d+)"),
    "vp": re.compile(rf"(?<![a-wyz])(?:vp|vpp|virtual[ _-]?pipeline{_PAR}?)\s*[=:x-]?\s*(\d+)"),
}
_EXPERT_TENSOR_DEGREE = re.compile(rf"(?<![a-z])(?:etp|expert[ _-]?tensor{_PAR})\s*[=:x-]?\s*(\d+)")
_EXPERT_DEGREE = re.compile(rf"(?<![a-wyz])(?:ep|expert{_PAR})\s*[=:x-]?\s*(\d+)")
_SEQUENCE_PARALLEL = re.compile(
    r"\bsp\b(?!\s*[=:]?\s*(?:0|false|off))|sequence[ _-]?parallel(?!\w*\s*[=:]?\s*(?:0|false|off))"
)
_SEQUENCE_PARALLEL_OFF = re.compile(
    r"(?:\bsp\b|sequence[ _-]?parallel\w*)\s*[=:]?\s*(?:0|false|off)\b|\bno[ _-]?(?:sp\b|sequence[ _-]?parallel)"
)
_TP_COMM_OVERLAP = re.compile(r"(?:tp|tensor[ _-]?parallel)[ _-]?comm(?:unication)?[ _-]?overlap|userbuffers|\bub\b")
_DISTRIBUTED_OPTIMIZER = re.compile(r"distributed[ _-]?optimi[sz]er|dist[ _-]?opt")


def _degrees(cell: str) -> tuple[int, ...]:
    """(tp, pp, cp, vp) a lower-cased cell states, 1 where it states none."""
    found = {k: int(m.group(1)) for k, p in _DEGREES.items() if (m := p.search(cell))}
    return tuple(max(1, found.get(k, 1)) for k in ("tp", "pp", "cp", "vp"))


def grad_accum_of(row: CorpusRow, num_gpus: int, micro_batch: int, noted: list[str]) -> int | None:
    """The micro-batches per step and data-parallel rank a row's `global_batch` implies where its `grad_accum` is
    blank: global batch / (micro-batch x data-parallel ranks, its GPUs over TP x PP x CP), said in `noted`; None
    without either; `Skip` where they do not divide, or where all three are stated and disagree."""
    if not row.get("global_batch"):
        return None
    tp, pp, cp, _ = _degrees((row.get("parallelism") or "").lower())
    ranks = num_gpus // (tp * pp * cp)
    global_batch = count_of(row, "global_batch")
    if row.get("grad_accum"):
        accum = count_of(row, "grad_accum")
        if global_batch != micro_batch * accum * ranks:
            raise Skip(
                f"global_batch {global_batch} is not batch_size_per_gpu {micro_batch} x grad_accum {accum} x "
                f"{ranks} data-parallel ranks ({num_gpus} GPUs / TP {tp} x PP {pp} x CP {cp}): which is the run's?"
            )
        return None
    if ranks < 1 or global_batch % (micro_batch * ranks):
        raise Skip(
            f"global_batch {global_batch} is not a multiple of batch_size_per_gpu {micro_batch} x {max(ranks, 0)} "
            f"data-parallel ranks ({num_gpus} GPUs / TP {tp} x PP {pp} x CP {cp})"
        )
    accum = global_batch // (micro_batch * ranks)
    noted.append(f"grad_accum {accum}: global_batch {global_batch} / ({micro_batch} x {ranks} data-parallel ranks)")
    return accum


def micro_batch_of(row: CorpusRow, num_gpus: int, noted: list[str]) -> int:
    """The row's batch_size_per_gpu, else global batch / (grad_accum x data-parallel ranks), said in `noted`;
    `Skip` where neither is stated or they do not divide."""
    if row.get("batch_size_per_gpu") or not (row.get("global_batch") and row.get("grad_accum")):
        return count_of(row, "batch_size_per_gpu")
    tp, pp, cp, _ = _degrees((row.get("parallelism") or "").lower())
    ranks, accum, global_batch = num_gpus // (tp * pp * cp), count_of(row, "grad_accum"), count_of(row, "global_batch")
    if ranks < 1 or global_batch % (accum * ranks):
        raise Skip(f"global_batch {global_batch} is not a multiple of grad_accum {accum} x {max(ranks, 0)} ranks")
    noted.append(f"batch_size_per_gpu {global_batch // (accum * ranks)}: global_batch / ({accum} x {ranks} ranks)")
    return global_batch // (accum * ranks)


def row_expert_parallel(
    row: CorpusRow,
    spec,
    model_parallel: ModelParallel | None,
    num_gpus: int,
    *,
    strategy: str | None,
    throughput: bool,
    noted: list[str],
) -> int:
    """A row's expert-parallel degree where tunecost models it: the routed experts split over the data-parallel
    ranks that hold the same weights, under `EP_STRATEGIES`. Otherwise 1: a throughput row is priced without
    its all-to-all (said in `noted`), a memory row is skipped (each rank would hold every expert)."""
    num_experts = spec.num_experts if spec.is_moe else 1
    data_parallel = num_gpus // (model_parallel.degree if model_parallel is not None else 1)
    cell = (row.get("parallelism") or "").lower()
    etp, tp = _EXPERT_TENSOR_DEGREE.search(cell), model_parallel.tp if model_parallel is not None else 1
    if num_experts > 1 and etp is not None and int(etp.group(1)) != tp:
        split = f"expert tensor parallelism {etp.group(1)} beside TP {tp} not modelled (the experts split as TP)"
        if not throughput:
            raise Skip(split)
        noted.append(split)
    found = _EXPERT_DEGREE.search(cell)
    ep = int(found.group(1)) if found is not None else 1
    if ep <= 1 or num_experts <= 1:
        return 1
    why = None
    if num_experts % ep:
        why = f"it does not divide the model's {num_experts} experts"
    elif data_parallel % ep:  # Megatron-Core may also spread experts over TP ranks (MoE parallel folding)
        why = f"it does not divide the {data_parallel} data-parallel ranks"
    elif strategy not in EP_STRATEGIES:
        why = f"not modelled with {strategy or 'one GPU'}"
    if why is None:
        return ep
    if not throughput:
        raise Skip(f"expert parallelism {ep}: {why}")
    noted.append(f"expert parallelism {ep} not modelled ({why}): priced without its all-to-all")
    return 1


def sequence_parallel_stated(cell: str) -> bool | None:
    """Sequence parallelism as a lower-cased cell states it: on, off ("no SP", "sp=false"), or None (unsaid)."""
    return False if _SEQUENCE_PARALLEL_OFF.search(cell) else True if _SEQUENCE_PARALLEL.search(cell) else None


def model_parallel_of(parallelism: str, *, micro_batches: int) -> ModelParallel | None:
    """The TP/PP/CP degrees the cell states (None: none above 1); `micro_batches`: the row's micro-batches per
    step and data-parallel rank (its gradient accumulation), which a pipeline runs as its micro-batches;
    sequence parallelism as the cell states it (off where it does not)."""
    cell = parallelism.lower()
    tp, pp, cp, vp = _degrees(cell)
    if tp * pp * cp == 1:
        return None
    stated = sequence_parallel_stated(cell)
    return ModelParallel(
        tp=tp,
        pp=pp,
        cp=cp,
        sequence_parallel=tp > 1 and bool(stated),
        tp_comm_overlap=tp > 1 and bool(_TP_COMM_OVERLAP.search(cell)),
        micro_batches=micro_batches if pp > 1 else None,
        pipeline_schedule="interleaved-1f1b" if vp > 1 else "1f1b",
        virtual_stages=vp,
    )


def states_model_parallel(parallelism: str) -> bool:
    """Whether the cell states a TP/PP/CP degree, even 1 ("TP1 PP1 CP1": Megatron's data parallelism alone)."""
    cell = parallelism.lower()
    return any(p.search(cell) for p in _DEGREES.values())


def names_distributed_optimizer(parallelism: str) -> bool:
    """Megatron's distributed optimizer (fp32 main weights and Adam states sharded over the data-parallel ranks:
    tunecost's zero1)."""
    return bool(_DISTRIBUTED_OPTIMIZER.search(parallelism.lower()))


def model_parallel_row(
    row: CorpusRow, spec, job: FineTuneJob, num_gpus: int, *, stack: Stack, noted: list[str]
) -> ModelParallel | None:
    """The row's TP/PP/CP degrees under its stack's TP, its gradient accumulation as the pipeline's micro-batches,
    sequence parallelism as the cell states it or as the stack turns it on with TP (said in `noted`); `Skip` for
    degrees that do not divide its GPUs, the model or the sequence."""
    cell = row.get("parallelism") or ""
    mp = model_parallel_of(cell, micro_batches=job.grad_accum)
    if mp is None:
        return None
    if mp.tp > 1 and (job.method == "qlora" or job.modules_to_save):
        raise Skip("tensor parallelism with QLoRA or fully trained modules beside LoRA not modelled")
    stages = mp.pp * mp.virtual_stages
    # stages that do not divide the layers ran with the embedding and the head counted (Megatron's account_for keys)
    first, last = (1, 1) if spec.num_layers % stages else stack.stage_weights
    mp = dataclasses.replace(mp, tp_impl=stack.tp_impl, first_stage_less_layers=first, last_stage_less_layers=last)
    unsaid = mp.tp > 1 and sequence_parallel_stated(cell.lower()) is None
    if stack.sp_with_tp and unsaid and not job.worst_case_seq_len % mp.tp:
        mp = dataclasses.replace(mp, sequence_parallel=True)
        noted.append(f"sequence parallelism on with TP {mp.tp}: {stack.sp_with_tp}")
    try:
        plan = ParallelPlan(num_gpus=num_gpus, strategy="ddp", **dataclasses.asdict(mp))
        plan.check_model(
            num_heads=spec.num_heads,
            num_kv_heads=spec.num_kv_heads,
            num_layers=spec.num_layers,
            seq_len=job.worst_case_seq_len,
            even_layers=False,
        )
    except TunecostError as exc:
        raise Skip(f"parallelism {row.get('parallelism')!r}: {exc}") from None
    noted += [n for n in [uneven_split_note(spec.num_layers, mp)] if n]
    return mp


# "zero3", "ZeRO-3", "zero stage 3", "zero_stage=3", "zero_optimization.stage=3", '"zero_optimization": {"stage":
# 3}', "ds_z3", "DeepSpeed Z3", "Z3", "stage3" (a DeepSpeed stage where no pipeline is named)
_ZERO_STAGE = re.compile(
    r"(?:zero(?:[\s_-]*optimization)?|(?<![a-z])ds[\s_-]*z|(?<![a-z0-9])z|(?<![a-z])stage)[^0-9a-z]*(?:stage[^0-9a-z]*)?"
    r"([123])(?!\d)"
)
# "no offload", "offload: none", "without CPU offload", "offload=false"
_NO_OFFLOAD = re.compile(r"\b(?:no|without)[\s_-]+(?:cpu[\s_-]+)?offload|offload\w*\W*(?:none|false|off|no)\b")


def multi_gpu_layout(row: CorpusRow) -> tuple[str, str]:
    """(strategy, offload) of a multi-GPU row, read from its `parallelism` cell (case-insensitive):
    - DeepSpeed ZeRO: "zero1/2/3", "zero-2", "zero stage 3" -> zeroN; with "offload": "params" where the cell
      names parameters, "optimizer" where it names the optimizer only, else ZeRO-3's common offload configuration
      (parameters and optimizer: "params") and ZeRO-1/2's only one ("optimizer"); DDP ("data parallel") -> ddp;
    - FSDP: FULL_SHARD (a bare "fsdp" included) -> fsdp1, the torch FullyShardedDataParallel that accelerate's FSDP
      plugin runs (the corpus's FSDP rows), or fsdp2 where the cell says "fsdp2" or "fully_shard";
      SHARD_GRAD_OP -> fsdp2-shard-grad-op; with "offload": FSDP's CPU offload (parameter and gradient shards and
      the optimizer step on the host: "params");
    - a Megatron layout ("TP=4 PP=2", "TP1 PP1 CP1"): its data parallelism, zero1 under the distributed optimizer
      or a NeMo/Megatron stack, else ddp; `Skip` for anything else (hybrid sharding, DeepSpeed without a stage) and
      for a GPU count that fills no whole nodes of `NODE_GPUS`."""
    parallelism = (row.get("parallelism") or "").strip().lower()
    num_gpus = gpu_count_of(row)
    if num_gpus > NODE_GPUS and num_gpus % NODE_GPUS:
        raise Skip(f"{num_gpus} GPUs fill no whole nodes of {NODE_GPUS} GPUs (the node layout is not in the row)")
    offload = "offload" in parallelism and not _NO_OFFLOAD.search(parallelism)
    unknown = f"multi-GPU parallelism {parallelism or 'unstated'!r} not modelled (DDP, DeepSpeed ZeRO 1-3, FSDP)"
    megatron_layout = states_model_parallel(parallelism)
    if not megatron_layout and any(
        word in parallelism for word in ("tensor", "pipeline", "hybrid", "no_shard", "megatron")
    ):
        raise Skip(unknown)
    stage = None if "pipeline" in parallelism else _ZERO_STAGE.search(parallelism)
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
    if megatron_layout:  # Megatron's data parallelism: its distributed optimizer shards what ZeRO-1 does, else DDP
        megatron = names_distributed_optimizer(parallelism) or any(
            name in (row.get("stack") or "").lower() for name in ("nemo", "megatron")
        )
        return "zero1" if megatron else "ddp", "none"
    raise Skip(unknown)
