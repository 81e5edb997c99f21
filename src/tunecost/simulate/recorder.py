"""A dispatch-level recorder of one training step: every storage allocation and release, FLOPs and bytes per op.

Sources and derivations: docs/memory-model.md, section `tunecost.simulate.recorder`.
"""

from __future__ import annotations

import bisect
import functools
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from tunecost.simulate import counts as _counts
from tunecost.simulate.loops import SampledBackward, recorded_loop

_SEQ_NONE = 2**63  # AccumulateGrad nodes carry UINT64_MAX


@dataclass(frozen=True)
class LayerPlan:
    """Which decoder layers repeat: `prefix` leading layers, then units of `period` identical layers."""

    prefix: int
    period: int
    num_units: int

    @property
    def num_layers(self) -> int:
        return self.prefix + self.num_units * self.period

    def regions(self, layer: int) -> tuple[str, ...]:
        if layer < self.prefix:
            return ("prefix",)
        unit = (layer - self.prefix) // self.period
        keys = []
        if unit == 0:
            keys.append("unit_first")
        if unit == self.num_units - 1:
            keys.append("unit_last")
        return tuple(keys) or ("unit_mid",)


@dataclass
class StorageRecord:
    nbytes: int
    t_alloc: int
    phase: str  # static | forward | backward | recompute | optimizer
    group: str
    static_category: str | None = None
    t_free: int | None = None
    t_grad: int | None = None  # when the storage became a parameter's .grad
    raw_nbytes: int = 0  # before rounding to the granule
    layer: int = -1  # a static tensor's decoder layer (-1: outside the layers, or not static)


@dataclass
class _OpCounter:
    flops: dict = field(default_factory=dict)  # (phase, class) -> FLOPs
    bytes: dict = field(default_factory=dict)  # (phase, class) -> bytes
    flops_by_group: dict = field(default_factory=dict)  # (group, phase) -> FLOPs
    log: list | None = None  # each add's arguments, while a loop is sampled (`loops.recorded_loop`)

    def add(self, phase: str, op_class: str, group: str, flops: int, nbytes: int) -> None:
        if self.log is not None:
            self.log.append((phase, op_class, group, flops, nbytes))
        if flops:
            self.flops[(phase, op_class)] = self.flops.get((phase, op_class), 0) + flops
            self.flops_by_group[(group, phase)] = self.flops_by_group.get((group, phase), 0) + flops
        if nbytes:
            self.bytes[(phase, op_class)] = self.bytes.get((phase, op_class), 0) + nbytes


class StepRecorder(TorchDispatchMode):
    """Record one step. Use: register static tensors, install hooks, then set_phase() around each phase."""

    def __init__(
        self,
        *,
        plan: LayerPlan,
        module_info: dict[int, tuple[str, int | None]],
        round_bytes: int = 1,
        sample_loops: bool = True,
    ):
        super().__init__()
        self.sample_loops = sample_loops  # loops of like iterations on fake tensors run in part (`loops`)
        self._sampled_backward: SampledBackward | None = None  # the loop whose backward is being sampled
        self.plan = plan
        self.module_info = module_info  # id(module) -> (group, layer index or None)
        self.round_bytes = round_bytes
        self.records: list[StorageRecord] = []
        self._by_storage: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._refs: list[weakref.ref] = []
        self.t = 0
        self.phase = "setup"
        self.t_forward_end: int | None = None
        self.t_end: int | None = None
        self._stack: list[tuple[str, int | None]] = []
        self._seq_marks: list[int] = []
        self._seq_tags: list[tuple[str, int | None, str | None]] = []
        self._layers_seen = {"forward": False, "backward": False}
        self._param_layers: dict[int, int] = {}  # id(parameter) -> its decoder layer, for its AccumulateGrad
        self.op_segments: list[tuple[str, ...]] = []  # per op index: its segment keys
        self.op_layers: list[int] = []  # per op index: its decoder layer (-1: outside the layers)
        self.counter = _OpCounter()
        self._handles: list = []
        self.resized = False  # a storage grew in place (its growth is a record of its own)
        self.not_affine = False  # a size of this step is not affine in the batch size (counts.note_not_affine)

    # ---- static tensors and hooks -------------------------------------------------------------------------
    def _rounded(self, nbytes: int) -> int:
        r = self.round_bytes
        return nbytes if r <= 1 else -(-nbytes // r) * r

    def _record_storage(
        self, st, phase: str, group: str, static_category: str | None = None, layer: int = -1
    ) -> StorageRecord | None:
        rec = self._by_storage.get(st)
        if rec is not None:
            return rec
        nbytes = st.nbytes()
        if nbytes == 0:
            return None
        rec = StorageRecord(
            nbytes=self._rounded(nbytes),
            t_alloc=self.t,
            phase=phase,
            group=group,
            static_category=static_category,
            raw_nbytes=nbytes,
            layer=layer,
        )
        self.records.append(rec)
        self._by_storage[st] = rec

        def on_free(_ref: Any, rec: StorageRecord = rec) -> None:
            self._on_free(rec)

        self._refs.append(weakref.ref(st, on_free))
        return rec

    def _on_free(self, rec: StorageRecord) -> None:
        if rec.t_free is None and self.t_end is None:
            rec.t_free = self.t

    def register_static(self, tensor: torch.Tensor, category: str, group: str, layer: int = -1) -> None:
        self._record_storage(tensor.untyped_storage(), "static", group, category, layer)

    def install_hooks(self, model: torch.nn.Module, trainable: list[torch.nn.Parameter]) -> None:
        for module in model.modules():
            info = self.module_info.get(id(module))
            if info is None:
                continue
            if info[1] is not None:
                self._param_layers.update((id(p), info[1]) for p in module.parameters())
            self._handles.append(module.register_forward_pre_hook(lambda _m, _a, info=info: self._enter(info)))
            self._handles.append(
                module.register_forward_hook(lambda _m, _a, _o, info=info: self._exit(), always_call=True)
            )
        for p in trainable:
            self._handles.append(p.register_post_accumulate_grad_hook(self._on_grad))
        for listeners, listener in self._listeners():
            listeners.append(listener)

    def _listeners(self) -> tuple:
        return (
            (_counts.LISTENERS, self._mark_seq),
            (_counts.WORK_LISTENERS, self._add_work),
            (_counts.NOT_AFFINE_LISTENERS, self._not_affine),
            (_counts.LOOP_LISTENERS, self._loop),
            (_counts.BACKWARD_LOOP_LISTENERS, self._backward_loop),
        )

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for listeners, listener in self._listeners():
            if listener in listeners:
                listeners.remove(listener)

    def _not_affine(self) -> None:
        self.not_affine = True

    def _loop(self, count: int, tensor: torch.Tensor) -> Iterator[int]:
        return recorded_loop(self, count) if self.sample_loops and _is_fake(tensor) else iter(range(count))

    def _backward_loop(self, i: int, count: int, output: torch.Tensor) -> None:
        if not (self.sample_loops and _is_fake(output)):
            return
        if i == 0:
            self._sampled_backward = SampledBackward(self, count)
        if self._sampled_backward is not None:
            self._sampled_backward.iteration(i, output)

    def _add_work(self, op_class: str, flops: int, nbytes: int) -> None:
        if self.phase != "setup":
            phase, group, _layer, _override = self._context()
            self.counter.add(phase, "optimizer" if phase == "optimizer" else op_class, group, flops, nbytes)

    def _mark_seq(self) -> None:
        group, layer = self._stack[-1] if self._stack else ("other", None)
        tag = (group, layer, _counts.current_override())
        seq = torch._C._autograd._get_sequence_nr()
        if self._seq_marks and self._seq_marks[-1] == seq:
            self._seq_tags[-1] = tag
        else:
            self._seq_marks.append(seq)
            self._seq_tags.append(tag)

    def _enter(self, info: tuple[str, int | None]) -> None:
        group, layer = info
        if layer is None and self._stack:  # inherit the layer of the enclosing module
            layer = self._stack[-1][1]
        self._stack.append((group, layer))
        self._mark_seq()

    def _exit(self) -> None:
        if self._stack:
            self._stack.pop()
        self._mark_seq()

    def _on_grad(self, param: torch.Tensor) -> None:
        if param.grad is not None:
            rec = self._by_storage.get(_local(param.grad).untyped_storage())
            if rec is not None and rec.t_grad is None and rec.static_category is None:
                rec.t_grad = self.t

    def set_phase(self, phase: str) -> None:
        if self.phase == "forward" and phase != "forward":
            self.t_forward_end = self.t
        self.phase = phase

    def finish(self) -> None:
        self.t_end = self.t
        self.remove_hooks()

    def _layer_of(self, args) -> int | None:
        """The decoder layer the arguments were recorded in (None: none, or several: a list across layers)."""
        layers = {r.layer for t in flat_tensors(args) if (r := self._by_storage.get(t.untyped_storage())) is not None}
        layers.discard(-1)
        return layers.pop() if len(layers) == 1 else None

    def _out_layers(self, phase: str, args, outs: list, layer: int | None) -> list[int | None]:
        """Per output, its layer: a foreach optimizer op's i-th output is its first list's i-th tensor's."""
        first = args[0] if args and phase == "optimizer" else None
        if isinstance(first, (list, tuple)) and len(first) == len(outs):
            return [self._layer_of(x) for x in first]
        return [layer] * len(outs)

    # ---- context of the running op ------------------------------------------------------------------------
    def _context(self) -> tuple[str, str, int | None, str | None]:
        """(phase, group, layer, op-class override) of the op being dispatched."""
        if self.phase == "optimizer":
            return "optimizer", "optimizer", None, None
        if self._stack:
            group, layer = self._stack[-1]
            phase = "recompute" if self.phase == "backward" else self.phase
            return phase, group, layer, _counts.current_override()
        if self.phase == "backward":
            node = torch._C._current_autograd_node()
            if node is not None:
                seq = node._sequence_nr()
                if seq >= _SEQ_NONE:  # a parameter's AccumulateGrad: in its layer's backward
                    param = getattr(node, "variable", None)
                    return "backward", "other", self._param_layers.get(id(param)), None
                i = bisect.bisect_right(self._seq_marks, seq) - 1
                if i >= 0:
                    group, layer, override = self._seq_tags[i]
                    return "backward", group, layer, override
            return "backward", "other", None, None
        return self.phase, "lm_head/loss", None, _counts.current_override()

    def _segment(self, phase: str, layer: int | None) -> tuple[str, ...]:
        if phase == "optimizer":
            return ("optimizer:opt",)
        kind = "forward" if phase == "forward" else "backward"
        if layer is not None:
            self._layers_seen[kind] = True
            return tuple(f"{kind}:{r}" for r in self.plan.regions(layer))
        if kind == "forward":
            return ("forward:post",) if self._layers_seen["forward"] else ("forward:pre",)
        return ("backward:pre",) if self._layers_seen["backward"] else ("backward:post",)

    # ---- dispatch -------------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.phase == "setup":
            return func(*args, **kwargs)
        self.t += 1
        out = _fake_grouped_mm(func, args, kwargs)
        if out is None:
            out = func(*args, **kwargs)
        phase, group, layer, override = self._context()
        out_tensors = flat_tensors(out)
        if phase == "optimizer":  # the layer of the parameter (state, temporary) it updates
            layer = self._layer_of(args)
        for t, t_layer in zip(out_tensors, self._out_layers(phase, args, out_tensors, layer), strict=True):
            st = t.untyped_storage()
            rec = self._by_storage.get(st)
            if rec is None:
                self._record_storage(st, phase, group, layer=-1 if t_layer is None else t_layer)
            elif st.nbytes() > rec.nbytes:  # resized in place: count the growth as a new allocation
                self._record_storage_growth(rec, st.nbytes())
        self.op_segments.append(self._segment(phase, layer))
        self.op_layers.append(-1 if layer is None else layer)
        info = _op_info(func)
        op_class = _counts.classify_op(func, group, phase, override)
        flops = _counts.op_flops(func, args, kwargs, out) if info.has_formula and op_class != "dequant" else 0
        if not flops and op_class != "dequant" and info.elementwise:
            flops = _counts.elementwise_flops(func, args, out_tensors)
            if flops and op_class == "lora":  # LoRA's scaling/adds are element-wise work
                op_class = "elementwise"
        nbytes = 0
        if info.moves_bytes or op_class == "dequant":
            nbytes = sum(t.numel() * t.element_size() for t in flat_tensors(args))
            nbytes += sum(t.numel() * t.element_size() for t in out_tensors)
        self.counter.add(phase, op_class, group, flops, nbytes)
        return out

    def _record_storage_growth(self, rec: StorageRecord, new_nbytes: int) -> None:
        grown = StorageRecord(
            nbytes=self._rounded(new_nbytes) - rec.nbytes,
            t_alloc=self.t,
            phase=rec.phase,
            group=rec.group,
            static_category=rec.static_category,
        )
        rec.nbytes += grown.nbytes
        self.records.append(grown)
        self.resized = True


@dataclass(frozen=True)
class _OpInfo:
    has_formula: bool
    elementwise: bool
    moves_bytes: bool


@functools.cache
def _op_info(func) -> _OpInfo:
    return _OpInfo(
        has_formula=func._overloadpacket in _counts._fc.flop_registry,
        elementwise=_counts.may_count_elementwise(func),
        moves_bytes=_counts.moves_bytes(func),
    )


def flat_tensors(obj) -> list[torch.Tensor]:
    """Tensors in an op's arguments or outputs (flat tuples/lists, one level of nesting as in foreach ops). A
    DTensor (FSDP2's sharded parameters, gradients and optimizer states) stands for its local shard, an
    AsyncCollectiveTensor for its buffer."""
    if isinstance(obj, torch.Tensor):
        return [_local(obj)]
    out: list[torch.Tensor] = []
    for x in obj if isinstance(obj, (tuple, list)) else ():
        out.extend(_local(y) for y in (x if isinstance(x, (tuple, list)) else (x,)) if isinstance(y, torch.Tensor))
    return out


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard; the buffer a functional collective's AsyncCollectiveTensor wraps (a wrapper
    holds no memory of its own)."""
    local = getattr(t, "_local_tensor", None)
    if local is None and type(t).__name__ == "AsyncCollectiveTensor":
        local = getattr(t, "elem", None)
    return local if isinstance(local, torch.Tensor) else t


def _fake_grouped_mm(func, args, kwargs):
    """`aten._grouped_mm`'s meta kernel accepts bf16 only, while the CPU kernel also runs fp32; on fake
    tensors of other dtypes, make the output (same shape rules) ourselves. None when not applicable."""
    if func._overloadpacket is not torch.ops.aten._grouped_mm:
        return None
    a, b = args[0], args[1]
    if a.dtype == torch.bfloat16 or not _is_fake(a):
        return None
    offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
    if a.dim() == 2 and b.dim() == 3:
        shape = (a.shape[0], b.shape[-1])
    elif a.dim() == 2 and b.dim() == 2:
        shape = (offs.shape[0], a.shape[0], b.shape[1])
    elif a.dim() == 3 and b.dim() == 2:
        shape = (a.shape[1], b.shape[1])
    else:
        shape = (a.shape[0], a.shape[1], b.shape[-1])
    return a.new_empty(shape)


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)
