"""Analytic step counts of dense transformers (Llama, Mistral, Qwen) by hand, and gradient accumulation."""

from __future__ import annotations

import pytest

from tunecost.estimate.throughput.counts import (
    FLCE_BYTES_PER_VOCAB,
    FLCE_KERNELS_PER_CHUNK,
    LOSS_BYTES_PER_VOCAB,
    LOSS_KERNELS,
    SYNC_PER_MICRO_STEP,
    accumulated,
    analytic_step_counts,
)
from tunecost.estimate.throughput.model import StackParams, overlapped_s, step_time
from tunecost.models.catalog import resolve_model
from tunecost.models.families import arch_of
from tunecost.workload.job import FineTuneJob, LoraConfig

# Mistral-7B by hand (config: H 4096, FFN 14336, 32 layers, 32 q / 8 kv heads of 128, vocab 32000, untied head):
H, FFN, LAYERS, KV, VOCAB = 4096, 14336, 32, 1024, 32000
MISTRAL_ATTN = LAYERS * (2 * H * H + 2 * H * KV)  # q, o and k, v
MISTRAL_MLP = LAYERS * 3 * H * FFN  # gate, up, down
MISTRAL_HEAD = VOCAB * H
MISTRAL_NORMS = LAYERS * 2 * H + H  # two RMSNorms per layer and the final one


def _mistral(**kw) -> FineTuneJob:
    return FineTuneJob(model="mistral-7b-v0.1", **{"batch_size": 2, "seq_len": 4096, **kw})


@pytest.mark.parametrize("name", ["mistral-7b-v0.1", "llama-3.2-3b", "qwen-1_8b", "qwen-7b"])
def test_dense_arch_totals_match_the_meta_built_model(name: str) -> None:
    from tunecost.models.params import count_parameters

    spec = resolve_model(name)
    assert arch_of(spec).total_params == count_parameters(spec).total
    assert arch_of(spec).num_experts == 1


def test_full_finetune_matmuls_are_six_flops_per_parameter_and_token() -> None:
    spec = resolve_model("mistral-7b-v0.1")
    arch = arch_of(spec)
    assert arch.dense_params == MISTRAL_ATTN + MISTRAL_MLP
    assert arch.total_params == MISTRAL_ATTN + MISTRAL_MLP + 2 * MISTRAL_HEAD + MISTRAL_NORMS  # embedding + head
    counts = analytic_step_counts(spec, _mistral(method="full", gradient_checkpointing=False))
    tokens = 2 * 4096
    matmul_params = arch.total_params - arch.embedding_params - MISTRAL_NORMS  # every weight used in a matmul
    assert matmul_params == MISTRAL_ATTN + MISTRAL_MLP + MISTRAL_HEAD
    # forward 2, backward 4 (input and weight gradients) FLOPs per matmul parameter per token
    matmul = counts.flops_by_class["dense_matmul"] + counts.flops_by_class["lm_head"]
    assert matmul == pytest.approx(6 * matmul_params * tokens)
    # causal attention forward: QK^T and PV over half the L x L scores, 2 FLOPs a multiply-add: 2 L^2 d per
    # sequence and layer; FlashAttention-2's backward recomputes the scores: 2.5 x the forward
    attention_fwd = 2 * 2 * 4096**2 * H * LAYERS
    assert counts.flops_by_class["attention"] == pytest.approx((1 + 2.5) * attention_fwd)
    assert counts.flops_by_class["expert_matmul"] == 0 and counts.flops_by_class["router"] == 0


def test_gradient_checkpointing_recomputes_the_forward_but_not_the_head() -> None:
    spec = resolve_model("mistral-7b-v0.1")
    counts = analytic_step_counts(spec, _mistral(method="full", gradient_checkpointing=True))
    tokens = 2 * 4096
    assert counts.flops_by_class["dense_matmul"] == pytest.approx(8 * (MISTRAL_ATTN + MISTRAL_MLP) * tokens)
    assert counts.flops_by_class["lm_head"] == pytest.approx(6 * MISTRAL_HEAD * tokens)


def test_lora_on_attention_adapts_q_k_v_o_only() -> None:
    spec = resolve_model("mistral-7b-v0.1")
    r = 16
    attn = analytic_step_counts(spec, _mistral(method="lora", lora=LoraConfig(rank=r, targets=("attention",))))
    both = analytic_step_counts(spec, _mistral(method="lora", lora=LoraConfig(rank=r, targets=("attention", "mlp"))))
    tokens = 2 * 4096
    attention_in_out = LAYERS * (2 * (H + H) + 2 * (H + KV))
    mlp_in_out = LAYERS * 3 * (H + FFN)
    passes = 4  # forward, recompute (gradient checkpointing), grad-input, grad-weight of A and B
    assert attn.flops_by_class["lora"] == pytest.approx(passes * 2 * r * tokens * attention_in_out)
    assert both.flops_by_class["lora"] == pytest.approx(passes * 2 * r * tokens * (attention_in_out + mlp_in_out))
    # frozen base under LoRA: forward, recompute and grad-input only (no weight gradient)
    assert attn.flops_by_class["dense_matmul"] == pytest.approx(6 * (MISTRAL_ATTN + MISTRAL_MLP) * tokens)
    # the optimizer steps the adapters only: r x (in + out) parameters per adapted matrix
    assert attn.flops_by_class["optimizer"] < both.flops_by_class["optimizer"]


def test_adapters_in_the_compute_dtype_move_fewer_bytes_than_peft_fp32_ones() -> None:
    """PEFT's fp32 path moves 12 bytes per (in + out) a pass (4 passes under checkpointing); adapters in the compute
    dtype (torchtune, litgpt, NeMo) 7 per forward pass and 9 for the whole backward, the same FLOPs."""
    spec = resolve_model("mistral-7b-v0.1")
    job = _mistral(method="lora", lora=LoraConfig(rank=16, targets=("attention",)), gradient_checkpointing=True)
    fp32, bf16 = (analytic_step_counts(spec, job, lora_compute_dtype=c) for c in (False, True))
    token_io = 2 * 4096 * LAYERS * (2 * (H + H) + 2 * (H + KV))
    assert fp32.bytes_by_class["lora"] == pytest.approx(4 * 12 * token_io)
    assert bf16.bytes_by_class["lora"] == pytest.approx((2 * 7 + 9) * token_io)
    assert bf16.flops_by_class["lora"] == fp32.flops_by_class["lora"]
    assert bf16.kernels_by_class["lora"] < fp32.kernels_by_class["lora"]
    # the adapters' optimizer state in the compute dtype: half the bytes
    assert bf16.bytes_by_class["optimizer"] == pytest.approx(fp32.bytes_by_class["optimizer"] / 2)
    # a full fine-tune has no adapters: the flag changes nothing
    full = _mistral(method="full")
    assert analytic_step_counts(spec, full, lora_compute_dtype=True) == analytic_step_counts(spec, full)


def test_qwen_counts_the_q_k_v_biases_and_the_large_vocabulary_head() -> None:
    spec = resolve_model("qwen-1_8b")
    arch = arch_of(spec)
    assert arch.lm_head_params == 151936 * 2048
    counts = analytic_step_counts(spec, FineTuneJob(model="qwen-1_8b", method="full", batch_size=1, seq_len=256))
    # head: forward 2 + grad-input 2 + grad-weight 2 FLOPs per parameter per token (not recomputed)
    assert counts.flops_by_class["lm_head"] == pytest.approx(6 * 151936 * 2048 * 256)


def test_accumulated_step_repeats_the_micro_batch_and_steps_the_optimizer_once() -> None:
    spec = resolve_model("mistral-7b-v0.1")
    micro = analytic_step_counts(spec, _mistral(method="lora", lora=LoraConfig(rank=8, targets=("attention",))))
    step = accumulated(micro, 8)
    for cls, flops in micro.flops_by_class.items():
        times = 1 if cls == "optimizer" else 8
        assert step.flops_by_class[cls] == pytest.approx(times * flops)
        assert step.bytes_by_class[cls] == pytest.approx(times * micro.bytes_by_class[cls])
        assert step.kernels_by_class[cls] == pytest.approx(times * micro.kernels_by_class[cls])
    assert step.tokens_per_step == 8 * micro.tokens_per_step and step.batch_size == 8 * micro.batch_size
    assert step.gemm_rows_by_class == micro.gemm_rows_by_class  # each GEMM is still one micro-batch's
    assert accumulated(micro, 1).flops_by_class == micro.flops_by_class


def test_accumulated_step_time_is_micro_steps_plus_one_optimizer_step(gpu_terms) -> None:
    spec = resolve_model("mistral-7b-v0.1")
    micro = analytic_step_counts(spec, _mistral(method="full"))
    params = StackParams(
        gemm_efficiency=0.7, gemm_half_rows=64, memory_efficiency=0.75, kernel_overhead_s=2e-5, step_overhead_s=0.05
    )
    one, four = step_time(micro, gpu_terms(), params), step_time(accumulated(micro, 4), gpu_terms(), params)
    # a dense model: the host syncs per micro-step, so the optimizer step is a segment of its own, its launches
    # overlapping its GPU work (test_overlap.py)
    assert micro.host_sync == SYNC_PER_MICRO_STEP
    optimizer_s = overlapped_s(one.class_s["optimizer"], 2e-5 * micro.kernels_by_class["optimizer"])
    expected = 4 * (one.step_s - one.step_overhead_s - optimizer_s) + optimizer_s + one.step_overhead_s
    assert four.step_s == pytest.approx(expected, rel=1e-9)


def test_transformer_engine_layers_fuse_the_element_wise_work() -> None:
    """Megatron Core's TE layers (`te_layers`): per token and layer, each RMSNorm moves 4 bytes per hidden element
    instead of 34, rotary 4 bytes per q/k element instead of 20, no unpad/pad copies (16 per hidden element); the
    residual adds and everything else stay. Forward, recompute and backward (2x) passes as for the eager layers."""
    from tunecost.estimate.throughput.mixers import BWD_BYTES_PER_FWD_BYTE

    spec = resolve_model("meta-llama/Llama-3.1-8B")
    job = FineTuneJob(model=spec.name, method="lora", batch_size=2, seq_len=2048, gradient_checkpointing=True)
    eager, te = (analytic_step_counts(spec, job, te_layers=t) for t in (False, True))
    arch = arch_of(spec)
    width = arch.num_heads * arch.head_dim
    per_token_layer = (arch.num_layer_norms * (34 - 4) + 16) * arch.hidden + (20 - 4) * 2 * width
    passes = 2.0 + BWD_BYTES_PER_FWD_BYTE
    expected = passes * arch.num_attention_layers * 2 * 2048 * per_token_layer
    assert eager.bytes_by_class["elementwise"] - te.bytes_by_class["elementwise"] == pytest.approx(expected, rel=1e-12)
    assert {c: v for c, v in te.flops_by_class.items()} == {c: v for c, v in eager.flops_by_class.items()}
    assert te.kernels_by_class["elementwise"] < eager.kernels_by_class["elementwise"]


def test_torch_compile_fuses_the_layers_element_wise_work_and_nothing_else(gpu_terms) -> None:
    """Under torch.compile (`job.torch_compile`) Inductor fuses each norm, rotary and residual chain into one
    kernel: the layers' element-wise counts are the fused layers' (`te_layers`); the GEMMs, attention, loss,
    LoRA and optimizer counts are eager's."""
    spec = resolve_model("meta-llama/Llama-3.1-8B")
    job = FineTuneJob(model=spec.name, method="lora", batch_size=2, seq_len=2048, gradient_checkpointing=True)
    eager, fused = analytic_step_counts(spec, job), analytic_step_counts(spec, job, te_layers=True)
    compiled = analytic_step_counts(spec, job.with_(torch_compile=True))
    assert compiled.bytes_by_class == fused.bytes_by_class and compiled.kernels_by_class == fused.kernels_by_class
    assert compiled.flops_by_class == eager.flops_by_class
    changed = {c for c in eager.bytes_by_class if compiled.bytes_by_class[c] != eager.bytes_by_class[c]}
    assert changed == {"elementwise"}
    assert compiled.bytes_by_class["elementwise"] < eager.bytes_by_class["elementwise"]
    params = StackParams(
        gemm_efficiency=0.9, gemm_half_rows=64, memory_efficiency=0.75, kernel_overhead_s=2e-5, step_overhead_s=0.05
    )
    assert step_time(compiled, gpu_terms(), params).step_s < step_time(eager, gpu_terms(), params).step_s


def test_liger_fuses_norm_and_rotary_and_chunks_the_head(gpu_terms) -> None:
    """Liger (`job.liger_kernel`): each RMSNorm and rotary one kernel (residual adds and the varlen copies stay),
    the loss one kernel per logits chunk reading and writing them once, the head's GEMMs per chunk with the weight
    re-read; the FLOPs are eager's."""
    spec = resolve_model("meta-llama/Llama-3.1-8B")
    job = FineTuneJob(model=spec.name, method="lora", batch_size=2, seq_len=2048, gradient_checkpointing=True)
    eager, liger = analytic_step_counts(spec, job), analytic_step_counts(spec, job.with_(liger_kernel=True))
    assert liger.flops_by_class == eager.flops_by_class
    tokens, vocab = 2 * 2048, spec.vocab_size
    chunks = tokens // 128  # ceil(128256 / 4096) = 32 chunks of next_power_of_2(4096 / 32) = 128 rows
    assert liger.gemm_rows_by_class["lm_head"] == 128 and eager.gemm_rows_by_class["lm_head"] == tokens
    assert liger.kernels_by_class["lm_head"] == chunks * eager.kernels_by_class["lm_head"]
    head_weight_bytes = 2.0 * vocab * spec.config["hidden_size"] * 2  # two passes (LoRA: frozen head), bf16
    extra_reads = (chunks - 1) * head_weight_bytes
    assert liger.bytes_by_class["lm_head"] - eager.bytes_by_class["lm_head"] == pytest.approx(extra_reads)
    assert liger.bytes_by_class["elementwise"] < eager.bytes_by_class["elementwise"]
    compiled = analytic_step_counts(spec, job.with_(torch_compile=True, liger_kernel=True))
    fused = analytic_step_counts(spec, job.with_(torch_compile=True))
    # under torch.compile the layers' chains are Inductor's either way; only the loss differs
    loss_kernels = chunks * FLCE_KERNELS_PER_CHUNK - LOSS_KERNELS
    assert compiled.kernels_by_class["elementwise"] - fused.kernels_by_class["elementwise"] == loss_kernels
    loss_bytes = tokens * vocab * (FLCE_BYTES_PER_VOCAB - LOSS_BYTES_PER_VOCAB)
    assert compiled.bytes_by_class["elementwise"] - fused.bytes_by_class["elementwise"] == pytest.approx(loss_bytes)


def test_modules_saved_beside_lora_train_the_head_and_the_embedding_by_hand() -> None:
    """PEFT's modules_to_save: the head's weight gradient (one more pass of 2 x tokens x H x V), the embedding's
    gradient (zero-fill and scatter of a V x H buffer) and AdamW with clipping over both copies in bf16."""
    from tunecost.estimate.throughput.counts import (
        ADAMW_ACCESSES_PER_PARAM,
        ADAMW_FLOPS_PER_PARAM,
        CLIP_ACCESSES_PER_PARAM,
    )

    spec, tokens = resolve_model("mistral-7b-v0.1"), 2 * 4096
    plain = analytic_step_counts(spec, _mistral(method="lora"))
    saved = analytic_step_counts(spec, _mistral(method="lora", modules_to_save=("embed_tokens", "lm_head")))
    head_only = analytic_step_counts(spec, _mistral(method="lora", modules_to_save=("lm_head",)))
    extra = {c: saved.flops_by_class[c] - plain.flops_by_class[c] for c in saved.flops_by_class}
    assert extra["lm_head"] == pytest.approx(2 * tokens * MISTRAL_HEAD)
    assert extra["optimizer"] == pytest.approx(2 * MISTRAL_HEAD * ADAMW_FLOPS_PER_PARAM)  # embedding = head size
    moved = saved.bytes_by_class["optimizer"] - plain.bytes_by_class["optimizer"]
    assert moved == pytest.approx(2 * MISTRAL_HEAD * 2 * (ADAMW_ACCESSES_PER_PARAM + CLIP_ACCESSES_PER_PARAM))
    embedding = saved.bytes_by_class["elementwise"] - head_only.bytes_by_class["elementwise"]
    assert embedding == pytest.approx(2 * VOCAB * H * 2)
