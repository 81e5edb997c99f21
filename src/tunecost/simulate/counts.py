"""FLOPs and bytes moved per op, bucketed by op class, for the step simulator.

Sources and derivations: docs/memory-model.md, section `tunecost.simulate.counts`.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils import flop_counter as _fc

from tunecost.workload.op_classes import OP_CLASSES  # noqa: F401  (re-exported: one taxonomy)

aten = torch.ops.aten


def _register_missing_formulas() -> None:
    reg = _fc.flop_registry

    if aten._grouped_mm not in reg:

        @_fc.register_flop_formula(aten._grouped_mm)
        def _grouped_mm_flop(
            a_shape, b_shape, offs_shape=None, bias_shape=None, out_dtype=None, *args, out_shape=None, **kwargs
        ) -> int:
            if len(a_shape) == 2 and len(b_shape) == 2:  # (M, K_total) x (K_total, N): K jagged
                return 2 * a_shape[0] * a_shape[1] * b_shape[1]
            out_numel = 1
            for d in out_shape:
                out_numel *= d
            return 2 * out_numel * a_shape[-1]

    if aten._int_mm not in reg:  # LLM.int8's GEMM (tunecost.simulate.int8)

        @_fc.register_flop_formula(aten._int_mm)
        def _int_mm_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
            return 2 * a_shape[0] * a_shape[1] * b_shape[1]

    cpu_fwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_fwd is not None and cpu_fwd not in reg:

        @_fc.register_flop_formula(cpu_fwd)
        def _cpu_flash_fwd(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
            return _fc.sdpa_flop_count(q_shape, k_shape, v_shape)

    cpu_bwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if cpu_bwd is not None and cpu_bwd not in reg:

        @_fc.register_flop_formula(cpu_bwd)
        def _cpu_flash_bwd(grad_out_shape, q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
            return _fc.sdpa_backward_flop_count(grad_out_shape, q_shape, k_shape, v_shape)


_register_missing_formulas()

_ATTENTION_OPS = {
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_efficient_attention_backward,
    aten._flash_attention_forward,
    aten._flash_attention_backward,
}
_MATMUL_OPS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten._grouped_mm, aten._int_mm}
_EMBEDDING_OPS = {aten.embedding, aten.embedding_dense_backward}
_REDUCTION_FLOP_OPS = {
    aten._softmax,
    aten._log_softmax,
    aten.sum,
    aten.mean,
    aten.nll_loss_forward,
    aten._softmax_backward_data,
    aten._log_softmax_backward_data,
    aten.topk,
}
_NO_TRAFFIC_OPS = {
    aten.empty,
    aten.empty_like,
    aten.empty_strided,
    aten.new_empty,
    aten.new_empty_strided,
    aten.detach,
    aten.lift_fresh,
    aten.alias,
}
_GROUP_MATMUL_CLASS = {
    "experts": "expert_matmul",
    "shared_experts": "expert_matmul",
    "attention": "attention",
    "router": "router",
    "lm_head/loss": "lm_head",
    "mlp": "dense_matmul",
    "mamba": "dense_matmul",
}


def op_flops(func, args, kwargs, out) -> int:
    """Matmul-class FLOPs of one op from the registry (0 when the op has no formula)."""
    formula = _fc.flop_registry.get(func._overloadpacket)
    if formula is None:
        return 0
    return int(formula(*args, **kwargs, out_val=out))


def elementwise_flops(func, args, out_tensors: list[torch.Tensor]) -> int:
    """One FLOP per output element for pointwise ops, per input element for softmax-like reductions."""
    packet = func._overloadpacket
    if packet in _REDUCTION_FLOP_OPS:
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        return first.numel() if first is not None else 0
    if torch.Tag.pointwise in func.tags or packet in {aten.add_, aten.mul_, aten.addcmul_, aten.addcdiv_}:
        return sum(t.numel() for t in out_tensors)
    if str(packet).startswith("aten._foreach_"):
        return sum(t.numel() for t in out_tensors)
    return 0


def may_count_elementwise(func) -> bool:
    packet = func._overloadpacket
    return (
        packet in _REDUCTION_FLOP_OPS
        or torch.Tag.pointwise in func.tags
        or packet in {aten.add_, aten.mul_, aten.addcmul_, aten.addcdiv_}
        or str(packet).startswith("aten._foreach_")
    )


def moves_bytes(func) -> bool:
    return not (func.is_view or func._overloadpacket in _NO_TRAFFIC_OPS)


def classify_op(func, group: str, phase: str, override: str | None) -> str:
    """The op class an op's FLOPs and bytes count under."""
    if phase == "optimizer":
        return "optimizer"
    name = func.name()
    if name.startswith("tunecost::dequantize"):
        return "dequant"
    if override is not None:
        return override
    packet = func._overloadpacket
    if packet in _ATTENTION_OPS:
        return "attention"
    if packet in _EMBEDDING_OPS:
        return "embedding"
    if packet in _MATMUL_OPS:
        return _GROUP_MATMUL_CLASS.get(group, "dense_matmul")
    return "elementwise"


_OVERRIDES: list[str] = []
LISTENERS: list = []  # callables run at every scope boundary (the recorder marks autograd sequence numbers)


class op_class_scope:
    """Count the ops run inside this scope, and the backward of the autograd nodes they create, under `name`
    (e.g. "lora"), unless they are de-quantization."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        _OVERRIDES.append(self.name)
        for listener in LISTENERS:
            listener()

    def __exit__(self, *exc) -> None:
        _OVERRIDES.pop()
        for listener in LISTENERS:
            listener()


WORK_LISTENERS: list = []  # callables(op_class, flops, nbytes): work done without dispatching ops


NOT_AFFINE_LISTENERS: list = []  # callables(): a size of this step is not affine in the batch size


def note_not_affine() -> None:
    """Tell the running recorder (if any) that a size of this step is not affine in the batch size (an uneven
    split of tokens, a power-of-two chunk), so no step is read off a line through it (`batch_line`)."""
    for listener in NOT_AFFINE_LISTENERS:
        listener()


LOOP_LISTENERS: list = []  # callables(count, tensor) -> the indices of a loop the running recorder runs


def like_iterations(count: int, tensor: torch.Tensor) -> Iterator[int]:
    """0..count-1, the iterations of a loop that runs the same ops on the same sizes (the last may be smaller) over
    `tensor`: the running recorder (if any) may run some and repeat their record for the rest (`loops`)."""
    return LOOP_LISTENERS[-1](count, tensor) if LOOP_LISTENERS else iter(range(count))


BACKWARD_LOOP_LISTENERS: list = []  # callables(i, count, output): an iteration of a loop autograd walks back


def like_backward(i: int, count: int, output: torch.Tensor) -> None:
    """Iteration `i` of a `like_iterations` loop left `output`, whose gradient starts that iteration's backward
    (autograd walks the iterations back one by one): the running recorder (if any) writes the backward of the
    iterations it did not run (`loops`)."""
    if BACKWARD_LOOP_LISTENERS:
        BACKWARD_LOOP_LISTENERS[-1](i, count, output)


def add_work(op_class: str, *, flops: int = 0, nbytes: int = 0) -> None:
    """Count FLOPs and bytes of traffic under `op_class` in the running recorder (if any): for work the fake
    path models without running it op by op (fused kernels, the other experts of a de-quantization loop)."""
    for listener in WORK_LISTENERS:
        listener(op_class, flops, nbytes)


def current_override() -> str | None:
    return _OVERRIDES[-1] if _OVERRIDES else None
