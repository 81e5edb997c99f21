"""Peak bytes allocated by tensors inside a window, on any device, at the dispatcher level.

CPU has no `max_memory_allocated`, and `torch.distributed._tools.mem_tracker.MemTracker` refuses models with frozen
parameters (every LoRA model). This counts every new tensor storage an operator returns while the mode is active
(outputs that alias an input, views and in-place results, are not new) and subtracts it when the storage is freed,
through a weak-reference finalizer. Tensors alive before the window (weights, inputs) are not counted.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class PeakMemoryTracker(TorchDispatchMode):
    """`with PeakMemoryTracker() as t: ...` then `t.peak_bytes` (and `t.live_bytes`, still allocated at exit)."""

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._seen: dict[int, int] = {}  # storage data_ptr -> bytes, for storages allocated in the window
        self._active = True

    def _release(self, key: int, nbytes: int) -> None:
        if self._active and self._seen.get(key) == nbytes:
            del self._seen[key]
            self.live_bytes -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and t.device.type != "meta"
        }
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or key in inputs or key in self._seen:
                continue
            self._seen[key] = nbytes
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            weakref.finalize(storage, self._release, key, nbytes)
        return out

    def __exit__(self, *exc):
        self._active = False
        return super().__exit__(*exc)
