"""PeakMemoryTracker counts new storages live in the window, not views, in-place results or older tensors."""

from __future__ import annotations

import torch

from tunecost.moe.memory import PeakMemoryTracker

MB4 = 1000 * 1000 * 4


def test_peak_and_live_bytes():
    w = torch.randn(1000, 1000, requires_grad=True)  # allocated before: not counted
    with PeakMemoryTracker() as tracker:
        a = torch.randn(1000, 1000)
        b = a @ w
        del a  # still saved by autograd for w's gradient
        b.t()  # a view: no new storage
        b.add_(1)  # in place: no new storage
        b.sum().backward()  # w.grad is new; a is released after the backward
        live = tracker.live_bytes
    assert tracker.peak_bytes == 3 * MB4 + 4 + 4  # a, b, w.grad (+ two scalars: the sum and its gradient)
    assert live == 2 * MB4  # b and w.grad; a and the scalars are gone
