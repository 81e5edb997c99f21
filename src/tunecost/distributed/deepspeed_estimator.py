"""DeepSpeed's own ZeRO memory estimator, shown beside tunecost's per-rank memory.

The GPU side of `estimate_zero2_model_states_mem_needs` (deepspeed/runtime/zero/stage_1_and_2.py) and
`estimate_zero3_model_states_mem_needs` (deepspeed/runtime/zero/stage3.py), in bytes per GPU, for P parameters
on N GPUs:

- ZeRO-2: 2P (16-bit weights) + 18P / N (16- and 32-bit gradients, fp32 master weights, Adam's two states);
  with the optimizer offloaded, 2P.
- ZeRO-3: 4 x the largest module's own parameters + 18P / N; with the optimizer offloaded, + 2P / N instead;
  with parameters offloaded too, the largest module's term alone.

DeepSpeed's estimator counts every parameter as trainable in 16 bits with Adam and counts model states only:
for LoRA or QLoRA (frozen or 4-bit base weights, no states for them) it is far above what a rank holds, and it
has no activations, temporaries, communication buffers or allocator overhead. ZeRO-1 has no estimator there.
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
