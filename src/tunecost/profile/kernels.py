"""The kernel classes of the MoE layer (paper Figs. 6, 9, 10) and how a kernel or CPU op is put in one.

Sources and derivations: docs/profiling.md, section `tunecost.profile.kernels`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tunecost.moe.ranges import innermost_range, is_moe_work  # noqa: F401  (re-exported for callers)
from tunecost.profile import nvtx

MATMUL_W1_GATE = "matmul_w1_gate"
MATMUL_W3_UP = "matmul_w3_up"
MATMUL_W2_DOWN = "matmul_w2_down"
MATMUL_W1W3_GATE_UP = "matmul_w1w3_gate_up"
MATMUL_EXPERTS = "matmul_experts"
LORA = "lora"
DEQUANTIZE = "dequantize"
SOFTMAX = "softmax"
TOPK = "topk"
ROUTER = "router"
ELEMENTWISE = "elementwise"
OTHER = "other"

KERNEL_CLASSES: tuple[str, ...] = (
    MATMUL_W1_GATE,
    MATMUL_W3_UP,
    MATMUL_W1W3_GATE_UP,
    MATMUL_W2_DOWN,
    MATMUL_EXPERTS,
    LORA,
    DEQUANTIZE,
    SOFTMAX,
    TOPK,
    ROUTER,
    ELEMENTWISE,
    OTHER,
)

# Kinds of work, from a kernel or op name (before the range says whose work it is).
_MATMUL, _DEQUANT, _SOFTMAX, _TOPK, _ELEMENTWISE, _UNKNOWN = "matmul", "dequant", "softmax", "topk", "eltwise", "?"

# Ranges of one projection: every kernel in them is that projection's work (a matmul's helper kernels included).
_PROJECTION_BY_RANGE = {
    nvtx.W1: MATMUL_W1_GATE,
    nvtx.W3: MATMUL_W3_UP,
    nvtx.W2: MATMUL_W2_DOWN,
    nvtx.W1W3: MATMUL_W1W3_GATE_UP,
    nvtx.LORA: LORA,
    nvtx.ROUTER: ROUTER,
}
# What a matmul inside each range is.
_MATMUL_BY_RANGE = {**_PROJECTION_BY_RANGE, nvtx.EXPERTS: MATMUL_EXPERTS}
# What a kernel of no recognised kind is inside each range (helper kernels of a matmul, router bookkeeping).
_UNKNOWN_BY_RANGE = {**_PROJECTION_BY_RANGE, nvtx.DEQUANT: DEQUANTIZE, nvtx.ACTIVATION: ELEMENTWISE}
_KIND_CLASS = {_SOFTMAX: SOFTMAX, _TOPK: TOPK, _ELEMENTWISE: ELEMENTWISE, _DEQUANT: DEQUANTIZE}

# GPU kernel names (lower-cased). Order matters: de-quantization before matmul (bnb's fused 4-bit GEMV
# "kgemm_4bit_inference" is a matmul, "kDequantizeBlockwise" is not), softmax before element-wise.
_KERNEL_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (_DEQUANT, re.compile(r"dequant")),
    (_MATMUL, re.compile(r"gemm|gemv|cutlass|xmma|nvjet|cublas|splitkreduce|grouped_mm")),
    (_SOFTMAX, re.compile(r"softmax")),
    (_TOPK, re.compile(r"topk|radix|bitonic|sort")),
    (
        _ELEMENTWISE,
        re.compile(
            r"elementwise|silu|gelu|sigmoid|relu|swiglu|copy_kernel|fill_kernel|index_add|"
            r"scatter|gather|indexselect|index_select|cat_array|catarray"
        ),
    ),
)

# CPU op names (torch.profiler): aten / library ops, lower-cased without the "aten::" style namespace.
_CPU_MATMUL = {
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "matmul",
    "linear",
    "_grouped_mm",
    "grouped_mm",
    "addmv",
    "mv",
    "dot",
    "einsum",
    "_addmm_activation",
    "grouped_mm_fallback",
    "grouped_mm_fallback_backward",
    "gemv_4bit",
    "gemm_4bit",
    "int8_linear_matmul",
    "int8_mm_dequant",
    "linearbackward",
    "groupedmm",
    "addbmm",
}
_CPU_SOFTMAX = {
    "softmax",
    "_softmax",
    "_softmax_backward_data",
    "log_softmax",
    "_log_softmax",
    "_log_softmax_backward_data",
    "logsoftmax",
    "special_softmax",
}
_CPU_TOPK = {"topk", "sort", "argsort", "msort", "value_selecting_reduction_backward", "kthvalue"}
_CPU_ELEMENTWISE = {
    "silu",
    "silu_",
    "silu_backward",
    "gelu",
    "gelu_backward",
    "sigmoid",
    "sigmoid_backward",
    "relu",
    "threshold_backward",
    "mul",
    "mul_",
    "add",
    "add_",
    "sub",
    "sub_",
    "div",
    "div_",
    "neg",
    "pow",
    "rsqrt",
    "sqrt",
    "exp",
    "log",
    "reciprocal",
    "copy_",
    "_to_copy",
    "to",
    "clone",
    "contiguous",
    "fill_",
    "zero_",
    "zeros_like",
    "ones_like",
    "where",
    "masked_fill",
    "masked_fill_",
    "index",
    "index_select",
    "index_add",
    "index_add_",
    "index_put",
    "index_put_",
    "_index_put_impl_",
    "scatter",
    "scatter_",
    "scatter_add",
    "scatter_add_",
    "gather",
    "cat",
    "stack",
    "tanh",
    "clamp",
    "clamp_",
    "type_as",
    "mul_backward",
    "addcmul_",
    "addcdiv_",
    "lerp_",
    "_foreach_mul_",
    "_foreach_add_",
    "_foreach_addcmul_",
    "_foreach_addcdiv_",
    "_foreach_lerp_",
    "_foreach_sqrt",
    "_foreach_div_",
    "index_backward",
    "embedding_dense_backward",
}
_BACKWARD_NODE = re.compile(r"^autograd::engine::evaluate_function:\s*")
_BACKWARD_SUFFIX = re.compile(r"Backward\d*$")


def kernel_kind(kernel_name: str) -> str:
    """What kind of work a GPU kernel name says it does: matmul, dequant, softmax, topk, eltwise or '?'."""
    lowered = kernel_name.lower()
    for kind, pattern in _KERNEL_PATTERNS:
        if pattern.search(lowered):
            return kind
    return _UNKNOWN


def _class_of(kind: str, innermost: str | None) -> str:
    if innermost == nvtx.DEQUANT or kind == _DEQUANT:
        return DEQUANTIZE
    if kind == _MATMUL:
        return _MATMUL_BY_RANGE.get(innermost, OTHER) if innermost else OTHER
    if kind in _KIND_CLASS:
        return _KIND_CLASS[kind]
    return _UNKNOWN_BY_RANGE.get(innermost, OTHER) if innermost else OTHER


def classify_kernel(kernel_name: str, nvtx_ranges: Sequence[str] = ()) -> str:
    """The class (one of `KERNEL_CLASSES`) of a GPU kernel launched inside `nvtx_ranges` (outer to inner).

    A kernel renamed to its range (ncu `--print-nvtx-rename kernel`) is classified by that range alone.
    """
    ranges = tuple(nvtx_ranges)
    if kernel_name in nvtx.ALL_RANGES:  # renamed: the range is all we know
        innermost = innermost_range((*ranges, kernel_name))
        return _class_of(_MATMUL if innermost in _MATMUL_BY_RANGE else _UNKNOWN, innermost)
    return _class_of(kernel_kind(kernel_name), innermost_range(ranges))


def cpu_op_kind(op_name: str) -> str:
    """What kind of work a torch.profiler CPU op name says it does (aten ops, backward nodes, library ops)."""
    name = op_name.strip()
    if _BACKWARD_NODE.match(name):
        # "autograd::engine::evaluate_function: MmBackward0" -> "mm"; the node's children carry the real ops.
        name = _BACKWARD_SUFFIX.sub("", _BACKWARD_NODE.sub("", name)).lower()
    else:
        name = _BACKWARD_SUFFIX.sub("", name.rsplit("::", 1)[-1]).lower()
        name = name.split(".", 1)[0]  # overload suffix, e.g. "add.Tensor"
    if "dequant" in name:
        return _DEQUANT
    if name in _CPU_MATMUL:
        return _MATMUL
    if name in _CPU_SOFTMAX:
        return _SOFTMAX
    if name in _CPU_TOPK:
        return _TOPK
    if name in _CPU_ELEMENTWISE:
        return _ELEMENTWISE
    return _UNKNOWN


def classify_cpu_op(op_name: str, record_function_stack: Sequence[str] = ()) -> str:
    """The class (one of `KERNEL_CLASSES`) of a torch.profiler CPU op inside `record_function_stack`
    (outer to inner). Use it where there are no CUDA kernels (CPU runs) with the op's self time, so nested ops
    (aten::linear > aten::matmul > aten::mm) are not counted twice."""
    return _class_of(cpu_op_kind(op_name), innermost_range(record_function_stack))
