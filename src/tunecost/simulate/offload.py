"""Activation offload as torchtune runs it (`torchtune.training.OffloadActivations`, and TRL's port of it), on the
simulator's tensors.

Sources and derivations: docs/memory-model.md, section `tunecost.simulate.offload`.
"""

from __future__ import annotations

from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tunecost.errors import TunecostError
from tunecost.simulate.quant4bit import is_fake

if TYPE_CHECKING:
    from collections.abc import Iterator

    from torch import nn

MIN_OFFLOAD_BYTES = 1024  # OffloadActivations' min_offload_size default
FORWARD_STASH = 5  # OffloadActivations' max_fwd_stash_size default


@dataclass(frozen=True)
class _OnHost:
    """A saved tensor that went to host memory: what is needed to bring it back."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device


class ActivationOffload:
    """The saved-tensor hooks of `OffloadActivations` over one forward; `static` are the parameters and buffers
    (never offloaded). Use `forward()` around the model's forward and `kept_on_device()` around the output
    projection."""

    def __init__(self, static: list[torch.Tensor]) -> None:
        self._static = {id(t.untyped_storage()) for t in static}
        self._stash: deque[torch.Tensor] = deque(maxlen=FORWARD_STASH)
        self._enabled = True

    def _pack(self, t: torch.Tensor) -> Any:
        if not self._enabled or t.numel() * t.element_size() < MIN_OFFLOAD_BYTES:
            return t
        if id(t.untyped_storage()) in self._static:
            return t
        self._stash.append(t)  # the forward stash; the oldest drops out as a sixth arrives
        return _OnHost(tuple(t.shape), tuple(t.stride()), t.dtype, t.device)

    def _unpack(self, packed: Any) -> torch.Tensor:
        self._stash.clear()  # backward's first unpacking node waits on the stash's copies and drops it
        if isinstance(packed, _OnHost):
            return torch.empty_strided(packed.shape, packed.stride, dtype=packed.dtype, device=packed.device)
        return packed

    @contextmanager
    def forward(self) -> Iterator[None]:
        """The hooks over the model's forward: the stash outlives it (through the loss) until backward starts
        unpacking, as torchtune's does."""
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield

    @contextmanager
    def trainer_step(self, head: nn.Module) -> Iterator[None]:
        """TRL's `get_act_offloading_ctx_manager` around SFTTrainer's step: the hooks over the forward and the loss,
        and `NoOpManager` entered and left by hooks on the output head whenever it runs."""
        handles = [
            head.register_forward_pre_hook(lambda *_: setattr(self, "_enabled", False)),
            head.register_forward_hook(lambda *_: setattr(self, "_enabled", True), always_call=True),
        ]
        try:
            with self.forward():
                yield
        finally:
            for handle in handles:
                handle.remove()

    @contextmanager
    def kept_on_device(self) -> Iterator[None]:
        """torchtune's `NoOpManager` around the output projection."""
        self._enabled = False
        try:
            yield
        finally:
            self._enabled = True


def check_fake(model: nn.Module) -> None:
    """Activation offload is simulated on fake tensors only: its host copies keep no values."""
    if not any(is_fake(p) for p in model.parameters()):
        raise TunecostError("activation offload is simulated only (fake tensors), not measured on real tensors")
