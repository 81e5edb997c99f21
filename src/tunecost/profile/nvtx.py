"""Named ranges around the MoE layer's parts, visible to Nsight Compute (NVTX) and to torch.profiler.

One label, two tools: `moe_range(name)` pushes an NVTX push/pop range (only where CUDA is available) and a
`torch.profiler.record_function(name)`, so ncu (Figs. 9/10) and torch.profiler (Fig. 6) see the same names and
`tunecost.profile.kernels` classifies kernels by what they compute rather than by call order (the paper's artifact
counted positions to tell W1 from W2 from W3).

Range names use dots and none of ncu's NVTX-filter quantifiers `@ , [ ] / * +` (Nsight Compute CLI guide, "NVTX
Filtering": "/" separates nested push/pop ranges, "[" / "]" pin a range to the bottom / top of the stack, "@" names
a domain) nor ":", which separates the fields of ncu's CSV NVTX column. A name like "tunecost/moe/w1" would be read
by `--nvtx-include` as three nested ranges.

Backward: NVTX push/pop ranges are per CPU thread and a forward context manager does not cover the backward
kernels, which autograd launches later (on its own thread for CUDA). `call_in_range` and `instrument_moe_block`
therefore also put identity autograd functions around the labelled computation: the one on its outputs opens the
same range when their gradients arrive (backward of the computation starts) and the one on its inputs closes it
when their gradients have been computed (backward done). They are installed only when both an input and an output
require grad, so every open has its close.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tunecost.errors import TunecostError

if TYPE_CHECKING:
    import torch

RANGE_PREFIX = "tunecost."
MOE_BLOCK = "tunecost.moe"  # a whole MoE block (router + experts); the ncu filter keys on it
ROUTER = "tunecost.moe.router"  # router / gate: logits matmul, softmax, top-k, renormalisation
EXPERTS = "tunecost.moe.experts"  # all experts of the block
W1 = "tunecost.moe.w1"  # gate projection (Mixtral w1)
W3 = "tunecost.moe.w3"  # up projection (Mixtral w3)
W2 = "tunecost.moe.w2"  # down projection (Mixtral w2)
W1W3 = "tunecost.moe.w1w3"  # fused gate+up projection (transformers 5 `gate_up_proj`: W1 and W3 in one matmul)
DEQUANT = "tunecost.moe.dequant"  # de-quantization of 4-bit expert weights
LORA = "tunecost.moe.lora"  # LoRA adapter matmuls (x @ A @ B) on an expert weight or the router
ACTIVATION = "tunecost.moe.act"  # act(gate) * up between the projections (element-wise)
# A decoder layer's forward re-run inside the backward (activation checkpointing). It runs while a MoE backward
# range is open, so its non-MoE kernels (attention, norms) would otherwise look like MoE work; a kernel whose
# innermost range is this one is not MoE work (`is_moe_work`).
RECOMPUTE = "tunecost.recompute"

MOE_RANGES: tuple[str, ...] = (MOE_BLOCK, ROUTER, EXPERTS, W1, W3, W2, W1W3, DEQUANT, LORA, ACTIVATION)
ALL_RANGES: tuple[str, ...] = (*MOE_RANGES, RECOMPUTE)

# ncu NVTX filters (Nsight Compute CLI guide, "NVTX Filtering"): include kernels inside a MoE-block push/pop range
# ("A/": inside push/pop range A of the default domain, at any depth), exclude those whose innermost range is a
# checkpoint recomputation ("B]": B at the top of the stack), i.e. attention/norm work re-run in a MoE backward.
NCU_NVTX_INCLUDE = f"{MOE_BLOCK}/"
NCU_NVTX_EXCLUDE = f"{RECOMPUTE}]"

_BAD_NAME = re.compile(r"[@,\[\]/*+:\\]")


def check_range_name(name: str) -> str:
    """Return `name` if ncu can filter on it (see module docstring), else raise `TunecostError`."""
    if not name or _BAD_NAME.search(name):
        raise TunecostError(f"bad range name {name!r}: must be non-empty, without any of @ , [ ] / * + : \\")
    return name


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


def innermost_range(nvtx_ranges: Sequence[str]) -> str | None:
    """The innermost tunecost range of a stack given outer to inner; other tools' ranges are ignored."""
    for name in reversed(tuple(nvtx_ranges)):
        if name in ALL_RANGES:
            return name
    return None


def is_moe_work(nvtx_ranges: Sequence[str]) -> bool:
    """Whether work under this range stack (outer to inner) belongs to a labelled MoE block."""
    return innermost_range(nvtx_ranges) in MOE_RANGES


# --- instrumenting a transformers MoE block on its instance (no library patching) ---------------------------


@dataclass
class InstrumentationHandle:
    """Undo `instrument_moe_block` / `instrument_model`: restores every wrapped module's forward."""

    _restores: list[Callable[[], None]] = field(default_factory=list)

    def remove(self) -> None:
        while self._restores:
            self._restores.pop()()

    def __enter__(self) -> InstrumentationHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    @property
    def num_modules(self) -> int:
        return len(self._restores)


def _shadow_forward(module: Any, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Callable[[], None]:
    """Set `module.forward` on the instance to `make(current forward)`; return the undo function.

    An instance attribute rather than forward hooks: a hook pair cannot close its range when the forward raises
    (non-reentrant activation checkpointing stops its recomputation with an exception), a context manager can.
    A forward some other tool already set on the instance (accelerate's hooks) is wrapped and put back on undo.
    """
    previous = vars(module).get("forward")
    if getattr(previous, "_tunecost_wrapper", False):
        raise TunecostError(f"{type(module).__name__} is already instrumented (remove the first handle)")
    forward = make(module.forward)
    forward._tunecost_wrapper = True  # type: ignore[attr-defined]
    module.forward = forward

    def restore() -> None:
        if previous is None:
            vars(module).pop("forward", None)
        else:
            module.forward = previous

    return restore


def _wrap_forward(
    module: Any, name: str, *, backward: bool, inner: Callable[[], Any] | None = None
) -> Callable[[], None]:
    """Run `module`'s forward through `call_in_range(name, ...)` (optionally inside the context `inner()`)."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        target = original
        if inner is not None:

            def target(*args: Any, **kwargs: Any) -> Any:
                with inner():  # entered inside the range, after the markers: it sees only the module's own calls
                    return original(*args, **kwargs)

        def forward(*args: Any, **kwargs: Any) -> Any:
            return call_in_range(name, target, *args, backward=backward, **kwargs)

        return forward

    return _shadow_forward(module, make)


def _unwrapped(module: Any) -> Any:
    """The module under PEFT wrappers (`lora.ParamWrapper` nests one `base_layer` per targeted parameter)."""
    while hasattr(module, "base_layer"):
        module = module.base_layer
    return module


def _fused_expert_shapes(experts: Any) -> dict[str, tuple[int, int]] | None:
    """Sorted (rows, cols) of the fused gate_up and down weights of a transformers experts module, or None."""
    experts = _unwrapped(experts)
    hidden = getattr(experts, "hidden_dim", None)
    inter = getattr(experts, "intermediate_dim", None)
    if not (isinstance(hidden, int) and isinstance(inter, int)) or not hasattr(experts, "gate_up_proj"):
        return None
    if not hasattr(experts, "down_proj"):
        return None
    return {W1W3: (min(2 * inter, hidden), max(2 * inter, hidden)), W2: (min(hidden, inter), max(hidden, inter))}


_MATMUL_FUNCTIONS = (
    "linear",
    "_grouped_mm",
    "grouped_mm",
    "bmm",
    "matmul",
    "mm",
    "baddbmm",
    "addmm",
    "__matmul__",
    "einsum",
)
_WEIGHT_SECOND = ("linear", "_grouped_mm", "grouped_mm")  # called as f(input, weight, ...)


def _expert_matmul_mode(shapes: dict[str, tuple[int, int]], lora_params: Sequence[Any], backward: bool) -> Any:
    """A TorchFunctionMode that labels the fused experts' matmuls W1W3 (gate_up), W2 (down) or LORA.

    transformers' fused experts call `linear` (eager), `torch._grouped_mm` / `F.grouped_mm` (grouped_mm) or
    `torch.bmm` (batched_mm) with the expert weight (or a per-token copy, or PEFT's merged W + BA) as an argument;
    its last two dims identify which weight it is ({2I, H} vs {H, I}, never equal; for `linear` and grouped_mm
    only the weight argument is looked at, as an activation can have 2I or I rows). A matmul on a LoRA factor (or
    a view of one: PEFT builds B·A with `einsum` on reshaped factors) is LORA. When the arguments are ambiguous (an
    activation with T == I rows, say), the call stays unlabelled and counts as an expert matmul.
    """
    from torch.overrides import TorchFunctionMode

    by_shape = {shape: label for label, shape in shapes.items()}
    lora_ids = {id(p) for p in lora_params}

    def label_of(func_name: str, args: Sequence[Any]) -> str | None:
        tensors = [a for a in args if hasattr(a, "shape")]
        if any(id(a) in lora_ids or id(getattr(a, "_base", None)) in lora_ids for a in tensors):
            return LORA
        if func_name in _WEIGHT_SECOND and len(args) > 1 and hasattr(args[1], "shape"):
            tensors = [args[1]]  # (input, weight, ...): look at the weight only
        labels = {by_shape.get(tuple(sorted(a.shape[-2:]))) for a in tensors if len(a.shape) >= 2}
        labels.discard(None)
        return labels.pop() if len(labels) == 1 else None

    class ExpertMatmulMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if name in _MATMUL_FUNCTIONS:
                label = label_of(name, args)
                if label is not None:
                    return call_in_range(label, func, *args, backward=backward, **kwargs)
            return func(*args, **kwargs)

    return ExpertMatmulMode


# Submodules that compute one expert weight's matmul (the paper's per-expert `w1`/`w3`/`w2` modules, or
# `gate_proj`/`up_proj`/`down_proj`), and LoRA factor modules (PEFT-style `lora_A` / `lora_B`).
_SUBMODULE_RANGES = {
    "w1": W1,
    "gate_proj": W1,
    "w3": W3,
    "up_proj": W3,
    "w2": W2,
    "down_proj": W2,
    "gate_up_proj": W1W3,
}


def _labelled_submodules(root: Any) -> list[tuple[Any, str]]:
    """(module, range) for the callable submodules of `root` whose name says which weight they hold."""
    import torch

    found = []
    for name, module in root.named_modules():
        if not name or type(module).forward is torch.nn.Module.forward:  # containers have no forward
            continue
        parts = name.split(".")
        label = _SUBMODULE_RANGES.get(parts[-1])
        if label is None and ("lora_A" in parts or "lora_B" in parts):
            label = LORA
        if label is not None:
            found.append((module, label))
    return found


def instrument_moe_block(
    block: Any, *, backward: bool = True, split_fused_matmuls: bool | None = None
) -> InstrumentationHandle:
    """Label a transformers MoE block (e.g. `MixtralSparseMoeBlock`): the block `MOE_BLOCK`, its router
    (`block.gate`) `ROUTER`, its experts (`block.experts`) `EXPERTS`, forward and (with `backward`) backward.

    Inside, submodules named for a weight (`w1`/`gate_proj` -> W1, `w3`/`up_proj` -> W3, `w2`/`down_proj` -> W2)
    and LoRA factor modules (`lora_A`/`lora_B` -> LORA) get their range too. `split_fused_matmuls` (default: when
    the experts are a fused `gate_up_proj`/`down_proj` stack) labels the matmuls of the fused weights by shape:
    `W1W3` (gate+up in one matmul), `W2`, and LORA for matmuls on LoRA factor parameters. Expert code can also
    label itself with `moe_range`/`call_in_range`. Returns a handle whose `remove()` undoes it all.
    """
    gate = getattr(block, "gate", None)
    experts = getattr(block, "experts", None)
    if gate is None or experts is None:
        raise TunecostError(f"{type(block).__name__} is not a MoE block with `.gate` and `.experts` modules")
    handle = InstrumentationHandle()
    shapes = _fused_expert_shapes(experts)
    if split_fused_matmuls is None:
        split_fused_matmuls = shapes is not None
    inner = None
    if split_fused_matmuls:
        if shapes is None:
            raise TunecostError(f"{type(experts).__name__} has no fused gate_up_proj/down_proj to split")
        lora_params = [p for name, p in experts.named_parameters() if "lora_" in name]
        inner = _expert_matmul_mode(shapes, lora_params, backward)
    # Jitter noise multiplies the block input in place, which the identity markers forbid; label forward only.
    block_backward = backward and not (getattr(block, "training", False) and getattr(block, "jitter_noise", 0) > 0)
    try:
        handle._restores.append(_wrap_forward(block, MOE_BLOCK, backward=block_backward))
        handle._restores.append(_wrap_forward(gate, ROUTER, backward=backward))
        handle._restores.append(_wrap_forward(experts, EXPERTS, backward=backward, inner=inner))
        for module, label in [*_labelled_submodules(gate), *_labelled_submodules(experts)]:
            handle._restores.append(_wrap_forward(module, label, backward=backward))
    except BaseException:
        handle.remove()
        raise
    return handle


_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _in_backward() -> bool:
    import torch

    return torch._C._current_autograd_node() is not None


def _wrap_recompute(module: Any) -> Callable[[], None]:
    """Label a module's forward RECOMPUTE when it runs inside the backward (checkpoint recomputation).

    Put on the MoE block's siblings in its decoder layer (attention, norms): transformers checkpoints the layer's
    class `forward`, so the recomputation bypasses an instance-level wrapper on the layer itself but still calls
    its children through `__call__`.
    """

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            if not _in_backward():
                return original(*args, **kwargs)
            with moe_range(RECOMPUTE):
                return original(*args, **kwargs)

        return forward

    return _shadow_forward(module, make)


def find_moe_blocks(model: Any) -> list[tuple[int, str, Any]]:
    """(decoder layer index, module name, block) of every module with `.gate` and `.experts` submodules."""
    import torch

    found: list[tuple[int, str, Any]] = []
    for name, module in model.named_modules():
        gate = getattr(module, "gate", None)
        experts = getattr(module, "experts", None)
        if isinstance(gate, torch.nn.Module) and isinstance(experts, torch.nn.Module):
            match = _LAYER_INDEX.search(name + ".")
            found.append((int(match.group(1)) if match else len(found), name, module))
    return found


def instrument_model(
    model: Any, layers: Sequence[int] | None = None, *, backward: bool = True
) -> InstrumentationHandle:
    """`instrument_moe_block` on the MoE blocks of the given decoder layers (all when `layers` is None)."""
    import torch

    blocks = find_moe_blocks(model)
    if not blocks:
        raise TunecostError(f"{type(model).__name__} has no MoE blocks (modules with .gate and .experts)")
    available = sorted({index for index, _, _ in blocks})
    wanted = set(available if layers is None else layers)
    missing = sorted(wanted - set(available))
    if missing:
        raise TunecostError(f"no MoE block in layer(s) {missing}; MoE layers: {available}")
    handle = InstrumentationHandle()
    try:
        for index, name, block in blocks:
            if index in wanted:
                handle._restores.extend(instrument_moe_block(block, backward=backward)._restores)
                if "." in name:  # the other parts of the decoder layer holding the block
                    layer = model.get_submodule(name.rsplit(".", 1)[0])
                    for sibling in layer.children():
                        if sibling is not block and type(sibling).forward is not torch.nn.Module.forward:
                            handle._restores.append(_wrap_recompute(sibling))
    except BaseException:
        handle.remove()
        raise
    return handle
