"""Named ranges around the MoE layer's parts, visible to Nsight Compute (NVTX) and to torch.profiler.

Sources and derivations: docs/profiling.md, section `tunecost.profile.nvtx`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from tunecost.moe.ranges import (  # noqa: F401  (re-exported: callers label with nvtx.ROUTER etc.)
    ACTIVATION,
    ALL_RANGES,
    DEQUANT,
    EXPERTS,
    LORA,
    MOE_BLOCK,
    MOE_RANGES,
    NCU_NVTX_EXCLUDE,
    NCU_NVTX_INCLUDE,
    RANGE_PREFIX,
    RECOMPUTE,
    ROUTER,
    W1,
    W1W3,
    W2,
    W3,
    check_range_name,
    innermost_range,
    is_moe_work,
)

if TYPE_CHECKING:
    import torch


@functools.lru_cache(maxsize=1)
def _nvtx_enabled() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _nvtx_push(name: str) -> None:
    if _nvtx_enabled():
        import torch

        torch.cuda.nvtx.range_push(name)


def _nvtx_pop() -> None:
    if _nvtx_enabled():
        import torch

        torch.cuda.nvtx.range_pop()


@contextlib.contextmanager
def moe_range(name: str) -> Iterator[None]:
    """Label the work inside: an NVTX push/pop range (CUDA only) plus a torch.profiler `record_function`.

    Forward only: use `call_in_range` (or `instrument_moe_block`) to label the backward of the computation too.
    """
    from torch.autograd.profiler import record_function

    _nvtx_push(name)
    try:
        with record_function(name):
            yield
    finally:
        _nvtx_pop()


class _Span:
    """A range opened on one autograd callback and closed on a later one (same autograd thread)."""

    __slots__ = ("_rf", "is_open", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._rf: Any = None
        self.is_open = False

    def open(self) -> None:
        if self.is_open:
            return
        from torch.autograd.profiler import record_function

        _nvtx_push(self.name)
        self._rf = record_function(self.name)
        self._rf.__enter__()
        self.is_open = True

    def close(self) -> None:
        if not self.is_open:
            return
        self._rf.__exit__(None, None, None)
        self._rf = None
        _nvtx_pop()
        self.is_open = False


@functools.lru_cache(maxsize=1)
def _marker_functions() -> tuple[type, type]:
    import torch

    class OpenOnBackward(torch.autograd.Function):
        """Identity on a computation's outputs: their gradients arriving = its backward starts."""

        @staticmethod
        def forward(ctx, span, *tensors):
            ctx.span = span
            ctx.set_materialize_grads(False)  # no zero tensors (and no fill kernels) for unused outputs
            return tuple(t.view_as(t) for t in tensors)

        @staticmethod
        def backward(ctx, *grads):
            ctx.span.open()
            return (None, *grads)

    class CloseOnBackward(torch.autograd.Function):
        """Identity on a computation's inputs: their gradients computed = its backward is done."""

        @staticmethod
        def forward(ctx, span, *tensors):
            ctx.span = span
            ctx.set_materialize_grads(False)
            return tuple(t.view_as(t) for t in tensors)

        @staticmethod
        def backward(ctx, *grads):
            ctx.span.close()
            return (None, *grads)

    return OpenOnBackward, CloseOnBackward


def _needs_grad(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.Tensor) and obj.requires_grad and obj.is_floating_point()


def _apply_marker(function: type[torch.autograd.Function], span: _Span, values: Sequence[Any]) -> list[Any]:
    """Route the grad-requiring tensors among `values` through `function`; other values pass unchanged."""
    values = list(values)
    positions = [i for i, v in enumerate(values) if _needs_grad(v)]
    if positions:
        marked = function.apply(span, *(values[i] for i in positions))
        for i, tensor in zip(positions, marked):
            values[i] = tensor
    return values


def _map_outputs(output: Any, span: _Span) -> Any:
    """Mark an output that is a tensor or a plain tuple/list of values (top level only)."""
    open_fn, _ = _marker_functions()
    if type(output) in (tuple, list):
        return type(output)(_apply_marker(open_fn, span, output))
    return _apply_marker(open_fn, span, [output])[0]


def _outputs_need_grad(output: Any) -> bool:
    if type(output) in (tuple, list):
        return any(_needs_grad(v) for v in output)
    return _needs_grad(output)


def call_in_range(name: str, fn: Callable[..., Any], *args: Any, backward: bool = True, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` inside `moe_range(name)`, with its backward labelled by the same range.

    Tensor arguments that require grad (positional and keyword, top level) get the closing marker; the tensor
    output(s) get the opening marker. The markers are identity views: do not modify the output in place.
    This is the hook for tunecost's own expert implementations, e.g.
    `h = call_in_range(W1, torch.nn.functional.linear, x, w1)`.
    """
    import torch

    span = _Span(name)
    keys = list(kwargs)
    values = [*args, *(kwargs[k] for k in keys)]
    # Mark only when an input requires grad: the closing marker must exist for the opening one to be balanced.
    track = backward and torch.is_grad_enabled() and any(_needs_grad(v) for v in values)
    if track:
        _, close_fn = _marker_functions()
        marked = _apply_marker(close_fn, span, values)
        args, kwargs = tuple(marked[: len(args)]), dict(zip(keys, marked[len(args) :]))
    with moe_range(name):
        output = fn(*args, **kwargs)
    if track and _outputs_need_grad(output):
        output = _map_outputs(output, span)
    return output
