"""What users estimate with today (accelerate's `estimate-memory`, the bytes-per-parameter rule,
DeepSpeed's model-states estimators), computed on the same rows as tunecost, never quoted.

Sources and derivations: docs/validation.md, section `tunecost.validate.baselines`.
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
