"""What users estimate with today, computed on the same rows as tunecost (never quoted):

- accelerate's `estimate-memory` (`accelerate.commands.estimate`): the model's size from its meta-device
  parameters (`calculate_maximum_sizes`) and, for training, the largest of `estimate_training_usage`'s parts
  (the "Training using Adam" column, mixed precision: 2 x the fp32 size). It gives no LoRA or QLoRA training
  figure; for those rows its load size is what it offers (bf16: fp32 size / 2; int4: fp32 size / 8).
- the bytes-per-parameter rule: 16 bytes per parameter for a mixed-precision Adam full fine-tune (bf16 weights
  and gradients, fp32 master weights and two fp32 states; 20 with fp32 gradients), and the weights alone for
  LoRA (2 bytes per parameter) and QLoRA (0.5).
- DeepSpeed's model-states estimators (`estimate_zero2_model_states_mem_needs` /
  `estimate_zero3_model_states_mem_needs`, as `distributed.deepspeed_estimator` transcribes them): a row on one
  GPU as ZeRO-2 on one GPU (20 bytes per parameter), a row of N GPUs whose states are sharded (FSDP full shard) as
  ZeRO-3 on N GPUs; every parameter counted as trainable, as DeepSpeed's estimator does (it has no adapter case).
None of them counts activations, the CUDA context or the allocator's reserve.
"""

from __future__ import annotations

from functools import lru_cache

from tunecost.distributed.deepspeed_estimator import zero2_gpu_bytes, zero3_gpu_bytes
from tunecost.models.build import build_model
from tunecost.models.catalog import resolve_model
from tunecost.models.params import count_parameters

RULE_BYTES_PER_PARAM = {"full": 16.0, "lora": 2.0, "qlora": 0.5}


@lru_cache(maxsize=64)
def _fp32_bytes(model: str) -> int:
    """accelerate's `calculate_maximum_sizes` on the model built on the meta device in fp32 (as its
    `create_empty_model` does)."""
    import torch
    from accelerate.utils import calculate_maximum_sizes

    model_ = build_model(resolve_model(model), device="meta", dtype=torch.float32)
    total, _ = calculate_maximum_sizes(model_)
    return int(total)


def accelerate_estimate_bytes(model: str, method: str) -> int:
    from accelerate.commands.estimate import estimate_training_usage

    fp32 = _fp32_bytes(model)
    if method == "full":
        return int(max(estimate_training_usage(fp32, "float16").values()))
    return fp32 // 2 if method == "lora" else fp32 // 8


def rule_estimate_bytes(model: str, method: str) -> int:
    return int(count_parameters(resolve_model(model)).total * RULE_BYTES_PER_PARAM[method])


def deepspeed_estimate_bytes(model: str, num_gpus: int) -> int:
    """DeepSpeed's estimate per GPU: ZeRO-2 on one GPU, ZeRO-3 on `num_gpus` above one (no offload)."""
    counts = count_parameters(resolve_model(model))
    if num_gpus == 1:
        return zero2_gpu_bytes(total_params=counts.total, num_gpus=1, offload_optimizer=False)
    return zero3_gpu_bytes(
        total_params=counts.total,
        largest_module_params=counts.largest_module,
        num_gpus=num_gpus,
        offload_optimizer=False,
        offload_params=False,
    )
