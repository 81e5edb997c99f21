"""The overlap model, checked against hand-drawn timelines."""

from __future__ import annotations

import pytest

from tunecost.distributed.overlap import ddp_step_seconds, fsdp_step_seconds
from tunecost.errors import TunecostError


def test_fsdp_compute_bound_exposes_first_gather_last_scatter_and_the_backward_gather():
    # 3 units, compute 10 s forward / 20 s backward each, AG 2 s, RS 3 s, optimizer 1 s.
    # forward: AG0 (2) + 10 + 10 + 10 = 32; backward: AG2 (2) + 20 + 20 + 20 + RS0 (3) = 65; + 1
    t = fsdp_step_seconds([10] * 3, [20] * 3, [2] * 3, [3] * 3, 1.0)
    assert t.step_seconds == pytest.approx(32 + 65 + 1)
    assert t.compute_seconds == pytest.approx(30 + 60 + 1)
    assert t.exposed_comm_seconds == pytest.approx(2 + 2 + 3)


def test_fsdp_comm_bound_queues_gather_and_scatter_on_one_communicator():
    # compute 1 s per unit both ways, AG 4 s, RS 5 s, 2 units, no optimizer time
    # forward: AG0 4 + max(1, AG1 4) + 1 = 9
    # backward: AG1 4 + unit1 max(1, AG0 4 + 0) + unit0 max(1, 0 + RS1 5) + RS0 5 = 18
    t = fsdp_step_seconds([1, 1], [1, 1], [4, 4], [5, 5], 0.0)
    assert t.step_seconds == pytest.approx(9 + 18)
    assert t.exposed_comm_share == pytest.approx((27 - 4) / 27)


def test_shard_grad_op_gathers_only_in_forward():
    t = fsdp_step_seconds([10] * 3, [20] * 3, [2] * 3, [3] * 3, 0.0, reshard_after_forward=False)
    assert t.step_seconds == pytest.approx(32 + 60 + 3)


def test_ddp_hides_all_but_the_last_bucket():
    # backward 10 s, buckets 3 + 3 + 2: the first two hide, the last (2 s) is exposed
    assert ddp_step_seconds(5.0, 10.0, [3, 3, 2], 1.0).step_seconds == pytest.approx(5 + 10 + 2 + 1)
    # buckets longer than backward: the queue extends it
    assert ddp_step_seconds(5.0, 4.0, [3, 3, 2], 0.0).step_seconds == pytest.approx(5 + 6 + 2)
    assert ddp_step_seconds(5.0, 4.0, [], 0.0).exposed_comm_seconds == 0.0


def test_bad_inputs():
    with pytest.raises(TunecostError, match="same length"):
        fsdp_step_seconds([1], [1, 2], [1], [1], 0.0)
    with pytest.raises(TunecostError, match="non-negative"):
        ddp_step_seconds(1.0, 1.0, [-1.0], 0.0)
