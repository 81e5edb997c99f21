"""Collective times from nccl-tests' bus-bandwidth definitions, checked by hand."""

from __future__ import annotations

import pytest

from tunecost.distributed.comm import (
    all_gather_seconds,
    all_reduce_seconds,
    all_to_all_seconds,
    collective_seconds,
    collectives_seconds,
    inter_node_bus_bandwidth_bytes_per_s,
    reduce_scatter_seconds,
)
from tunecost.distributed.recorder import Collective
from tunecost.errors import TunecostError

GB = 1e9


def test_all_reduce_moves_twice_the_ring_share():
    # 8 ranks, 1 GB, busbw 100 GB/s: 2 * 7/8 * 1e9 / 1e11 = 17.5 ms, plus 20 us latency
    assert all_reduce_seconds(1 * GB, 8, 100 * GB, 20e-6) == pytest.approx(0.0175 + 20e-6)


def test_all_gather_reduce_scatter_all_to_all_move_one_ring_share():
    # 4 ranks, 2 GB at 50 GB/s: 3/4 * 2e9 / 5e10 = 30 ms
    assert all_gather_seconds(2 * GB, 4, 50 * GB) == pytest.approx(0.030)
    assert reduce_scatter_seconds(2 * GB, 4, 50 * GB) == pytest.approx(0.030)
    assert all_to_all_seconds(2 * GB, 4, 50 * GB) == pytest.approx(0.030)


def test_one_rank_communicates_nothing():
    assert all_reduce_seconds(1 * GB, 1, 100 * GB, 1e-3) == 0.0


def test_unknown_collective_and_bad_arguments():
    with pytest.raises(TunecostError, match="unknown collective"):
        collective_seconds("gossip", 1, 2, 1.0)
    with pytest.raises(TunecostError, match="positive bandwidth"):
        all_reduce_seconds(1, 2, 0.0)


def test_inter_node_bandwidth_adds_the_nics():
    assert inter_node_bus_bandwidth_bytes_per_s(48 * GB, 8) == 384 * GB


def test_recorded_collectives_sum_per_phase():
    calls = [
        Collective(op="all_gather", group_size=2, nbytes=4 * GB, dtype="bfloat16", phase="forward", layer=0),
        Collective(op="all_gather", group_size=2, nbytes=4 * GB, dtype="bfloat16", phase="backward", layer=0),
        Collective(op="reduce_scatter", group_size=2, nbytes=4 * GB, dtype="bfloat16", phase="backward", layer=0),
    ]
    # each: 1/2 * 4e9 / 1e11 = 20 ms
    assert collectives_seconds(calls, 100 * GB) == pytest.approx({"forward": 0.020, "backward": 0.040})
