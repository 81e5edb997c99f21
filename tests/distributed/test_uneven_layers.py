"""Per-rank memory of models whose layers are not all alike (DeepSeek's dense first layer, BlackMamba's Mamba + MoE
pairs): the per-layer totals are the average layer's, what a rank gathers at once is a whole repeating unit's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunecost.distributed.rank_memory import rank_memory
from tunecost.distributed.single_step import single_gpu_step
from tunecost.workload.job import FineTuneJob, LoraConfig
from tunecost.workload.parallel import ParallelPlan

SIMULATE = Path(__file__).parents[1] / "fixtures" / "simulate"
DENSE = Path(__file__).parents[1] / "fixtures" / "distributed" / "tiny-llama-4l.json"


def _step(model: Path, **kw):
    job = FineTuneJob(model=str(model), batch_size=2, seq_len=32, compute_dtype="fp32", **kw)
    return job, single_gpu_step(job, granule_bytes=1, use_cache=False)


@pytest.mark.parametrize(
    ("model", "options"),
    [
        (SIMULATE / "tiny-deepseek-v2.json", {"method": "lora", "lora": LoraConfig(rank=4)}),
        (SIMULATE / "tiny-blackmamba.json", {"method": "full", "gradient_checkpointing": False}),
    ],
)
def test_a_rank_gathers_a_whole_repeating_unit(model: Path, options: dict) -> None:
    job, step = _step(model, **options)
    assert step.layer_scale > 1.0  # a unit outweighs the average layer (the dense prefix or the Mamba half)
    assert step.weight_bytes == pytest.approx(sum(step.weight_bytes_by_key.values()), abs=step.num_layers)
    fsdp = rank_memory(step, job, ParallelPlan(num_gpus=2, strategy="fsdp2"))
    key = fsdp.peak_segment
    if "all_gather_buffers" in fsdp.breakdown_bytes:  # forward or backward peak: the gathered layer in flight
        gathered = step.layer_bytes_per_rank(trainable=False, ep=1)
        assert gathered == round(step.layer_weight_bytes * step.layer_scale), key


def _layer_bytes(model: Path) -> list[int]:
    """Each decoder layer's fp32 parameter bytes, from the model built on the meta device."""
    import torch

    from tunecost.models.anatomy import decoder_layers
    from tunecost.models.build import build_model
    from tunecost.models.catalog import resolve_model

    built = build_model(resolve_model(str(model)), device="meta", dtype=torch.float32, seed=None)
    return [4 * sum(p.numel() for p in layer.parameters()) for layer in decoder_layers(built)]


def test_the_unit_is_deepseeks_moe_layer_and_blackmambas_pair() -> None:
    """Full fine-tunes in fp32: every stored byte is a parameter's, so the unit is countable by hand."""
    full = {"method": "full", "gradient_checkpointing": False}
    _, step = _step(SIMULATE / "tiny-deepseek-v2.json", **full)
    layers = _layer_bytes(SIMULATE / "tiny-deepseek-v2.json")
    assert layers[0] < layers[1] == layers[-1]  # the dense first layer, then MoE layers
    assert step.layer_weight_bytes * step.layer_scale == pytest.approx(layers[1], rel=1e-3)
    _, step = _step(SIMULATE / "tiny-blackmamba.json", **full)
    layers = _layer_bytes(SIMULATE / "tiny-blackmamba.json")
    assert step.layer_weight_bytes * step.layer_scale == pytest.approx(layers[0] + layers[1], rel=1e-3)


def test_identical_layers_gather_one_layer() -> None:
    _, step = _step(DENSE, method="lora", lora=LoraConfig(rank=4, targets=("attention", "mlp")))
    assert step.layer_scale == 1.0
