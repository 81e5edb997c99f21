"""FP8 training in the throughput model (docs/fp8.md): the linear GEMMs at the GPU's FP8 rate, the casts as
memory traffic per recipe, one-line errors for a GPU without FP8 tensor cores and for QLoRA."""

from __future__ import annotations

import pytest

from tunecost.catalog.gpu_achieved import achieved_catalog
from tunecost.catalog.gpus import get_gpu
from tunecost.errors import TunecostError
from tunecost.estimate.throughput.counts import FP8_TENSOR_CORE, TENSOR_CORE, analytic_step_counts
from tunecost.estimate.throughput.fp8 import fp8_cast_bytes
from tunecost.estimate.throughput.model import (
    FP8_OVER_BF16_EFFICIENCY,
    StackParams,
    catalog_gpu_terms,
    step_time,
)
from tunecost.models.catalog import resolve_model
from tunecost.models.families import arch_of
from tunecost.workload.job import FP8_RECIPES, FineTuneJob, LoraConfig

MODEL = "meta-llama/Llama-3.1-8B"
PARAMS = StackParams(
    gemm_efficiency=0.7, gemm_half_rows=64, memory_efficiency=0.8, kernel_overhead_s=2e-5, step_overhead_s=0.01
)


def _job(fp8: str, method: str = "full") -> FineTuneJob:
    lora = LoraConfig(targets=("attention", "mlp"))
    return FineTuneJob(model=MODEL, method=method, lora=lora, batch_size=2, seq_len=2048, fp8=fp8)


@pytest.fixture(scope="module")
def counts():
    spec = resolve_model(MODEL)
    return {r: analytic_step_counts(spec, _job(r)) for r in ("none", "tensorwise", "te-delayed")}


def test_fp8_moves_the_linear_gemms_to_the_fp8_rate(counts) -> None:
    bf16, fp8 = counts["none"], counts["tensorwise"]
    assert bf16.peak_by_class["dense_matmul"] == TENSOR_CORE and fp8.peak_by_class["dense_matmul"] == FP8_TENSOR_CORE
    for cls in ("lm_head", "attention"):  # the head and attention's BMMs stay bf16
        assert fp8.peak_by_class[cls] == TENSOR_CORE
    assert fp8.flops_by_class == bf16.flops_by_class  # same FLOPs, another rate
    h100 = catalog_gpu_terms(get_gpu("H100"))
    t_bf16, t_fp8 = step_time(bf16, h100, PARAMS), step_time(fp8, h100, PARAMS)
    ratio = t_bf16.class_s["dense_matmul"] / t_fp8.class_s["dense_matmul"]
    assert ratio == pytest.approx(h100.fp8_matmul_flops_per_s / h100.matmul_flops_per_s, rel=0.05)
    assert t_fp8.class_s["elementwise"] > t_bf16.class_s["elementwise"]  # the casts


def test_cast_bytes_follow_each_recipe(counts) -> None:
    extra_torchao = counts["tensorwise"].bytes_by_class["elementwise"] - counts["none"].bytes_by_class["elementwise"]
    extra_te = counts["te-delayed"].bytes_by_class["elementwise"] - counts["none"].bytes_by_class["elementwise"]
    assert 0 < extra_te < extra_torchao
    # torchao, a trained weight, no recompute: 5 bytes per element per cast; x, w forward; g, w, g, x backward
    assert fp8_cast_bytes(
        "tensorwise", weight_elems=10, input_elems=100, grad_out_elems=200, fwd_passes=1, trains_weight=True
    ) == 5 * (110 + 210 + 300)
    # TE: one fused cast + transpose (read 2, write 2) per tensor; the weight's once per micro-batch (cached)
    assert fp8_cast_bytes(
        "te-delayed", weight_elems=10, input_elems=100, grad_out_elems=200, fwd_passes=2, trains_weight=True
    ) == 4 * (2 * 100 + 10 + 200)


def test_fp8_rates_of_the_catalog() -> None:
    h100 = catalog_gpu_terms(get_gpu("H100"))
    assert h100.fp8_matmul_flops_per_s == pytest.approx(1402.6e12)  # gpu_achieved.csv: the FP8 MAMF
    l40s = get_gpu("L40S")
    terms = catalog_gpu_terms(l40s)
    bf16_eff = achieved_catalog()[l40s.name].matmul_flops_per_s / l40s.bf16_tensor_flops_per_s
    assert terms.fp8_matmul_flops_per_s == pytest.approx(733e12 * bf16_eff * FP8_OVER_BF16_EFFICIENCY)
    assert catalog_gpu_terms(get_gpu("A100-80GB")).fp8_matmul_flops_per_s is None


def test_fp8_on_a_gpu_without_fp8_is_one_line(counts) -> None:
    with pytest.raises(TunecostError, match=r"^--fp8: A100-80GB-SXM has no FP8 tensor cores"):
        step_time(counts["tensorwise"], catalog_gpu_terms(get_gpu("A100-80GB")), PARAMS)


def test_fp8_job_errors() -> None:
    with pytest.raises(TunecostError, match=r"^--fp8: FP8 training does not apply to QLoRA"):
        _job("tensorwise", method="qlora")
    with pytest.raises(TunecostError, match=r"unsupported FP8 recipe \(--fp8\) 'tensorwis'; did you mean"):
        _job("tensorwis")


def test_torchao_runs_the_grad_weight_gemm_of_frozen_weights_te_does_not() -> None:
    """torchao's Float8Linear backward computes grad_weight unconditionally (float8_linear.py); TE skips it for a
    frozen weight (requires_wgrad)."""
    spec = resolve_model(MODEL)
    flops = {r: analytic_step_counts(spec, _job(r, "lora")).flops_by_class["dense_matmul"] for r in FP8_RECIPES}
    full = analytic_step_counts(spec, _job("none")).flops_by_class["dense_matmul"]
    assert flops["tensorwise"] == flops["rowwise"] == full  # both use checkpointing: four passes
    assert flops["none"] == flops["te-delayed"] == pytest.approx(full * 3 / 4)


def test_fp8_primary_weights_are_not_cast() -> None:
    """`fp8_params`: the weight is FP8 already; Transformer Engine's per-micro-batch weight cast (read 2, write
    the row- and column-wise copies, 1 + 1 bytes per element) goes."""
    spec = resolve_model(MODEL)
    job = _job("te-delayed", "lora")
    plain, primary = (analytic_step_counts(spec, job.with_(fp8_params=p)) for p in (False, True))
    moved = plain.bytes_by_class["elementwise"] - primary.bytes_by_class["elementwise"]
    assert moved == 4 * arch_of(spec).dense_params


def test_an_fp32_step_runs_its_gemms_at_the_fp32_rate() -> None:
    """torch's fp32 matmuls do not use the tensor cores (TF32 off by default): the step is several times slower."""
    spec, terms = resolve_model(MODEL), catalog_gpu_terms(get_gpu("H100-80GB-SXM"))
    bf16 = analytic_step_counts(spec, _job("none"))
    fp32 = analytic_step_counts(spec, _job("none").with_(compute_dtype="fp32"))
    assert bf16.peak_by_class["dense_matmul"] == TENSOR_CORE and fp32.peak_by_class["dense_matmul"] != TENSOR_CORE
    ratio = step_time(fp32, terms, PARAMS).step_s / step_time(bf16, terms, PARAMS).step_s
    assert ratio > 0.5 * terms.matmul_flops_per_s / terms.fp32_flops_per_s
