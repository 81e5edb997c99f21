"""DeepSpeed's own ZeRO memory estimator, shown beside tunecost's per-rank memory.

Sources and derivations: docs/multi-gpu.md, section `tunecost.distributed.deepspeed_estimator`.
"""

from __future__ import annotations

from tunecost.models.params import ParamCounts
from tunecost.workload import offload as offload_rules
from tunecost.workload.parallel import ParallelPlan

ASSUMPTION = (
    "DeepSpeed's estimator (estimate_zero2/zero3_model_states_mem_needs): every parameter trainable in 16 bits "
    "with Adam, model states only (no activations or buffers)"
)
ZERO2_GRADIENT_AND_ADAM_BYTES = 18  # 2 + 4 gradient bytes, 4 fp32 master, 8 Adam (DeepSpeed's comment)
ZERO3_LARGEST_MODULE_BYTES = 4  # DeepSpeed's largest_layer_memory: 4 bytes per parameter of the largest module
ZERO3_OFFLOADED_OPTIMIZER_BYTES = 2  # 16-bit parameter shard kept on the GPU


def zero2_gpu_bytes(*, total_params: int, num_gpus: int, offload_optimizer: bool) -> int:
    """estimate_zero2_model_states_mem_needs: bytes per GPU."""
    if offload_optimizer:
        return 2 * total_params
    return 2 * total_params + int(ZERO2_GRADIENT_AND_ADAM_BYTES * total_params / num_gpus)


def zero3_gpu_bytes(
    *, total_params: int, largest_module_params: int, num_gpus: int, offload_optimizer: bool, offload_params: bool
) -> int:
    """estimate_zero3_model_states_mem_needs: bytes per GPU."""
    largest = ZERO3_LARGEST_MODULE_BYTES * largest_module_params
    if offload_optimizer and offload_params:
        return largest
    if offload_optimizer:
        return largest + int(ZERO3_OFFLOADED_OPTIMIZER_BYTES * total_params / num_gpus)
    return largest + int(ZERO2_GRADIENT_AND_ADAM_BYTES * total_params / num_gpus)


def gpu_bytes(plan: ParallelPlan, counts: ParamCounts) -> int | None:
    """DeepSpeed's estimate for a zero2 or zero3 plan (None for other strategies)."""
    offload_optimizer = offload_rules.offloads_states(plan.offload)
    if plan.strategy == "zero2":
        return zero2_gpu_bytes(total_params=counts.total, num_gpus=plan.num_gpus, offload_optimizer=offload_optimizer)
    if plan.strategy == "zero3":
        return zero3_gpu_bytes(
            total_params=counts.total,
            largest_module_params=counts.largest_module,
            num_gpus=plan.num_gpus,
            offload_optimizer=offload_optimizer,
            offload_params=offload_rules.offloads_params(plan.offload),
        )
    return None
