"""Analytic step counts (tunecost.estimate.throughput.counts) and the architecture numbers they use."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tunecost.errors import TunecostError
from tunecost.estimate.throughput.counts import (
    OP_CLASSES,
    SYNC_PER_MICRO_STEP,
    SYNC_PER_QUANT_LINEAR,
    analytic_step_counts,
    experts_hit,
)
from tunecost.estimate.throughput.lengths import fixed_lengths
from tunecost.estimate.throughput.quant_counts import (
    GPTQ_TORCH_DEQUANT_BYTES_PER_PARAM,
    INT8_BWD_DEQUANT_BYTES_PER_PARAM,
    INT8_FWD_BYTES_PER_IO,
    NF4_BYTES_PER_PARAM,
)
from tunecost.models.catalog import resolve_model
from tunecost.models.families import arch_of
from tunecost.workload.job import FineTuneJob

# Mixtral-8x7B by hand (config: H 4096, I 14336, 32 layers, 32 q / 8 kv heads of 128, vocab 32000):
MIXTRAL_EXPERT_PARAMS = 3 * 4096 * 14336  # w1, w3, w2 of one expert
MIXTRAL_ATTN_PARAMS = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024)  # q, o + k, v over 32 layers


def _mixtral_job(**kw) -> FineTuneJob:
    return FineTuneJob(model="mixtral-8x7b", **{"experts_per_token": 2, "batch_size": 1, "seq_len": 128, **kw})


def test_mixtral_arch_matches_hand_count_and_published_totals() -> None:
    arch = arch_of(resolve_model("mixtral-8x7b"))
    assert arch.expert_params == MIXTRAL_EXPERT_PARAMS
    assert arch.dense_params == MIXTRAL_ATTN_PARAMS
    assert arch.total_params == 46_702_792_704  # Mistral AI: 46.7 B total
    assert arch.active_params(2) == pytest.approx(12.9e9, rel=0.01)  # Mistral AI: 12.9 B used per token


def test_blackmamba_arch_matches_published_sizes() -> None:
    arch = arch_of(resolve_model("blackmamba-2.8b"))
    assert arch.total_params == pytest.approx(2.78e9, rel=0.005)  # "2.8B" model: 2.78 B (BlackMamba paper / model card)
    assert arch.active_params(1) == pytest.approx(0.63e9, rel=0.01)  # "630M" active at the released top-1
    assert (arch.num_mamba_layers, arch.num_moe_layers, arch.num_attention_layers) == (18, 18, 0)


@pytest.mark.parametrize(
    "name",
    [
        "mixtral-8x7b",
        "olmoe-1b-7b",
        "qwen3-30b-a3b",
        "qwen1.5-moe-a2.7b",
        "tiny-mixtral",
        "granite-3.0-3b-a800m",
        "ibm-moe-7b-1b-shared",
        "gpt-oss-20b",
        "santacoder",
        "deepseek-v2-lite",
    ],
)
def test_arch_totals_match_the_meta_built_model(name: str) -> None:
    from tunecost.models.params import count_parameters

    spec = resolve_model(name)
    counts = count_parameters(spec)
    arch = arch_of(spec)
    assert arch.total_params == counts.total
    assert arch.routed_expert_params == counts.routed_experts
    assert arch.active_params(spec.default_experts_per_token) == counts.active


def test_granitemoeshared_arch_counts_the_shared_mlp_as_the_meta_built_model() -> None:
    from pathlib import Path

    from tunecost.models.params import count_parameters

    spec = resolve_model(str(Path(__file__).parents[2] / "fixtures" / "simulate" / "tiny-granitemoeshared.json"))
    counts, arch = count_parameters(spec), arch_of(spec)
    assert (arch.total_params, arch.routed_expert_params) == (counts.total, counts.routed_experts)
    assert arch.active_params(2) == counts.active
    h, shared, layers = 64, 48, 5  # input_linear h -> 2 x shared, output_linear shared -> h, in every layer
    without = arch_of(replace(spec, config={**spec.config, "shared_intermediate_size": 0}))
    assert arch.dense_params - without.dense_params == layers * 3 * h * shared


def test_deepseek_v2_arch_counts_mla_the_dense_prefix_and_shared_experts() -> None:
    from pathlib import Path

    from tunecost.models.params import count_parameters

    lite = arch_of(resolve_model("deepseek-v2-lite"))
    h, heads, layers = 2048, 16, 27  # MLA: q 192 wide per head, kv latent 512 + rope 64, values 128 per head
    attention = h * heads * 192 + h * (512 + 64) + 512 * heads * (128 + 128) + heads * 128 * h
    assert lite.attention_in_out == layers * ((h + heads * 192) + (h + 576) + (512 + heads * 256) + (heads * 128 + h))
    assert (lite.num_moe_layers, lite.num_experts, lite.expert_ffn, lite.head_dim) == (26, 64, 1408, 160)
    shared, dense = 3 * h * 2 * 1408, 3 * h * 10944  # two shared experts in 26 layers, the dense first layer
    assert lite.dense_params == layers * attention + 26 * shared + dense
    spec = resolve_model(str(Path(__file__).parents[2] / "fixtures" / "simulate" / "tiny-deepseek-v2.json"))
    for config in (spec.config, {**spec.config, "q_lora_rank": 24}):  # q_a_proj + q_a_layernorm + q_b_proj
        counts, arch = count_parameters(replace(spec, config=config)), arch_of(replace(spec, config=config))
        assert (arch.total_params, arch.routed_expert_params) == (counts.total, counts.routed_experts)
        assert arch.active_params(2) == counts.active


def test_deepseek_v3_counts_as_transformers_builds_it_and_as_its_report_says() -> None:
    """V3 has V2's modules (its router's group-limited sigmoid scoring adds a buffer only). At full size, the
    hyperparameters of the DeepSeek-V3 technical report (arXiv 2412.19437, section 4.2: 61 layers of width 7168,
    128 heads, q/kv latents 1536/512, rope 64, 3 dense layers, 1 shared + 256 routed experts of width 2048, 8
    active; vocabulary 129,280, dense MLP 18,432) give its stated 671B total and 37B active parameters."""
    from pathlib import Path

    from tunecost.models.params import count_parameters

    spec = resolve_model(str(Path(__file__).parents[2] / "fixtures" / "simulate" / "tiny-deepseek-v3.json"))
    counts, arch = count_parameters(spec), arch_of(spec)
    assert spec.family == arch.family == "deepseek_v3"
    assert (arch.total_params, arch.routed_expert_params, arch.active_params(2)) == (
        counts.total,
        counts.routed_experts,
        counts.active,
    )
    sizes = {"hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128, "q_lora_rank": 1536}
    sizes |= {"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
    sizes |= {"n_routed_experts": 256, "n_shared_experts": 1, "moe_intermediate_size": 2048, "num_experts_per_tok": 8}
    sizes |= {"first_k_dense_replace": 3, "vocab_size": 129280, "intermediate_size": 18432}
    full = arch_of(replace(spec, config={**spec.config, **sizes}))
    assert full.total_params == pytest.approx(671e9, rel=0.001)
    assert full.active_params(8) == pytest.approx(37e9, rel=0.02)


@pytest.mark.parametrize("extra", [{}, {"attention_bias": False, "use_qk_norm": False}])
def test_glm4_moe_counts_as_transformers_builds_it(extra) -> None:
    """GLM-4.5's layout (GQA with q/k/v biases and q/k norms, a dense first layer, routed + shared experts): the
    throughput model's totals equal the model transformers builds from the config."""
    from pathlib import Path

    from tunecost.models.params import count_parameters

    spec = resolve_model(str(Path(__file__).parents[2] / "fixtures" / "simulate" / "tiny-glm4-moe.json"))
    spec = replace(spec, config={**spec.config, **extra})
    counts, arch = count_parameters(spec), arch_of(spec)
    assert arch.family == "glm4_moe" and (arch.num_moe_layers, arch.num_experts) == (3, 8)
    assert (arch.total_params, arch.routed_expert_params, arch.active_params(2)) == (
        counts.total,
        counts.routed_experts,
        counts.active,
    )


def test_unsupported_family_is_a_clear_error() -> None:
    spec = resolve_model("llama-3.2-1b")
    with pytest.raises(TunecostError, match="'mamba2'"):
        arch_of(replace(spec, family="mamba2"))


def test_experts_hit_limits() -> None:
    assert experts_hit(8, 2, 1) == pytest.approx(2.0)  # one token touches exactly k experts
    assert experts_hit(8, 8, 3) == pytest.approx(8.0)  # dense: every expert
    assert experts_hit(8, 2, 1000) == pytest.approx(8.0)  # many tokens: all experts


def test_qlora_expert_and_dequant_terms_by_hand() -> None:
    # Frozen 4-bit experts under gradient checkpointing: forward + recompute + grad-input = 3 passes, no weight grad.
    counts = analytic_step_counts(resolve_model("mixtral-8x7b"), _mixtral_job())
    tokens = 128
    fwd_expert_flops = 2 * tokens * 2 * MIXTRAL_EXPERT_PARAMS * 32
    assert counts.flops_by_class["expert_matmul"] == pytest.approx(3 * fwd_expert_flops)
    # Every expert is hit (128 tokens x 2): dequantize all 4-bit weights 3 times (read nf4 + absmax, write bf16).
    quantized = 8 * 32 * MIXTRAL_EXPERT_PARAMS + MIXTRAL_ATTN_PARAMS + 32 * 4096 * 8
    assert counts.bytes_by_class["dequant"] == pytest.approx(3 * quantized * (NF4_BYTES_PER_PARAM + 2), rel=1e-3)
    assert set(counts.flops_by_class) == set(OP_CLASSES)
    assert counts.source == "analytic"


def test_gptq_torch_path_dequantizes_on_forward_and_recompute_with_its_unfused_traffic() -> None:
    """auto-gptq's torch path (qlinear_cuda_old): 16.5 bytes per weight element in 9 kernels per call, twice under
    checkpointing (the matmul keeps the fp16 weight for backward); its triton kernel is priced as bitsandbytes'."""
    spec = resolve_model("mistral-7b-v0.1")
    job = FineTuneJob(
        model="mistral-7b-v0.1", method="qlora", batch_size=1, seq_len=128, quant_type="gptq", compute_dtype="fp16"
    )
    torch_path = analytic_step_counts(spec, job.with_(gptq_kernel="torch"))
    triton = analytic_step_counts(spec, job.with_(gptq_kernel="triton-v2"))
    nf4 = analytic_step_counts(spec, job.with_(quant_type="nf4"))
    assert GPTQ_TORCH_DEQUANT_BYTES_PER_PARAM == 0.5 + 4 + 5 + 2 + 2 + 3  # shift, cast, and, sub, mul
    params = triton.bytes_by_class["dequant"] / (3 * (NF4_BYTES_PER_PARAM + 2))
    assert torch_path.bytes_by_class["dequant"] == pytest.approx(2 * params * GPTQ_TORCH_DEQUANT_BYTES_PER_PARAM)
    calls = triton.kernels_by_class["dequant"] / (3 * 2)  # 3 passes x 2 kernels per call (as bitsandbytes)
    assert torch_path.kernels_by_class["dequant"] == pytest.approx(2 * calls * 9)
    assert triton.bytes_by_class["dequant"] == nf4.bytes_by_class["dequant"]
    no_ckpt = analytic_step_counts(spec, job.with_(gptq_kernel="torch", gradient_checkpointing=False))
    assert no_ckpt.bytes_by_class["dequant"] == pytest.approx(torch_path.bytes_by_class["dequant"] / 2)


def test_int8_quantizes_inputs_forward_and_dequantizes_weights_for_the_input_gradient() -> None:
    """LLM.int8 under checkpointing: the activation (de)quantization traffic on forward and recompute, the weight
    de-quantized once in backward; the same GEMM FLOPs as 16-bit LoRA; the host waits in every 8-bit linear."""
    spec = resolve_model("mistral-7b-v0.1")
    arch = arch_of(spec)
    job = FineTuneJob(model="mistral-7b-v0.1", method="qlora", quant_type="int8", batch_size=2, seq_len=128)
    int8, lora = analytic_step_counts(spec, job), analytic_step_counts(spec, job.with_(method="lora"))
    tokens = 2 * 128
    forward = 2 * tokens * arch.dense_in_out * (INT8_FWD_BYTES_PER_IO + 2)  # forward + recompute, bf16
    backward = arch.dense_params * (INT8_BWD_DEQUANT_BYTES_PER_PARAM + 3 * 2)
    assert int8.bytes_by_class["dequant"] == pytest.approx(forward + backward)
    assert int8.kernels_by_class["dequant"] == arch.num_dense_matrices * (2 * 9 + 3)
    assert int8.flops_by_class["dense_matmul"] == lora.flops_by_class["dense_matmul"]
    assert (int8.host_sync, lora.host_sync) == (SYNC_PER_QUANT_LINEAR, SYNC_PER_MICRO_STEP)
    no_ckpt = analytic_step_counts(spec, job.with_(gradient_checkpointing=False))
    assert no_ckpt.bytes_by_class["dequant"] == pytest.approx(forward / 2 + backward)


def test_lora_without_quantization_has_no_dequant_and_full_ft_trains_everything() -> None:
    lora = analytic_step_counts(resolve_model("mixtral-8x7b"), _mixtral_job(method="lora"))
    assert lora.bytes_by_class["dequant"] == 0
    full = analytic_step_counts(
        resolve_model("mixtral-8x7b"), _mixtral_job(method="full", gradient_checkpointing=False)
    )
    # full fine-tuning: forward + grad-input + grad-weight = 3 passes; no adapters; optimizer over all weights
    assert full.flops_by_class["expert_matmul"] == pytest.approx(3 * 2 * 128 * 2 * MIXTRAL_EXPERT_PARAMS * 32)
    assert full.flops_by_class["lora"] == 0
    assert full.bytes_by_class["optimizer"] > 100 * lora.bytes_by_class["optimizer"]


def test_fp32_parameters_double_the_optimizer_traffic_and_add_the_weight_casts() -> None:
    """torch AMP over fp32 parameters: AdamW over 4-byte parameters, and every matmul weight read in fp32 and
    written in bf16 per forward and recompute, its bf16 gradient cast to fp32 once: 6 bytes per weight a pass."""
    spec = resolve_model("llama-3.2-1b")
    arch = arch_of(spec)
    job = FineTuneJob(model="llama-3.2-1b", method="full", batch_size=2, seq_len=256)
    bf16, amp = (analytic_step_counts(spec, job.with_(fp32_params=f)) for f in (False, True))
    assert amp.bytes_by_class["optimizer"] == pytest.approx(2 * bf16.bytes_by_class["optimizer"])
    cast = arch.total_params - arch.embedding_params + arch.lm_head_params  # tied: the head casts the table
    embedding_grad = 2 * arch.embedding_params * 2  # its fp32 gradient's zero-fill and scatter, 2 bytes more
    extra = amp.bytes_by_class["elementwise"] - bf16.bytes_by_class["elementwise"]
    assert extra == pytest.approx(cast * 6 * (2 + 1) + embedding_grad)  # forward, recompute, gradient cast
    assert amp.flops_by_class == bf16.flops_by_class
    # LoRA over fp32 frozen weights: the same casts on forward and recompute, no gradient and no other optimizer
    lora = job.with_(method="lora")
    bf16, amp = (analytic_step_counts(spec, lora.with_(fp32_params=f)) for f in (False, True))
    assert amp.bytes_by_class["optimizer"] == bf16.bytes_by_class["optimizer"]
    assert amp.bytes_by_class["elementwise"] - bf16.bytes_by_class["elementwise"] == pytest.approx(cast * 6 * 2)


def test_dense_routing_quadruples_expert_work() -> None:
    spec = resolve_model("mixtral-8x7b")
    sparse = analytic_step_counts(spec, _mixtral_job(experts_per_token=2))
    dense = analytic_step_counts(spec, _mixtral_job(experts_per_token=8))
    assert dense.flops_by_class["expert_matmul"] == pytest.approx(4 * sparse.flops_by_class["expert_matmul"])
    assert dense.flops_by_class["dense_matmul"] == sparse.flops_by_class["dense_matmul"]


def test_gemm_rows_are_tokens_per_expert() -> None:
    counts = analytic_step_counts(resolve_model("mixtral-8x7b"), _mixtral_job(batch_size=4))
    assert counts.tokens_per_step == 512
    assert counts.gemm_rows_by_class["expert_matmul"] == pytest.approx(512 * 2 / 8, rel=1e-6)
    assert counts.gemm_rows_by_class["dense_matmul"] == 512


def test_work_grows_with_tokens_but_weight_traffic_does_not() -> None:
    spec = resolve_model("mixtral-8x7b")
    small = analytic_step_counts(spec, _mixtral_job(batch_size=1))
    big = analytic_step_counts(spec, _mixtral_job(batch_size=8))
    assert big.flops_by_class["expert_matmul"] == pytest.approx(8 * small.flops_by_class["expert_matmul"])
    assert big.bytes_by_class["dequant"] == pytest.approx(small.bytes_by_class["dequant"])  # per weight, not per token
    assert big.total_kernels == pytest.approx(small.total_kernels)  # the eager loop launches per expert, not per token


def test_blackmamba_full_finetune_counts_scan_and_no_attention() -> None:
    spec = resolve_model("blackmamba-2.8b")
    job = FineTuneJob(
        model="blackmamba-2.8b",
        method="full",
        gradient_checkpointing=False,
        experts_per_token=2,
        batch_size=2,
        seq_len=100,
    )
    counts = analytic_step_counts(spec, job)
    assert counts.flops_by_class["attention"] == 0
    assert counts.flops_by_class["ssm_scan"] > 0
    arch = arch_of(spec)
    assert counts.flops_by_class["expert_matmul"] == pytest.approx(3 * 2 * 200 * 2 * arch.expert_params * 18)


def test_lengths_must_match_the_job_batch() -> None:
    with pytest.raises(TunecostError, match="batch"):
        analytic_step_counts(resolve_model("mixtral-8x7b"), _mixtral_job(batch_size=2), fixed_lengths(128, 3))


def test_analytic_counts_agree_with_the_step_simulator() -> None:
    """The step simulator traces the paper's stack ("hf-2024") on fake tensors; the analytic counts must agree on
    the matmul classes, which do not depend on how kernels are fused. (De-quantization and element-wise bytes
    differ: the simulator counts every op's reads and writes as traced; docs/throughput-model.md compares them.)"""
    from tunecost.simulate import simulate_step

    job = _mixtral_job(batch_size=2)
    sim = simulate_step(job.with_(stack="hf-2024"), use_cache=False).total_counts
    ours = analytic_step_counts(resolve_model("mixtral-8x7b"), job)
    for cls in ("expert_matmul", "lm_head"):
        assert ours.flops_by_class[cls] == pytest.approx(sim.flops_by_class[cls], rel=1e-3)
        assert ours.bytes_by_class[cls] == pytest.approx(sim.bytes_by_class[cls], rel=1e-2)
    assert ours.flops_by_class["lora"] == pytest.approx(sim.flops_by_class["lora"], rel=0.1)
    # the simulator files q/k/v/o under "attention" with the attention kernel, and counts no causal saving
    ours_attention = ours.flops_by_class["attention"] + ours.flops_by_class["dense_matmul"]
    assert ours_attention == pytest.approx(
        sim.flops_by_class["attention"] + sim.flops_by_class.get("dense_matmul", 0), rel=0.05
    )
