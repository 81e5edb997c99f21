"""Kernel / CPU-op classification into the MoE kernel classes (paper Figs. 6, 9, 10)."""

from __future__ import annotations

import pytest

from tunecost.profile import kernels as K
from tunecost.profile import nvtx as N
from tunecost.profile.kernels import classify_cpu_op, classify_kernel, cpu_op_kind, kernel_kind

GEMM_CUTLASS = "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(T1::Params)"
GEMM_SM90 = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
GEMM_AMPERE = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn"
GEMM_NVJET = "nvjet_tst_64x8_64x16_4x1_v_bz_TNT"
GEMV_4BIT = "void kgemm_4bit_inference_naive<__nv_bfloat16, 128, 16>(int, int, int, T1 *, unsigned char *, ...)"
DEQUANT = "void kDequantizeBlockwise<__nv_bfloat16, 512, 64, 8, 2>(float *, unsigned char *, float *, T1 *, int, int)"
SOFTMAX = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, Epilogue>(T4 *, int)"
TOPK = "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<T1, T2>, T2)"
RADIX = "void at::native::radixSortKVInPlace<-2, -1, 32, 4, float, long, unsigned int>(...)"
BITONIC = "void at::native::bitonicSortKVInPlace<-2, -1, 16, 16, float, long, at::native::GTOp<float, true>>(...)"
SILU = "void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel(at::TensorIteratorBase &)::...>(int)"
COPY = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(...)>(int, T1, char *)"
REDUCE = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::sum_functor<...>>>(T3)"

MOE, EXPERTS = N.MOE_BLOCK, N.EXPERTS


def test_kernel_kinds_from_names():
    for name in (GEMM_CUTLASS, GEMM_SM90, GEMM_AMPERE, GEMM_NVJET, GEMV_4BIT, "cublasLt::splitKreduce_kernel<...>"):
        assert kernel_kind(name) == "matmul", name
    assert kernel_kind(DEQUANT) == "dequant"
    assert kernel_kind(SOFTMAX) == "softmax"
    for name in (TOPK, RADIX, BITONIC):
        assert kernel_kind(name) == "topk", name
    for name in (SILU, COPY, "void at::native::index_elementwise_kernel<128, 4, ...>(long, T3)"):
        assert kernel_kind(name) == "eltwise", name
    assert kernel_kind(REDUCE) == "?"


@pytest.mark.parametrize(
    ("name", "ranges", "expected"),
    [
        # a matmul is attributed to a weight only by its range
        (GEMM_SM90, (MOE, EXPERTS, N.W1), K.MATMUL_W1_GATE),
        (GEMM_SM90, (MOE, EXPERTS, N.W3), K.MATMUL_W3_UP),
        (GEMM_CUTLASS, (MOE, EXPERTS, N.W2), K.MATMUL_W2_DOWN),
        (GEMM_CUTLASS, (MOE, EXPERTS, N.W1W3), K.MATMUL_W1W3_GATE_UP),
        (GEMM_NVJET, (MOE, N.ROUTER), K.ROUTER),
        (GEMM_AMPERE, (MOE, EXPERTS), K.MATMUL_EXPERTS),
        (GEMM_AMPERE, (MOE,), K.OTHER),
        (GEMM_AMPERE, (), K.OTHER),
        # innermost range wins: LoRA inside W2, dequant inside W1, recompute inside a MoE backward range
        (GEMM_CUTLASS, (MOE, EXPERTS, N.W2, N.LORA), K.LORA),
        (GEMM_CUTLASS, (MOE, N.ROUTER, N.LORA), K.LORA),
        (DEQUANT, (MOE, EXPERTS, N.W1, N.DEQUANT), K.DEQUANTIZE),
        (COPY, (MOE, EXPERTS, N.W1, N.DEQUANT), K.DEQUANTIZE),
        (GEMM_CUTLASS, (MOE, EXPERTS, N.RECOMPUTE), K.OTHER),
        # kernel kinds that are classes of their own, wherever they run
        (DEQUANT, (MOE, EXPERTS), K.DEQUANTIZE),
        (DEQUANT, (), K.DEQUANTIZE),
        (SOFTMAX, (MOE, N.ROUTER), K.SOFTMAX),
        (TOPK, (MOE, N.ROUTER), K.TOPK),
        (RADIX, (MOE, EXPERTS), K.TOPK),
        (SILU, (MOE, EXPERTS), K.ELEMENTWISE),
        (SILU, (MOE, EXPERTS, N.W1), K.ELEMENTWISE),
        # unknown kinds take the range's meaning: helper kernels of a matmul, router bookkeeping
        (REDUCE, (MOE, EXPERTS, N.W2), K.MATMUL_W2_DOWN),
        (REDUCE, (MOE, N.ROUTER), K.ROUTER),
        (REDUCE, (MOE, EXPERTS), K.OTHER),
        (REDUCE, (), K.OTHER),
        # other tools' ranges (outer or inner) are ignored
        (GEMM_SM90, ("ProfilerStep#3", MOE, EXPERTS, N.W1, "cublas"), K.MATMUL_W1_GATE),
    ],
)
def test_classify_kernel(name, ranges, expected):
    assert classify_kernel(name, ranges) == expected
    assert expected in K.KERNEL_CLASSES


def test_kernel_renamed_to_its_range():
    # ncu --print-nvtx-rename kernel: the kernel name is the range; only the range is known
    assert classify_kernel(N.W2) == K.MATMUL_W2_DOWN
    assert classify_kernel(N.W1W3, (MOE, EXPERTS)) == K.MATMUL_W1W3_GATE_UP
    assert classify_kernel(N.DEQUANT) == K.DEQUANTIZE
    assert classify_kernel(N.ROUTER) == K.ROUTER
    assert classify_kernel(N.EXPERTS) == K.MATMUL_EXPERTS


@pytest.mark.parametrize(
    ("op", "kind"),
    [
        ("aten::mm", "matmul"),
        ("aten::addmm", "matmul"),
        ("aten::bmm", "matmul"),
        ("aten::linear", "matmul"),
        ("aten::_grouped_mm", "matmul"),
        ("transformers::grouped_mm_fallback", "matmul"),
        ("bitsandbytes::gemv_4bit", "matmul"),
        ("autograd::engine::evaluate_function: MmBackward0", "matmul"),
        ("autograd::engine::evaluate_function: GroupedMmBackward0", "matmul"),
        ("bitsandbytes::dequantize_4bit", "dequant"),
        ("bitsandbytes::dequantize_blockwise", "dequant"),
        ("aten::softmax", "softmax"),
        ("aten::_softmax_backward_data", "softmax"),
        ("autograd::engine::evaluate_function: SoftmaxBackward0", "softmax"),
        ("aten::topk", "topk"),
        ("aten::sort", "topk"),
        ("aten::value_selecting_reduction_backward", "topk"),
        ("aten::silu", "eltwise"),
        ("aten::silu_backward", "eltwise"),
        ("aten::mul", "eltwise"),
        ("aten::copy_", "eltwise"),
        ("aten::index_add_", "eltwise"),
        ("autograd::engine::evaluate_function: SiluBackward0", "eltwise"),
        ("aten::sum", "?"),
        ("aten::histc", "?"),
        ("aten::view", "?"),
        ("ProfilerStep#1", "?"),
    ],
)
def test_cpu_op_kinds(op, kind):
    assert cpu_op_kind(op) == kind


def test_classify_cpu_op_uses_record_function_stack():
    assert classify_cpu_op("aten::mm", (MOE, EXPERTS, N.W1W3)) == K.MATMUL_W1W3_GATE_UP
    assert classify_cpu_op("aten::mm", (MOE, EXPERTS, N.W2)) == K.MATMUL_W2_DOWN
    assert classify_cpu_op("aten::mm", (MOE, N.ROUTER)) == K.ROUTER
    assert classify_cpu_op("aten::_softmax", (MOE, N.ROUTER)) == K.SOFTMAX
    assert classify_cpu_op("aten::topk", (MOE, N.ROUTER)) == K.TOPK
    assert classify_cpu_op("bitsandbytes::dequantize_4bit", (MOE, EXPERTS, N.W1)) == K.DEQUANTIZE
    assert classify_cpu_op("aten::mm", (MOE, EXPERTS, N.W3, N.LORA)) == K.LORA
    assert classify_cpu_op("aten::silu", (MOE, EXPERTS)) == K.ELEMENTWISE
    assert classify_cpu_op("aten::mm", ()) == K.OTHER
    assert classify_cpu_op("aten::mm", (MOE, EXPERTS, N.RECOMPUTE)) == K.OTHER


def test_moe_work_and_range_names():
    assert N.is_moe_work((MOE, EXPERTS, N.W1))
    assert N.is_moe_work(("outer", MOE))
    assert not N.is_moe_work(())
    assert not N.is_moe_work((MOE, EXPERTS, N.RECOMPUTE))
    assert N.is_moe_work((MOE, EXPERTS, N.RECOMPUTE, MOE, N.ROUTER))  # a MoE block recomputed in backward
    # every range name is one ncu's --nvtx-include syntax can name (no "/", "@", "]"; CSV splits on ":")
    for name in N.ALL_RANGES:
        assert N.check_range_name(name) == name
    assert N.NCU_NVTX_INCLUDE == "tunecost.moe/"
