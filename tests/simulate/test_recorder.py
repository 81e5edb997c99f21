"""The dispatch-level recorder on hand-checkable computations (fake tensors)."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tunecost.simulate.recorder import LayerPlan, StepRecorder
from tunecost.simulate.trace import analyze


def test_records_allocations_frees_and_peak():
    mode = FakeTensorMode()
    rec = StepRecorder(plan=LayerPlan(0, 1, 1), module_info={})
    with mode:
        w = torch.empty(256, 128)  # 128 KiB, static
    rec.register_static(w, "frozen_weights", "other")
    with mode, rec:
        rec.set_phase("forward")
        x = torch.empty(64, 256)  # 64 KiB
        y = x @ w  # 32 KiB
        z = torch.relu(y)  # 32 KiB
        del y  # freed inside the forward: a temporary
        rec.set_phase("backward")
        del x
        u = z * 2  # 32 KiB, backward temporary
    rec.finish()
    result = analyze(rec, num_layers=0, seconds=0.0)
    peak = max(s.total for s in result.segments.values())
    # static 128 KiB + x 64 + y 32 + z 32 (y is freed after relu runs)
    assert peak == (128 + 64 + 32 + 32) * 1024
    fwd = result.segments["forward:pre"]
    assert fwd.by_category["frozen_weights"] == 128 * 1024
    # z survives the forward (an activation); x and y are freed before/at the end of it
    bwd = result.segments["backward:post"]
    assert bwd.by_category["activations"] == 32 * 1024  # z
    assert bwd.by_category["temporaries"] == 32 * 1024  # u
    # FLOPs of the one matmul: 2 * 64 * 256 * 128 (outside any module: counted with the loss / lm_head)
    assert result.flops[("forward", "lm_head")] == 2 * 64 * 256 * 128
    assert result.flops[("backward", "elementwise")] == 64 * 128  # u = z * 2
    del z, u


def test_storage_shared_by_views_counts_once():
    mode = FakeTensorMode()
    rec = StepRecorder(plan=LayerPlan(0, 1, 1), module_info={})
    with mode, rec:
        rec.set_phase("forward")
        a = torch.empty(1000)
        b = a.view(10, 100)
        c = b.t()
        a.add_(1.0)
    rec.finish()
    assert sum(r.nbytes for r in rec.records) == 4000
    del a, b, c
