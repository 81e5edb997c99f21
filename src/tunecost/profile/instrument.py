"""Label a transformers MoE block (or every MoE block of a model) with tunecost's ranges, on the instance: each
labelled module's forward is shadowed by an instance attribute that runs it through `nvtx.call_in_range` (forward
and backward), so nothing in transformers or PEFT is patched and `InstrumentationHandle.remove()` undoes it all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tunecost.errors import TunecostError
from tunecost.models.anatomy import MoeBlock, moe_blocks, unwrap_peft
from tunecost.moe.ranges import EXPERTS, LORA, MOE_BLOCK, RECOMPUTE, ROUTER, W1, W1W3, W2, W3
from tunecost.profile.nvtx import call_in_range, moe_range


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


def _fused_expert_shapes(experts: Any) -> dict[str, tuple[int, int]] | None:
    """Sorted (rows, cols) of the fused gate_up and down weights of a transformers experts module, or None."""
    experts = unwrap_peft(experts)
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


def gated_moe_blocks(model: Any) -> list[MoeBlock]:
    """The MoE blocks of `model` that `instrument_moe_block` labels: transformers-style, with `.gate` and
    `.experts` modules (BlackMamba's mixers have a `router` instead)."""
    return [b for b in moe_blocks(model) if b.router is getattr(b.block, "gate", None)]


def instrument_model(
    model: Any, layers: Sequence[int] | None = None, *, backward: bool = True
) -> InstrumentationHandle:
    """`instrument_moe_block` on the MoE blocks of the given decoder layers (all when `layers` is None)."""
    import torch

    blocks = gated_moe_blocks(model)
    if not blocks:
        raise TunecostError(f"{type(model).__name__} has no MoE blocks (modules with .gate and .experts)")
    available = sorted({b.layer_index for b in blocks})
    wanted = set(available if layers is None else layers)
    missing = sorted(wanted - set(available))
    if missing:
        raise TunecostError(f"no MoE block in layer(s) {missing}; MoE layers: {available}")
    handle = InstrumentationHandle()
    try:
        for found in blocks:
            index, name, block = found.layer_index, found.name, found.block
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
