"""The GPU counts and layouts a multi-GPU search evaluates."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from tunecost.catalog.gpus import GPU
from tunecost.distributed import expert_parallel
from tunecost.distributed.pipeline import uneven_split_note
from tunecost.errors import TunecostError
from tunecost.limits import MAX_SEARCH_GPUS
from tunecost.models.catalog import resolve_model
from tunecost.models.families import HYBRID_FAMILIES
from tunecost.workload.frameworks.registry import runnable_layouts
from tunecost.workload.job import FineTuneJob
from tunecost.workload.parallel import (
    NOT_WITH_PIPELINE,
    ModelParallel,
    ParallelPlan,
    effective_layers_per_stage,
)

if TYPE_CHECKING:
    from tunecost.models.catalog import ModelSpec


def valid_gpu_counts(gpus_per_node: int, max_gpus: int, expert_parallel: int = 1) -> list[int]:
    """1 .. GPUs per node, then whole nodes, up to `max_gpus`; only multiples of the expert-parallel degree."""
    return [
        n for n in range(expert_parallel, max_gpus + 1, expert_parallel) if n <= gpus_per_node or n % gpus_per_node == 0
    ]


TP_SEARCH_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "nemotron", "mixtral")  # `--gpus auto` tries TP on these
SEARCH_DEGREES = (1, 2, 4, 8)  # the TP and PP degrees `--gpus auto` tries
CP_SEARCH_DEGREES = (2, 4, 8, 16, 32)  # and the CP ones: across nodes, as 128k-token runs shard the sequence
CP_SEARCH_MIN_SEQ_LEN = 16384  # `--gpus auto` adds context-parallel layouts from this many tokens per sequence


def model_parallel_choices(
    spec: ModelSpec,
    job: FineTuneJob,
    *,
    given: ModelParallel | None,
    searching: bool,
    gpus_per_node: int,
    lora: bool = False,
    framework: str | None = None,
) -> list[ModelParallel]:
    """The model-parallel layouts to evaluate: the one given; or, searching GPU counts for a full fine-tune (a LoRA
    one with `lora`: asked when no data-parallel layout fits it; QLoRA's 4-bit weights are not sharded) of a model
    of a TP-capable family, TP (with sequence parallelism) within a node x PP over `SEARCH_DEGREES` (TP dividing
    the heads, PP dealing the layers as torchtitan does; no TP with modules saved beside LoRA or under Liger), and
    for sequences of `CP_SEARCH_MIN_SEQ_LEN` tokens or more CP over `CP_SEARCH_DEGREES` beside the widest TP (no
    PP); else none (data parallelism only). Of those, the ones whose dimensions the config's `framework` runs
    (`registry.runnable_layouts`)."""
    if given is not None:
        return [given]
    seq_len = job.worst_case_seq_len
    sharded = job.method == "full" or (lora and job.method == "lora")
    if not searching or not sharded or spec.family not in TP_SEARCH_FAMILIES or job.fp32_params:
        return [ModelParallel()]  # fp32 parameters: one GPU, DDP or FSDP
    intermediate = int(spec.config.get("intermediate_size") or 0)
    tps = [
        t
        for t in SEARCH_DEGREES
        if t <= gpus_per_node and not (spec.num_heads % t or spec.num_kv_heads % t or intermediate % t)
    ]
    # the TP plan does not shard PEFT's saved copies, and Liger's kernels take no DTensors (`check_model_parallel`)
    tps = tps[:1] if job.modules_to_save or job.liger_kernel else tps
    pps = [p for p in SEARCH_DEGREES if p == 1 or effective_layers_per_stage(spec.num_layers, p)]  # torchtitan's split
    choices = [ModelParallel(tp=t, pp=p, sequence_parallel=t > 1) for t in tps for p in pps]
    if seq_len >= CP_SEARCH_MIN_SEQ_LEN:
        t = max(tps)
        cps = [c for c in CP_SEARCH_DEGREES if not seq_len % (c * t)]
        choices += [ModelParallel(tp=t, cp=c, sequence_parallel=t > 1) for c in cps]
    return runnable_layouts(choices, framework)


def layout_plans(
    n: int,
    strategies: Sequence[str],
    *,
    gpus_per_node: int,
    expert_degree: int,
    offload: str,
    model_parallel: Sequence[ModelParallel] = (ModelParallel(),),
) -> list[ParallelPlan]:
    """The layouts of `n` GPUs: one GPU without offload or expert parallelism is just that ("single"), whatever
    the strategies asked; each model-parallel layout that divides `n` with each strategy over the ranks left
    (one plan where a single data-parallel rank leaves the strategies nothing to tell apart)."""
    return list(_layout_plans(n, tuple(strategies), gpus_per_node, expert_degree, offload, tuple(model_parallel)))


@functools.lru_cache(maxsize=4096)  # a plan asks for the same layouts once per GPU type and method
def _layout_plans(
    n: int,
    strategies: tuple[str, ...],
    gpus_per_node: int,
    expert_degree: int,
    offload: str,
    model_parallel: tuple[ModelParallel, ...],
) -> tuple[ParallelPlan, ...]:
    if n == 1 and offload == "none" and expert_degree == 1:
        return (ParallelPlan(),)
    out: list[ParallelPlan] = []
    for mp in model_parallel:
        if n % (mp.degree * expert_degree):
            continue
        alone = n == mp.degree and mp.cp == 1 and offload == "none"  # one rank holds each weight shard
        degrees = dataclasses.asdict(mp)
        for s in strategies if not alone else [s for s in strategies if s.startswith("zero")] + ["ddp"]:
            if mp.pp > 1 and s in NOT_WITH_PIPELINE:
                continue
            out.append(
                ParallelPlan(
                    num_gpus=n,
                    gpus_per_node=gpus_per_node,
                    strategy=s,
                    expert_parallel=expert_degree,
                    offload=offload,
                    **degrees,
                )
            )
    return tuple(out)


def gpu_counts(
    gpu: str, num_gpus: int | Mapping[str, int] | None, gpus_per_node: int, max_gpus: int, expert_degree: int
) -> list[int]:
    """The GPU counts evaluated for `gpu`: its own count, the one count, or every valid count up to `max_gpus`."""
    if isinstance(num_gpus, Mapping):
        return [num_gpus[gpu]]
    if num_gpus is not None:
        return [num_gpus]
    return valid_gpu_counts(gpus_per_node, max_gpus, expert_degree)


def checked_counts(
    model: str,
    gpus: Sequence[GPU],
    strategies: Sequence[str],
    num_gpus: int | Mapping[str, int] | None,
    gpus_per_node: int,
    max_gpus: int,
    expert_degree: int,
    offload: str,
    model_parallel_degree: int = 1,
) -> tuple[dict[str, list[int]], ModelSpec]:
    """The GPU counts to evaluate per GPU (searching: multiples of the expert- and model-parallel degrees), and
    the job's model, once the search's limits are checked."""
    if not 1 <= max_gpus <= MAX_SEARCH_GPUS:
        raise TunecostError(f"the GPU limit must be between 1 and {MAX_SEARCH_GPUS}, got {max_gpus}")
    step = expert_degree * model_parallel_degree
    counts_by_gpu = {g.name: gpu_counts(g.name, num_gpus, gpus_per_node, max_gpus, step) for g in gpus}
    if not any(counts_by_gpu.values()):
        what = "expert-parallel degree" if model_parallel_degree == 1 else "expert- x model-parallel degrees"
        raise TunecostError(f"no GPU count up to {max_gpus} is a multiple of the {what} {step}")
    spec = resolve_model(model)
    most = max(max(c) for c in counts_by_gpu.values() if c)
    for s in strategies:
        if most % model_parallel_degree:  # a given count the degrees do not divide: `check_model_parallel` says so
            break
        if s == "single" and most == model_parallel_degree:  # every GPU in the model-parallel group: no data parallel
            continue
        plan = ParallelPlan(
            num_gpus=most, gpus_per_node=gpus_per_node, strategy=s, expert_parallel=expert_degree, offload=offload
        )
        expert_parallel.check_expert_parallel(plan, num_experts=spec.num_experts, model=spec.name)
    return counts_by_gpu, spec


def check_model_parallel(
    spec: ModelSpec, seq_len: int, mp: ModelParallel | None, counts: Mapping[str, list[int]], *, liger: bool = False
) -> list[str]:
    """One-line errors for TP/PP/CP degrees that do not divide the GPUs asked for, the model's heads or the
    sequence, for more pipeline stages than the layers fill, and for TP under Liger's kernels (`liger`); the
    notes the layout is priced with (layers the stages do not divide); none for data parallelism (None)."""
    if mp is None:
        return []
    if mp.tp > 1 and liger:
        raise TunecostError(
            f"--tp {mp.tp} with Liger's kernels is not modelled (they take local tensors, not the tensor-parallel "
            "plan's DTensors): use --pp or --cp, or drop --liger-kernel"
        )
    for gpu, ns in counts.items():
        for n in ns:
            if n % mp.degree:
                raise TunecostError(
                    f"--tp {mp.tp} x --pp {mp.pp} x --cp {mp.cp} = {mp.degree} does not divide the {n} GPUs ({gpu})"
                )
    if mp.degree > 1 and spec.family == "blackmamba":
        raise TunecostError(f"{spec.name}: tensor, pipeline and context parallelism are modelled for transformers only")
    if mp.cp > 1 and spec.family in HYBRID_FAMILIES:
        raise TunecostError(
            f"{spec.name}: context parallelism is modelled for attention layers (keys and values exchanged in a "
            f"ring); its {spec.family} linear-time layers would pass their recurrent state between sequence shards"
        )
    plan = ParallelPlan(num_gpus=mp.degree, strategy="ddp" if mp.degree > 1 else "single", **dataclasses.asdict(mp))
    plan.check_model(
        num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads,
        num_layers=spec.num_layers,
        seq_len=seq_len,
        even_layers=False,  # dealt as torchtitan deals them (`pipeline.uneven_split_note`)
    )
    note = uneven_split_note(spec.num_layers, mp)
    return [note] if note else []
