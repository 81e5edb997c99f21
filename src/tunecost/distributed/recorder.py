"""The step simulator's recorder, extended for a sharded step: collectives and FSDP2's storage resizes.

Sources and derivations: docs/multi-gpu.md, section `tunecost.distributed.recorder`.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from dataclasses import dataclass

import torch

from tunecost.models.anatomy import decoder_layers
from tunecost.simulate.recorder import StepRecorder, StorageRecord, flat_tensors

# c10d dispatcher op -> collective kind (nccl-tests' names)
_C10D_KINDS = {
    "allgather_": "all_gather",
    "_allgather_base_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all",
    "broadcast_": "broadcast",
}
# functional collectives (`torch.distributed._functional_collectives`, DTensor's redistributions) -> kind; the
# op returns its output buffer, and its process group is named by its last argument
_FUNCTIONAL_KINDS = {
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
    "broadcast_": "broadcast",
}


@dataclass(frozen=True, kw_only=True)
class Collective:
    """One collective call. `nbytes` is nccl-tests' size: the whole buffer (all-gather: the gathered output;
    reduce-scatter: the unreduced input; all-reduce and broadcast: the tensor; all-to-all: the send buffer)."""

    op: str  # all_gather | reduce_scatter | all_reduce | all_to_all | broadcast
    group_size: int
    nbytes: int
    dtype: str
    phase: str  # forward | backward | recompute | optimizer
    layer: int | None  # the decoder layer of a forward all-gather; None for the root unit and in backward


def collective_kind(func) -> str | None:
    """The collective kind of a dispatcher op, None for any other op."""
    schema = func._schema.name  # e.g. "c10d::_allgather_base_"
    namespace, _, name = schema.partition("::")
    if namespace == "_c10d_functional":
        return _FUNCTIONAL_KINDS.get(name)
    if namespace != "c10d":
        return None
    return _C10D_KINDS.get(name)


def is_functional(func) -> bool:
    return func._schema.name.startswith("_c10d_functional::")


def functional_nbytes(kind: str, args, out) -> tuple[int, str, int]:
    """(nccl-tests bytes, dtype, group size) of a functional collective: all-gather counts its output, the others
    their input (all-to-all: the send buffer)."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    t = out if kind == "all_gather" else args[0]
    group_size = _resolve_process_group(args[-1]).size()
    return t.numel() * t.element_size(), str(t.dtype).removeprefix("torch."), group_size


def buffer_nbytes(kind: str, args) -> tuple[int, str, torch.Tensor | None, torch.Tensor | None]:
    """(nccl-tests bytes, dtype, output buffer, input buffer) of a c10d op's arguments."""
    first, second = args[0], args[1] if len(args) > 1 else None
    outs = flat_tensors(first)
    ins = flat_tensors(second) if isinstance(second, (torch.Tensor, list, tuple)) else []
    out_t = outs[0] if outs else None
    in_t = ins[0] if ins else None
    out_bytes = sum(t.numel() * t.element_size() for t in outs)
    in_bytes = sum(t.numel() * t.element_size() for t in ins)
    first_t = out_t if out_t is not None else in_t
    dtype = str(first_t.dtype).removeprefix("torch.") if first_t is not None else "?"
    if kind == "all_gather":
        return out_bytes, dtype, out_t, in_t
    if kind == "reduce_scatter":
        return in_bytes, dtype, out_t, in_t
    if kind == "all_to_all":
        return in_bytes or out_bytes, dtype, out_t, in_t
    return out_bytes, dtype, out_t, None


class _Suspended:
    """A re-entrant context that counts how deep it is entered."""

    def __init__(self) -> None:
        self.depth = 0

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc) -> None:
        self.depth -= 1


def _dtensor_type() -> type:
    from torch.distributed.tensor import DTensor

    return DTensor


def _group_size(args, default: int) -> int:
    for a in args:
        size = getattr(a, "size", None)
        if isinstance(a, torch.ScriptObject) and callable(size):
            with contextlib.suppress(Exception):
                return int(size())
    return default


class ShardedStepRecorder(StepRecorder):
    """Record one data-parallel step (see docs/multi-gpu.md). `world_size` is the group size reported when a
    collective's process group cannot be asked."""

    def __init__(self, *, world_size: int, desugar_dtensor: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.world_size = world_size
        # record what an op on DTensors runs on the local shards (its collectives and temporaries included), not
        # the DTensor op itself, as CommDebugMode does; FLOPs then count local shapes too
        self._dtensor_type = _dtensor_type() if desugar_dtensor else None
        self._propagation = _Suspended()  # DTensor's shape propagation, not the rank's computation
        self._lock_orig: object | None = None
        self.collectives: list[Collective] = []
        self.tags: dict[int, str] = {}  # id(StorageRecord) -> category overriding the recorder's classification
        self._resize_orig = None
        self._unit_layer: int | None = None  # decoder layer whose forward (and FSDP2 pre-forward hook) runs
        self._num_storages: dict[int, int] = {}  # id(StorageRecord) -> live storages standing for it, when over 1

    # ---- collectives ----------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._propagation.depth:
            return func(*args, **(kwargs or {}))
        if self._dtensor_type is not None and self.phase != "setup" and self._dtensor_type in types:
            return NotImplemented  # DTensor's dispatch runs the local ops, which come back here
        kind = collective_kind(func) if self.phase != "setup" else None
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if func is torch.ops._c10d_functional.wait_tensor.default and self.phase != "setup":
            self._alias_wait(args[0], out)
        if kind is not None:
            phase, _group, _layer, _override = self._context()
            # FSDP2 issues a unit's all-gather in its pre-forward hook, before the layer's module context opens;
            # in backward, prefetching issues them under another layer's context, so no layer is claimed there
            layer = self._unit_layer if phase == "forward" else None
            if is_functional(func):  # DTensor's: its buffers are activations or temporaries, as any op's output
                nbytes, dtype, group_size = functional_nbytes(kind, args, out)
            else:
                nbytes, dtype, out_t, in_t = buffer_nbytes(kind, args)
                group_size = _group_size(args, self.world_size)
                self._tag_buffers(kind, out_t, in_t)
            self.collectives.append(
                Collective(op=kind, group_size=group_size, nbytes=nbytes, dtype=dtype, phase=phase, layer=layer)
            )
        return out

    def _tag_buffers(self, kind: str, out_t: torch.Tensor | None, in_t: torch.Tensor | None) -> None:
        if kind == "all_gather":
            pairs = [(out_t, "all_gather_buffers"), (in_t, "all_gather_buffers")]
        elif kind == "reduce_scatter":
            pairs = [(in_t, "reduce_scatter_buffers"), (out_t, "gradients")]
        else:
            return
        for t, category in pairs:
            if t is None:
                continue
            rec = self._by_storage.get(t.untyped_storage())
            if rec is not None and rec.static_category is None:
                self.tags[id(rec)] = category

    def install_hooks(self, model: torch.nn.Module, trainable: list[torch.nn.Parameter]) -> None:
        super().install_hooks(model, trainable)

        layers = decoder_layers(model)
        self._handles.append(model.register_forward_pre_hook(lambda *_: self._set_unit(None), prepend=True))
        for index, layer in enumerate(layers):
            self._handles.append(layer.register_forward_pre_hook(lambda *_, i=index: self._set_unit(i), prepend=True))
            self._handles.append(layer.register_forward_hook(lambda *_: self._set_unit(None), always_call=True))

    def _set_unit(self, layer: int | None) -> None:
        self._unit_layer = layer

    def tag_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Mark the storages now holding `param.grad` (local shards under FSDP2) as gradients."""
        for p in params:
            if p.grad is None:
                continue
            for t in flat_tensors(p.grad):
                rec = self._by_storage.get(t.untyped_storage())
                if rec is not None and rec.static_category is None:
                    self.tags.setdefault(id(rec), "gradients")

    # ---- FSDP2 storage resizes --------------------------------------------------------------------------------
    def __enter__(self):
        orig = torch.UntypedStorage.resize_
        recorder = self

        def resize_(storage, size):
            before = storage.nbytes()
            result = orig(storage, size)
            recorder._on_resize(storage, before, storage.nbytes())
            return result

        self._resize_orig = orig
        torch.UntypedStorage.resize_ = resize_
        if self._dtensor_type is not None:
            self._enter_propagation()
        return super().__enter__()

    def _enter_propagation(self) -> None:
        """DTensor derives an op's output shape by running it on fake tensors of the global shape, under the
        class's `_fake_mode_lock` context (a no-op by default). On real tensors it makes its own fake mode, whose
        ops the recorder does not see; under the simulation's fake mode the recorder would count them: so the
        lock becomes a context that suspends recording."""
        from torch.distributed.tensor._sharding_prop import ShardingPropagator

        self._lock_orig = ShardingPropagator._fake_mode_lock
        ShardingPropagator._fake_mode_lock = self._propagation  # type: ignore[assignment]

    def __exit__(self, *exc):
        if self._lock_orig is not None:
            from torch.distributed.tensor._sharding_prop import ShardingPropagator

            ShardingPropagator._fake_mode_lock = self._lock_orig
            self._lock_orig = None
        if self._resize_orig is not None:
            torch.UntypedStorage.resize_ = self._resize_orig
            self._resize_orig = None
        return super().__exit__(*exc)

    def _freed(self, rec: StorageRecord, _ref) -> None:
        self._on_free(rec)

    def _on_free(self, rec: StorageRecord) -> None:
        left = self._num_storages.get(id(rec), 1) - 1
        if left > 0:
            self._num_storages[id(rec)] = left
            return
        super()._on_free(rec)

    def _alias_wait(self, tensor: torch.Tensor, out: torch.Tensor) -> None:
        """A functional collective's `wait_tensor` returns its input on real tensors, a new tensor on fake ones:
        count that one buffer once, alive while either tensor is."""
        st_in, st_out = tensor.untyped_storage(), out.untyped_storage()
        rec_in, rec_out = self._by_storage.get(st_in), self._by_storage.get(st_out)
        if (
            rec_in is None
            or rec_out is None
            or rec_in is rec_out
            or not self.records
            or self.records[-1] is not rec_out
        ):
            return
        self.records.pop()
        self._by_storage[st_out] = rec_in
        self._num_storages[id(rec_in)] = self._num_storages.get(id(rec_in), 1) + 1
        self._refs.append(weakref.ref(st_out, functools.partial(self._freed, rec_in)))

    def _on_resize(self, storage, before: int, after: int) -> None:
        if self.phase == "setup" or before == after:
            return
        rec = self._by_storage.get(storage)
        if after == 0:
            if rec is not None and rec.t_free is None:
                rec.t_free = self.t
            if rec is not None:
                del self._by_storage[storage]
            return
        if rec is not None and before > 0:  # grown in place
            self._record_storage_growth(rec, after)
            return
        phase, group, _layer, _override = self._context()
        new = StorageRecord(nbytes=self._rounded(after), t_alloc=self.t, phase=phase, group=group)
        self.records.append(new)
        self._by_storage[storage] = new
        self._refs.append(weakref.ref(storage, functools.partial(self._freed, new)))
        self.tags[id(new)] = "unsharded_params"
