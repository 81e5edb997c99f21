"""What users estimate with today (`tunecost.validate.baselines`), computed for docs/accuracy.md."""

from __future__ import annotations

import pytest

from tunecost.models.catalog import resolve_model
from tunecost.models.params import count_parameters
from tunecost.validate.baselines import accelerate_estimate_bytes, deepspeed_estimate_bytes, rule_estimate_bytes

MODEL = "llama-2-7b"


def test_rule_is_bytes_per_parameter_by_method() -> None:
    total = count_parameters(resolve_model(MODEL)).total
    assert rule_estimate_bytes(MODEL, "full") == 16 * total
    assert rule_estimate_bytes(MODEL, "lora") == 2 * total
    assert rule_estimate_bytes(MODEL, "qlora") == total // 2


def test_deepspeed_zero2_on_one_gpu_and_zero3_on_several() -> None:
    """estimate_zero2_model_states_mem_needs on 1 GPU: 2P + 18P; estimate_zero3_model_states_mem_needs on N:
    4 x the largest module's parameters + 18P / N (DeepSpeed's formulas, every parameter trainable)."""
    counts = count_parameters(resolve_model(MODEL))
    assert deepspeed_estimate_bytes(MODEL, 1) == 20 * counts.total
    assert deepspeed_estimate_bytes(MODEL, 4) == 4 * counts.largest_module + int(18 * counts.total / 4)
    assert counts.largest_module == 32000 * 4096  # Llama-2-7B: the embedding (and the head) is the largest module


def test_accelerate_training_and_load_sizes() -> None:
    """accelerate's estimate-memory on the meta-device model in fp32: the 'Training using Adam' figure for a full
    fine-tune in mixed precision (the largest of `estimate_training_usage`'s parts: 2x the fp32 size), the bf16 and
    int4 load sizes for LoRA and QLoRA."""
    total = count_parameters(resolve_model(MODEL)).total
    full, lora, qlora = (accelerate_estimate_bytes(MODEL, m) for m in ("full", "lora", "qlora"))
    assert lora == pytest.approx(2 * total, rel=1e-3)
    assert qlora == pytest.approx(total / 2, rel=1e-3)
    assert full == pytest.approx(8 * total, rel=1e-3)
