"""Per-layer time of a training step, split into norm / attention (or mamba) / MoE router / MoE experts, for the
forward, the real backward, and the gradient-checkpointing recomputation (paper Fig. 5).

Sources and derivations: docs/profiling.md, section `tunecost.profile.layers`.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tunecost.errors import TunecostError
from tunecost.models.anatomy import decoder_layers, router_and_experts
from tunecost.profile.timers import Clock

PASSES: tuple[str, ...] = ("forward", "backward", "recompute")
COMPONENTS: tuple[str, ...] = (
    "embedding",
    "norm",
    "attention",
    "mamba",
    "mlp",
    "moe_router",
    "moe_experts",
    "other",
    "lm_head_loss",
)
_ATTENTION_NAMES = ("self_attn", "attention", "attn", "self_attention")
_MOE_BLOCK_NAMES = ("mlp", "block_sparse_moe", "moe", "mixer", "feed_forward")


# ------------------------------------------------------------------------------------------- model structure


@dataclass
class LayerParts:
    """The timed parts of one decoder layer: (part key, component, module) in forward order, plus the router."""

    index: int
    module: Any
    parts: list[tuple[str, str, Any]] = field(default_factory=list)
    router: Any = None  # inside the MoE block; its part key is "router"

    @property
    def is_moe(self) -> bool:
        return self.router is not None


def _is_norm(name: str, module: Any) -> bool:
    return "norm" in type(module).__name__.lower() or "norm" in name.lower()


def layer_parts(index: int, layer: Any) -> LayerParts:
    """Classify the direct children of a decoder layer (transformers Mixtral/OLMoE/Qwen-MoE style, or
    BlackMamba's `norm` + `mixer`)."""
    out = LayerParts(index=index, module=layer)
    norm_count = 0
    for name, child in layer.named_children():
        if _is_norm(name, child):
            out.parts.append((f"norm{norm_count}", "norm", child))
            norm_count += 1
        elif name in _ATTENTION_NAMES:
            out.parts.append(("attention", "attention", child))
        elif name in _MOE_BLOCK_NAMES:
            moe = router_and_experts(child)
            if moe is not None:
                out.parts.append(("moe", "moe_experts", child))
                out.router = moe[0]
            elif "mamba" in type(child).__name__.lower() or hasattr(child, "A_log"):
                out.parts.append(("mamba", "mamba", child))
            else:
                out.parts.append(("mlp", "mlp", child))
    if not out.parts:
        raise TunecostError(f"layer {index} ({type(layer).__name__}) has no parts tunecost can time")
    return out


def model_layer_parts(model: Any) -> list[LayerParts]:
    return [layer_parts(i, layer) for i, layer in enumerate(decoder_layers(model))]


# ------------------------------------------------------------------------------------------------ the timer


def _tensors(obj: Any) -> Iterable[Any]:
    """Top-level tensors of a hook's args/kwargs/output (tensor, tuple/list, dict or ModelOutput)."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            if isinstance(v, torch.Tensor):
                yield v
    elif isinstance(obj, dict):
        for v in obj.values():
            if isinstance(v, torch.Tensor):
                yield v


def _grad_tensors(obj: Any) -> list[Any]:
    return [t for t in _tensors(obj) if t.requires_grad and t.is_floating_point()]


def _in_backward() -> bool:
    import torch

    return torch._C._current_autograd_node() is not None


@dataclass
class _Instance:
    """One call of one part: its forward (or recompute) marks and its backward marks."""

    layer: int | None
    key: str
    component: str
    recompute: bool
    start: int = -1
    end: int = -1
    grad_out: list[int] = field(default_factory=list)
    grad_in: list[int] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class LayerTimes:
    """Seconds per (pass, layer_index, component) of one step, plus what the marks saw of the model call."""

    seconds: dict[tuple[str, int | None, str], float]
    num_model_calls: int

    def total(self, pass_: str) -> float:
        return sum(v for (p, _, _), v in self.seconds.items() if p == pass_)

    def rows(self) -> list[dict[str, Any]]:
        return [
            {"pass": p, "layer_index": layer, "component": c, "seconds": s}
            for (p, layer, c), s in sorted(self.seconds.items(), key=_row_order)
        ]


def _row_order(item: tuple[tuple[str, int | None, str], float]) -> tuple[int, int, int]:
    (p, layer, c), _ = item
    return (PASSES.index(p), -1 if layer is None else layer, COMPONENTS.index(c) if c in COMPONENTS else 99)


class LayerTimer:
    """Hooks that time each decoder layer's parts in every pass; `collect()` after each step.

    Use: `attach()`, run steps (call `mark_backward_end()` after each `backward()` so the embedding's backward has an
    end), `collect()` after each step, `detach()` at the end. Works for any number of model calls per step
    (gradient accumulation): times of the same (pass, layer, component) are summed.
    """

    def __init__(self, model: Any, clock: Clock) -> None:
        self.model = model
        self.clock = clock
        self.layers = model_layer_parts(model)
        self._handles: list[Any] = []
        self._reset()

    def _reset(self) -> None:
        self._instances: list[_Instance] = []
        self._stacks: dict[int, list[_Instance]] = defaultdict(list)
        self._marks: list[tuple[int, str]] = []  # (mark, what) in program order, for recompute episodes
        self._model_calls: list[list[int]] = []  # [start, end] marks of each model call
        self._backward_starts: list[int] = []
        self._backward_ends: list[int] = []

    # -- hooks --------------------------------------------------------------------------------------------
    def attach(self) -> LayerTimer:
        if self._handles:
            return self
        root = self.model
        self._handles.append(root.register_forward_pre_hook(self._model_pre))
        self._handles.append(root.register_forward_hook(self._model_post, always_call=True))
        for lp in self.layers:
            items = [("layer", "layer", lp.module), *lp.parts]
            if lp.router is not None:
                items.append(("router", "moe_router", lp.router))
            for key, component, module in items:
                pre = functools.partial(self._pre, lp.index, key, component)
                post = functools.partial(self._post, id(module))
                self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
                self._handles.append(module.register_forward_hook(post, always_call=True))
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._reset()

    def __enter__(self) -> LayerTimer:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def _mark(self, what: str) -> int:
        m = self.clock.mark()
        self._marks.append((m, what))
        return m

    def _model_pre(self, module: Any, args: Any) -> None:
        if _in_backward():
            return
        self._model_calls.append([self._mark("model"), -1])

    def _model_post(self, module: Any, args: Any, output: Any) -> None:
        if _in_backward() or not self._model_calls:
            return
        self._model_calls[-1][1] = self._mark("model")
        loss = getattr(output, "loss", None) if not isinstance(output, dict) else output.get("loss")
        if loss is not None and getattr(loss, "requires_grad", False):
            loss.register_hook(self._on_loss_grad)

    def _on_loss_grad(self, grad: Any) -> None:
        self._backward_starts.append(self._mark("grad"))

    def mark_backward_end(self) -> int:
        """Mark right after `backward()` returned (the end of the embedding's backward); returns the mark."""
        m = self._mark("grad")
        self._backward_ends.append(m)
        return m

    @property
    def model_calls(self) -> list[tuple[int, int]]:
        """(start, end) marks of this step's model calls (end -1 while running)."""
        return [(s, e) for s, e in self._model_calls]

    @property
    def backward_starts(self) -> list[int]:
        """Marks at which a loss's gradient arrived (one per backward)."""
        return list(self._backward_starts)

    def _pre(self, layer: int, key: str, component: str, module: Any, args: Any, kwargs: Any) -> None:
        recompute = _in_backward()
        inst = _Instance(layer=layer, key=key, component=component, recompute=recompute)
        inst.start = self._mark("recompute" if recompute else "forward")
        self._instances.append(inst)
        self._stacks[id(module)].append(inst)
        if not recompute:
            for t in _grad_tensors(args) + _grad_tensors(kwargs):
                t.register_hook(functools.partial(self._on_grad, inst.grad_in))

    def _post(self, module_id: int, module: Any, args: Any, output: Any) -> None:
        stack = self._stacks.get(module_id)
        if not stack:
            return
        inst = stack.pop()
        inst.end = self._mark("recompute" if inst.recompute else "forward")
        if not inst.recompute and output is not None:
            for t in _grad_tensors(output):
                t.register_hook(functools.partial(self._on_grad, inst.grad_out))

    def _on_grad(self, marks: list[int], grad: Any) -> None:
        marks.append(self._mark("grad"))

    # -- resolution -----------------------------------------------------------------------------------------
    def collect(self, times: list[float] | None = None) -> LayerTimes:
        """Turn this step's marks into seconds and clear them for the next step.

        `times`: the clock's resolved marks when the caller shares the clock and resolves it (then the caller
        resets it too); None: resolve and reset the clock here.
        """
        own = times is None
        try:
            return self._resolve(self.clock.resolve() if times is None else times)
        finally:
            self._reset()
            if own:
                self.clock.reset()

    def _resolve(self, t: list[float]) -> LayerTimes:
        out: dict[tuple[str, int | None, str], float] = defaultdict(float)
        episodes = _recompute_episodes(self._marks, t)

        def backward_seconds(a: float, b: float) -> float:
            overlap = sum(max(0.0, min(b, e1) - max(a, e0)) for e0, e1 in episodes)
            return max(0.0, b - a - overlap)

        # seconds per (pass, layer, part key), then parts -> components
        part: dict[tuple[str, int | None, str], float] = defaultdict(float)
        comp_of: dict[str, str] = {}
        grad_marks = sorted(m for m, what in self._marks if what == "grad")
        for inst in self._instances:
            comp_of[inst.key] = inst.component
            if inst.start >= 0 and inst.end >= 0:
                pass_ = "recompute" if inst.recompute else "forward"
                part[(pass_, inst.layer, inst.key)] += t[inst.end] - t[inst.start]
            if inst.grad_out:
                b0, b1 = _backward_span(inst, grad_marks)
                part[("backward", inst.layer, inst.key)] += backward_seconds(t[b0], t[b1])
        for (p, layer, key), s in part.items():
            if key == "layer":  # the layer's own glue: residual adds, casts, call overhead between its parts
                inner = sum(
                    v for (p2, l2, k2), v in part.items() if (p2, l2) == (p, layer) and k2 not in ("layer", "router")
                )
                out[(p, layer, "other")] += max(0.0, s - inner)
                continue
            if key == "moe":  # experts = block - router
                s = max(0.0, s - part.get((p, layer, "router"), 0.0))
            out[(p, layer, comp_of[key])] += s
        self._model_items(out, t, backward_seconds)
        return LayerTimes(seconds=dict(out), num_model_calls=len(self._model_calls))

    def _model_items(self, out: dict, t: list[float], backward_seconds: Any) -> None:
        layer_insts = [i for i in self._instances if i.key == "layer" and not i.recompute]
        first_layer = min((lp.index for lp in self.layers), default=0)
        last_layer = max((lp.index for lp in self.layers), default=0)
        for start, end in self._model_calls:
            inside = [i for i in layer_insts if i.start > start and (end < 0 or i.end < end)]
            firsts = [i for i in inside if i.layer == first_layer]
            lasts = [i for i in inside if i.layer == last_layer and i.end >= 0]
            if firsts:
                out[("forward", None, "embedding")] += t[firsts[0].start] - t[start]
            if lasts and end >= 0:
                out[("forward", None, "lm_head_loss")] += t[end] - t[lasts[-1].end]
        for b0 in self._backward_starts:
            lasts = [i for i in layer_insts if i.layer == last_layer and i.grad_out and min(i.grad_out) > b0]
            if lasts:
                first_grad = min(min(i.grad_out) for i in lasts)
                out[("backward", None, "lm_head_loss")] += backward_seconds(t[b0], t[first_grad])
        grad_marks = sorted(m for m, what in self._marks if what == "grad")
        for b1 in self._backward_ends:
            ends = [_backward_span(i, grad_marks)[1] for i in layer_insts if i.layer == first_layer and i.grad_out]
            ends = [m for m in ends if m < b1]
            if ends:
                out[("backward", None, "embedding")] += backward_seconds(t[max(ends)], t[b1])


def _backward_span(inst: _Instance, grad_marks: list[int]) -> tuple[int, int]:
    """(start, end) marks of one part's backward.

    Start: the first of its outputs' gradients to be complete. Not the last: an output that is also used inside
    the part (a router's logits feed its own softmax; BlackMamba's residual is also its norm's input) has its
    gradient complete only when the part's backward is done. End: the first of its inputs' gradients after the
    start (an input shared with the previous layer, like BlackMamba's residual, completes only after that layer);
    with no input that needs a gradient, the next gradient event.
    """
    b0 = min(inst.grad_out)
    ends = [m for m in inst.grad_in if m >= b0]
    if ends:
        return b0, min(ends)
    return b0, next((m for m in grad_marks if m > b0), b0)


def _recompute_episodes(marks: list[tuple[int, str]], t: list[float]) -> list[tuple[float, float]]:
    """Spans of consecutive recompute marks (one checkpointed layer's recomputation each, gaps included)."""
    spans: list[tuple[float, float]] = []
    start: int | None = None
    prev = 0
    for m, what in sorted(marks):
        if what == "recompute":
            if start is None:
                start = m
            prev = m
        elif start is not None:
            spans.append((t[start], t[prev]))
            start = None
    if start is not None:
        spans.append((t[start], t[prev]))
    return spans
