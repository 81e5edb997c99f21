"""Memory per rank of a data-parallel fine-tune, derived from the single-GPU simulated step.

Sources and derivations: docs/multi-gpu.md, section `tunecost.distributed.rank_memory`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from tunecost.distributed import expert_parallel, fsdp1
from tunecost.distributed.single_step import SingleGpuStep as SingleGpuStep  # re-exported
from tunecost.distributed.single_step import single_gpu_step as single_gpu_step  # re-exported
from tunecost.models.catalog import resolve_model
from tunecost.simulate.depth import lerp_byte_map, lerp_bytes
from tunecost.simulate.overhead import DEFAULT_OVERHEAD, DeviceOverhead
from tunecost.simulate.step_types import WEIGHT_CATEGORIES
from tunecost.units import BYTES_PER_GIB
from tunecost.workload import offload
from tunecost.workload.job import BYTES_PER_DTYPE, FSDP_FP32_STRATEGIES, FineTuneJob
from tunecost.workload.parallel import STRATEGIES, ParallelPlan

ZERO_STRATEGIES = ("zero1", "zero2", "zero3")
PARAM_SHARDED = ("fsdp2", "fsdp1", "zero3", "hsdp")  # parameters gathered one unit at a time
STORED_SHARDED = (*PARAM_SHARDED, "fsdp2-shard-grad-op")  # parameters stored as shards between steps
ZERO_BUCKET_STRATEGIES = ("zero1", "zero2")  # DeepSpeed's stage_1_and_2.py: gradient buckets, flat step copies
ZERO_ADAM_BYTES_PER_PARAM = 12  # fp32 master weight + fp32 exp_avg + fp32 exp_avg_sq (ZeRO paper, K = 12)
# NCCL's own device memory (communicator buffers, NVLS/SHARP buffers) is outside PyTorch's allocator: assumed.
NCCL_COMMUNICATOR_BYTES = BYTES_PER_GIB // 2


@dataclass(frozen=True, kw_only=True)
class RankMemory:
    """One rank's memory under a strategy. Bytes as `torch.cuda.max_memory_allocated` counts them, plus the
    device overhead (CUDA context) and NCCL's communicator memory (both assumed); `peak_reserved_bytes` is
    what `torch.cuda.max_memory_reserved` would show (the caching allocator replayed, `rank_reserve`)."""

    strategy: str
    num_gpus: int
    shard_group: int  # ranks that share (shard) the sharded states; 1 for ddp
    peak_bytes: int
    peak_segment: str
    breakdown_bytes: dict[str, int]  # category -> bytes at the peak (single-GPU categories + buffers)
    device_overhead_bytes: int
    nccl_bytes: int
    peak_reserved_bytes: int  # at least peak_bytes
    host_bytes: int = 0  # CPU memory of the rank's offloaded states (DeepSpeed offload), not on the GPU
    assumptions: tuple[str, ...] = field(default=())

    @property
    def need_bytes(self) -> int:
        """What the rank needs to run: before it fails, the allocator frees its cached segments and retries."""
        return self.peak_bytes + self.device_overhead_bytes + self.nccl_bytes

    @property
    def nvidia_smi_bytes(self) -> int:
        """What nvidia-smi would show for the rank: the reserve plus the memory outside the allocator."""
        return self.peak_reserved_bytes + self.device_overhead_bytes + self.nccl_bytes


def partly_recomputed_rank(off: RankMemory, on: RankMemory, share: float, note: str) -> RankMemory:
    """A rank's memory with `share` of its layers recomputed, between the rank with none (`off`) and every one
    (`on`) recomputed, as `simulate.simulator.partly_recomputed` does for one GPU."""
    peak = lerp_bytes(off.peak_bytes, on.peak_bytes, share)
    return replace(
        off,
        peak_bytes=peak,
        breakdown_bytes=lerp_byte_map(off.breakdown_bytes, on.breakdown_bytes, share),
        peak_reserved_bytes=max(lerp_bytes(off.peak_reserved_bytes, on.peak_reserved_bytes, share), peak),
        assumptions=(*on.assumptions, note),
    )


def shard_group_size(plan: ParallelPlan) -> int:
    """Ranks that share one copy of the sharded states: all of them, or (hsdp) the ranks of one node."""
    if plan.strategy == "ddp":
        return 1
    if plan.strategy == "hsdp":
        return min(plan.num_gpus, plan.node_size)
    return plan.num_gpus


def _shard(nbytes: float, ranks: int) -> int:
    return math.ceil(nbytes / ranks)  # FSDP2 and ZeRO pad a flat shard up to a multiple of the ranks


def fp32_state_factor(step: SingleGpuStep, job: FineTuneJob, plan: ParallelPlan, category: str) -> float:
    """How much larger a weight or state of `category` is kept by FSDP over fp32 parameters than in `step`, traced in
    the compute dtype its gathered copies compute in: frozen weights and a full fine-tune's states 4 bytes over the
    compute dtype's (LoRA factors are fp32 either way); 1 for any other job."""
    if not job.fp32_params or plan.strategy not in FSDP_FP32_STRATEGIES:
        return 1.0
    if category == "frozen_weights":
        return BYTES_PER_DTYPE["fp32"] / job.compute_bytes_per_element
    return job.param_bytes_per_element / step.trainable_bytes_per_param


def zero_optimizer_state_bytes(step: SingleGpuStep, job: FineTuneJob, simulated_bytes: int) -> int:
    """ZeRO's optimizer states for the whole model: fp32 master + AdamW states for 16-bit trainable weights."""
    if job.optimizer != "adamw" or step.trainable_bytes_per_param == 4:
        return simulated_bytes
    return step.trainable_bytes // step.trainable_bytes_per_param * ZERO_ADAM_BYTES_PER_PARAM


def deepspeed_dtype_bytes(step: SingleGpuStep) -> int:
    """Bytes per element of DeepSpeed's engine dtype, its gradients' and buckets' dtype: the compute dtype (the
    engine casts the whole model to fp16 / bf16, LoRA factors included), or the trainable weights' if smaller."""
    return min(step.trainable_bytes_per_param, step.activation_bytes_per_element)


def reduce_bucket_bytes(step: SingleGpuStep, plan: ParallelPlan) -> int:
    """DeepSpeed ZeRO-1/2's gradient buckets, alive through each backward: reduce_bucket_size elements of the
    engine's dtype, twice with overlap_comm (0 for other strategies)."""
    if plan.strategy not in ZERO_BUCKET_STRATEGIES:
        return 0
    return plan.num_reduce_buckets * plan.reduce_bucket_elements * deepspeed_dtype_bytes(step)


def deepspeed_step_temporary_bytes(step: SingleGpuStep) -> int:
    """DeepSpeed ZeRO-1/2's optimizer-step temporaries for the whole model (the caller shards them): the flat copy
    of the gradients in the engine's dtype and its fp32 cast, per trainable parameter."""
    return step.trainable_bytes // step.trainable_bytes_per_param * (deepspeed_dtype_bytes(step) + 4)


def _buffers(step: SingleGpuStep, plan: ParallelPlan, phase: str) -> dict[str, int]:
    """Communication buffers and unsharded copies a rank holds at a segment of `phase`, beyond its states
    (a rank of an expert-parallel group holds 1/ep of every layer's routed experts)."""
    strategy, ep = plan.strategy, plan.expert_parallel
    in_pass = phase != "optimizer"
    layer = step.layer_bytes_per_rank(trainable=False, ep=ep)
    trainable = step.trainable_bytes_per_rank(ep)
    out: dict[str, int] = {}
    if strategy == "ddp":
        out["gradient_buckets"] = trainable
    if phase == "backward" and strategy in ZERO_BUCKET_STRATEGIES:
        out["reduce_bucket"] = reduce_bucket_bytes(step, plan)
    if in_pass and strategy in PARAM_SHARDED:
        # the root (kept unsharded between forward and backward) and the running layer, copied out of their
        # all-gather buffers; all-gather outputs in flight: two in forward, one in backward (FSDP2's prefetch)
        out["unsharded_params"] = step.root_weight_bytes + layer
        out["all_gather_buffers"] = (2 if phase == "forward" else 1) * layer
    if in_pass and strategy == "fsdp2-shard-grad-op":  # no all-gather in backward: parameters stay unsharded
        out["unsharded_params"] = step.root_weight_bytes + step.num_layers * layer
        out["all_gather_buffers"] = (2 if phase == "forward" else 0) * layer
    if phase == "backward" and strategy in STORED_SHARDED:
        layer_trainable = step.layer_bytes_per_rank(trainable=True, ep=ep)
        out["reduce_scatter_buffers"] = max(layer_trainable, step.root_trainable_bytes)
    if in_pass and ep > 1:
        out["all_to_all_buffers"] = expert_parallel.all_to_all_buffer_bytes(step.dispatch_bytes)
    return out


def rank_segment_bytes(
    categories: dict[str, int], segment: str, step: SingleGpuStep, job: FineTuneJob, plan: ParallelPlan
) -> dict[str, int]:
    """Bytes by category of one rank at one segment ("phase:region" or the phase; single-GPU bytes `categories`,
    scaled per strategy). The routed experts' share of a state is divided by the expert-parallel degree ep and
    sharded over the N / ep ranks that hold the same experts; the rest over the strategy's shard group."""
    phase = segment.split(":", 1)[0]
    sharded = STRATEGIES[plan.strategy]
    ranks, ep = shard_group_size(plan), plan.expert_parallel
    factor = {"P": ranks if plan.strategy in STORED_SHARDED else 1, "G": ranks if "G" in sharded else 1}
    factor["O"] = ranks if "O" in sharded else 1
    on_host: tuple[str, ...] = ("G", "O") if offload.offloads_states(plan.offload) else ()
    on_host += ("P",) if offload.offloads_params(plan.offload) else ()
    out: dict[str, int] = {}
    for category, nbytes in categories.items():
        if category in WEIGHT_CATEGORIES and category != "buffers":
            kind = "P"
        elif category == "optimizer_states":
            kind = "O"
            if plan.strategy in ZERO_STRATEGIES:
                nbytes = zero_optimizer_state_bytes(step, job, nbytes)
        elif category == "gradients":
            kind = "G"
        elif category == "temporaries" and phase == "optimizer":  # AdamW's foreach temporaries span its params
            kind = "O"
            if plan.strategy in ZERO_BUCKET_STRATEGIES:  # DeepSpeed's own step replaces torch AdamW's
                nbytes = deepspeed_step_temporary_bytes(step)
        else:
            out[category] = nbytes
            continue
        if kind in on_host:  # DeepSpeed CPU offload: this state lives in the host's memory
            continue
        nbytes = round(nbytes * fp32_state_factor(step, job, plan, category))
        if ep == 1:
            out[category] = _shard(nbytes, factor[kind])
            continue
        dense, experts = expert_parallel.split_expert_bytes(nbytes, step.expert_share(category), ep)
        out[category] = _shard(dense, factor[kind]) + _shard(experts, max(1, factor[kind] // ep))
    for name, nbytes in [
        *_buffers(step, plan, phase).items(),
        *_fp8_bytes(step, phase, None if "P" in on_host else factor["P"]).items(),
    ]:
        out[name] = out.get(name, 0) + nbytes
    out["held_layer_inputs"] = fsdp1.held_input_bytes(step, segment) if plan.strategy == "fsdp1" else 0
    return {k: v for k, v in out.items() if v}


def _fp8_bytes(step: SingleGpuStep, phase: str, weight_shards: int | None) -> dict[str, int]:
    """FP8's bytes at a segment of `phase` (`SingleGpuStep.fp8_bytes`): the weight copies throughout, the saved
    inputs and casts in the passes (added wherever the peak falls, as on one GPU); the stored weights' saving of
    FP8 primary weights sharded as the weights are (None: the weights live on the host)."""
    out: dict[str, int] = {}
    for category, nbytes in step.fp8_bytes.items():
        if category in WEIGHT_CATEGORIES and category != "buffers":
            if weight_shards is not None:
                out[category] = -_shard(-nbytes, weight_shards)
        elif category == "buffers" or phase != "optimizer":
            out[category] = nbytes
    return out


def rank_memory(
    step: SingleGpuStep, job: FineTuneJob, plan: ParallelPlan, *, overhead: DeviceOverhead = DEFAULT_OVERHEAD
) -> RankMemory:
    """The peak of one rank of `plan` running `job`, from the single-GPU step `step` of the same job."""
    from tunecost.distributed.rank_reserve import RESERVE_ASSUMPTION, rank_reserved_bytes

    best_key, best = "", dict[str, int]()
    for key, categories in step.segments.items():
        per_rank = rank_segment_bytes(categories, key, step, job, plan)
        if not best_key or sum(per_rank.values()) > sum(best.values()):
            best_key, best = key, per_rank
    peak = sum(best.values())
    return RankMemory(
        strategy=plan.strategy,
        num_gpus=plan.num_gpus,
        shard_group=shard_group_size(plan),
        peak_bytes=peak,
        peak_segment=best_key,
        breakdown_bytes=best,
        device_overhead_bytes=overhead.overhead_bytes(),
        nccl_bytes=NCCL_COMMUNICATOR_BYTES if plan.num_gpus > 1 else 0,
        peak_reserved_bytes=rank_reserved_bytes(step, job, plan, peak),
        host_bytes=offloaded_host_bytes(step, job, plan),
        assumptions=(*rank_assumptions(job, plan, overhead), RESERVE_ASSUMPTION),
    )


def offloaded_host_bytes(step: SingleGpuStep, job: FineTuneJob, plan: ParallelPlan) -> int:
    """CPU memory of one rank's offloaded partition (`offload.host_bytes`); 0 without offload."""
    simulated = max((c.get("optimizer_states", 0) for c in step.segments.values()), default=0)
    zero = plan.strategy in ZERO_STRATEGIES  # FSDP's offload keeps the optimizer's own states
    return offload.host_bytes(
        offload=plan.offload,
        optimizer_state_bytes=zero_optimizer_state_bytes(step, job, simulated) if zero else simulated,
        trainable_params=step.trainable_bytes // step.trainable_bytes_per_param,
        weight_bytes=step.weight_bytes,
        num_ranks=shard_group_size(plan),
    )


def rank_assumptions(job: FineTuneJob, plan: ParallelPlan, overhead: DeviceOverhead) -> tuple[str, ...]:
    out = [
        *resolve_model(job.model).not_modelled_notes,
        f"each rank runs the job's micro-batch ({job.batch_size} x {job.worst_case_seq_len} tokens) through the "
        "whole model; per-rank memory derived from the single-GPU simulated step (states scaled per strategy)",
        overhead.describe(),
    ]
    if plan.num_gpus > 1:
        out.append(f"NCCL communicator memory {NCCL_COMMUNICATOR_BYTES / BYTES_PER_GIB:.1f} GiB per rank (assumed)")
    if plan.strategy in ZERO_STRATEGIES:
        out.append(
            "DeepSpeed ZeRO: fp32 master weights and fp32 Adam states for 16-bit trainable weights (12 bytes per "
            "parameter); stage 3 fetches parameters per decoder layer like FSDP2 (DeepSpeed's prefetch and "
            "live-parameter limits are not modelled)"
        )
    if plan.strategy in ZERO_BUCKET_STRATEGIES:
        out.append(
            f"DeepSpeed ZeRO-1/2: {plan.num_reduce_buckets} gradient bucket(s) of reduce_bucket_size "
            f"{plan.reduce_bucket_elements:.3g} elements through each backward; its optimizer step's flat gradient "
            "copy and fp32 cast of the rank's partition in place of torch AdamW's temporaries"
        )
    if plan.strategy in PARAM_SHARDED:
        out.append(
            "FSDP buffers: the root and the running layer unsharded, all-gather outputs of two layers in forward "
            "and one in backward, one layer's unsharded gradients before its reduce-scatter"
        )
    if job.fp32_params and plan.strategy in FSDP_FP32_STRATEGIES:
        held = "parameters, gradients and AdamW states" if job.method == "full" else "frozen weights"
        out.append(
            f"FSDP mixed precision over fp32 parameters: the rank's fp32 shards of the {held}; each layer gathered "
            f"and computed in {job.compute_dtype} (param_dtype), its gradients reduced in {job.compute_dtype} "
            "(torch's default reduce_dtype), no autocast"
        )
    if plan.strategy == "fsdp1":
        out.append(
            "FSDP1 (torch FullyShardedDataParallel, accelerate's FSDP): with re-entrant checkpointing and frozen "
            "decoder-layer units (LoRA / QLoRA), every recomputed layer's input and its gradient are held until the "
            "end of backward (`distributed.fsdp1`); FSDP2 (`fully_shard`) frees them per layer"
        )
    if plan.offload != "none" and plan.strategy not in ZERO_STRATEGIES:
        out.append(
            f"FSDP CPU offload ({plan.offload}): the rank's parameter and gradient shards and the optimizer states in "
            "host memory, the optimizer step on the CPU; the GPU keeps the gathered layers and their buffers"
        )
    elif plan.offload != "none":
        held = "parameters, " if offload.offloads_params(plan.offload) else ""
        out.append(
            f"DeepSpeed CPU offload ({plan.offload}): the rank's partition of {held}gradients (fp32), fp32 master "
            "weights and Adam states in host memory; the GPU keeps the reduce bucket and the gathered layers"
        )
    if plan.expert_parallel > 1:
        out.append(
            f"expert parallelism over {plan.expert_parallel} ranks: 1/{plan.expert_parallel} of the routed experts "
            "per rank; balanced routing (each rank's experts process tokens x top-k token-expert pairs, as on one "
            "GPU, so activations are the single-GPU step's); one MoE layer's all-to-all send and receive buffers"
        )
    if job.method == "qlora" and plan.strategy in STORED_SHARDED:
        out.append(
            "QLoRA with sharded parameters needs bitsandbytes' float quant storage (bnb_4bit_quant_storage); "
            "the 4-bit bytes are sharded as stored (derived only: the FSDP2 fake run does not cover QLoRA)"
        )
    return tuple(out)
