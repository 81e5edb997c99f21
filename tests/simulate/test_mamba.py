"""BlackMamba on fake tensors with the fused Mamba kernels' memory (tests/fixtures/simulate/tiny-blackmamba.json)."""

from __future__ import annotations

import pytest

from tunecost.simulate import simulate_step
from tunecost.workload.job import FineTuneJob


def _job(config_path, **kw):
    return FineTuneJob(
        model=config_path("tiny-blackmamba"), method="full", compute_dtype="bf16", batch_size=4, seq_len=128, **kw
    )


def test_blackmamba_full_fine_tune_simulates_and_scales(config_path):
    full = simulate_step(
        _job(config_path, experts_per_token=2, gradient_checkpointing=False), num_layers_to_trace=99, use_cache=False
    )
    scaled = simulate_step(_job(config_path, experts_per_token=2, gradient_checkpointing=False), use_cache=False)
    assert full.layers_traced == (8,) and scaled.layers_traced == (2, 4)  # units of (Mamba, MoE) layers
    assert scaled.peak_bytes == pytest.approx(full.peak_bytes, rel=0.01)
    assert scaled.flops_per_step == pytest.approx(full.flops_per_step, rel=1e-6)
    assert full.counts["forward"].flops_by_class["ssm_scan"] > 0
    assert set(full.module_bytes) >= {"mamba", "experts"}
    # parameters, gradients and AdamW states all in bf16: 2 + 2 + 4 bytes per parameter, at least
    params = full.breakdown_bytes["trainable_params"]
    assert full.peak_bytes >= 4 * params


def test_dense_routing_costs_more_than_sparse(config_path):
    sparse = simulate_step(_job(config_path, experts_per_token=2, gradient_checkpointing=False), use_cache=False)
    dense = simulate_step(_job(config_path, experts_per_token=8, gradient_checkpointing=False), use_cache=False)
    assert dense.total_counts.matmul_flops > 2 * sparse.total_counts.matmul_flops
    assert dense.peak_bytes > sparse.peak_bytes
