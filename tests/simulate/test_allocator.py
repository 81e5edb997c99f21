"""The caching-allocator replay against sequences worked by hand from the rules of
`c10/cuda/CUDACachingAllocator.cpp` (round_size, get_allocation_size, get_free_block, should_split, free_block,
release_cached_blocks), and properties over random sequences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tunecost.simulate.allocator import (
    KIND_INPUT,
    KIND_OPTIMIZER_STATE,
    KIND_STEP,
    KIND_WEIGHT,
    NEVER_FREED,
    AllocatorOutOfMemory,
    CachingAllocator,
    event_order,
    round_size_bytes,
    segment_bytes,
    steady_state_replay,
    steady_state_reserved_bytes,
)

KIB, MIB = 2**10, 2**20


def test_sizes_and_segments() -> None:
    assert [round_size_bytes(n) for n in (1, 512, 513, 1000)] == [512, 512, 1024, 1024]
    assert segment_bytes(MIB) == 2 * MIB  # small pool: up to 1 MiB
    assert segment_bytes(MIB + 512) == 20 * MIB  # large, under 10 MiB
    assert segment_bytes(10 * MIB - 512) == 20 * MIB
    assert segment_bytes(10 * MIB) == 10 * MIB  # from 10 MiB: the request rounded up to 2 MiB
    assert segment_bytes(11 * MIB) == 12 * MIB


def test_small_tensors_share_a_two_mib_segment() -> None:
    alloc = CachingAllocator()
    for _ in range(2048):  # 2048 x 1 KiB = 2 MiB: the first segment, split 2047 times, holds them all
        alloc.malloc(KIB)
    assert alloc.reserved_bytes == 2 * MIB
    alloc.malloc(KIB)  # no cached block left: a second segment
    assert alloc.reserved_bytes == 4 * MIB
    assert alloc.allocated_bytes == 2049 * KIB


def test_a_small_request_under_512_bytes_takes_a_granule() -> None:
    alloc = CachingAllocator()
    alloc.malloc(1)
    assert (alloc.allocated_bytes, alloc.reserved_bytes) == (512, 2 * MIB)


def test_requests_under_10_mib_share_a_20_mib_segment() -> None:
    alloc = CachingAllocator()
    alloc.malloc(5 * MIB)  # 20 MiB segment, split: 15 MiB cached
    alloc.malloc(5 * MIB)  # takes the 15 MiB remainder, split: 10 MiB cached
    alloc.malloc(5 * MIB)  # 10 MiB -> 5 MiB cached (more than 1 MiB: split)
    alloc.malloc(5 * MIB)  # the last 5 MiB block, exactly
    assert alloc.reserved_bytes == 20 * MIB
    alloc.malloc(5 * MIB)
    assert alloc.reserved_bytes == 40 * MIB


def test_a_remainder_of_at_most_1_mib_is_not_split_off() -> None:
    alloc = CachingAllocator()
    alloc.malloc(19 * MIB)  # segment 20 MiB; remainder 1 MiB is not > 1 MiB: the whole block is used
    assert (alloc.allocated_bytes, alloc.reserved_bytes) == (20 * MIB, 20 * MIB)
    alloc.malloc(2 * MIB)  # nothing cached: a new 20 MiB segment
    assert alloc.reserved_bytes == 40 * MIB


def test_a_freed_block_serves_a_smaller_request_with_a_split() -> None:
    alloc = CachingAllocator()
    alloc.free(alloc.malloc(100 * MIB))  # one 100 MiB segment, cached
    alloc.malloc(60 * MIB)  # best fit: the 100 MiB block, split; 40 MiB stay cached
    alloc.malloc(40 * MIB)  # the remainder
    assert alloc.reserved_bytes == 100 * MIB
    alloc.malloc(2 * MIB)
    assert alloc.reserved_bytes == 120 * MIB


def test_best_fit_takes_the_smallest_block_that_fits() -> None:
    alloc = CachingAllocator()
    big, small = alloc.malloc(100 * MIB), alloc.malloc(30 * MIB)
    alloc.free(big)
    alloc.free(small)
    alloc.malloc(30 * MIB)  # the 30 MiB block, not a split of the 100 MiB one
    alloc.malloc(100 * MIB)  # so the 100 MiB block is still whole
    assert alloc.reserved_bytes == 130 * MIB


def test_freed_neighbours_merge() -> None:
    alloc = CachingAllocator()
    a, b, _c = (alloc.malloc(5 * MIB) for _ in range(3))  # one 20 MiB segment: a b c + 5 MiB free
    alloc.free(a)
    alloc.free(b)  # a and b merge into one free 10 MiB block
    alloc.malloc(10 * MIB)  # fits the merged block: no new segment
    assert alloc.reserved_bytes == 20 * MIB


def test_no_reuse_across_pools() -> None:
    alloc = CachingAllocator()
    alloc.free(alloc.malloc(MIB))  # small pool: a 2 MiB segment, cached
    alloc.malloc(MIB + 512)  # large pool: a 20 MiB segment, though 2 MiB are cached
    assert alloc.reserved_bytes == 22 * MIB
    alloc.free(alloc.malloc(5 * MIB))
    alloc.malloc(MIB)  # the cached 2 MiB small segment (not the large pool's free remainder of 18.9 MiB)
    alloc.malloc(MIB)
    alloc.malloc(512)  # the small segment is full: a new one
    assert alloc.reserved_bytes == 24 * MIB


def test_a_block_cached_for_one_stream_never_serves_another() -> None:
    """ "Once freed, blocks can be re-allocated on the same stream, but not on any other stream" (the header of
    CUDACachingAllocator.cpp); a block returns to the cache of the stream that allocated it, whoever frees it."""
    alloc = CachingAllocator()
    alloc.free(alloc.malloc(100 * MIB, stream=0))  # one 100 MiB segment, cached for stream 0
    on_1 = alloc.malloc(60 * MIB, stream=1)  # stream 1 cannot take it: a 60 MiB segment of its own
    assert alloc.reserved_bytes == 160 * MIB
    alloc.malloc(60 * MIB, stream=0)  # stream 0 takes its cached block (split: 40 MiB stay cached)
    alloc.free(on_1)
    alloc.malloc(40 * MIB, stream=1)  # stream 1's freed 60 MiB block (split): nothing new
    alloc.malloc(40 * MIB, stream=0)  # stream 0's 40 MiB remainder
    assert (alloc.reserved_bytes, alloc.allocated_bytes) == (160 * MIB, 140 * MIB)
    alloc.malloc(20 * MIB, stream=0)  # stream 1's 20 MiB remainder is not stream 0's: a new segment
    assert alloc.reserved_bytes == 180 * MIB


def test_separate_streams_add_their_pools_to_the_reserve() -> None:
    """A 100 MiB buffer on stream 1 (ops 1-2), then a 100 MiB activation on stream 0 (ops 3-4): on one stream
    the second reuses the first's cached segment (100 MiB reserved); on two, each stream keeps its own
    (200 MiB), while the live requests never exceed 100 MiB either way."""
    nbytes = np.array([100, 100]) * MIB
    kind = np.array([KIND_STEP, KIND_STEP])
    t_alloc, t_free = np.array([1, 3]), np.array([2, 4])
    one = steady_state_replay(nbytes, t_alloc, t_free, kind, t_optimizer=5)
    two = steady_state_replay(nbytes, t_alloc, t_free, kind, t_optimizer=5, stream=np.array([1, 0]))
    assert (one.peak_reserved_bytes, two.peak_reserved_bytes) == (100 * MIB, 200 * MIB)
    assert one.peak_requested_bytes == two.peak_requested_bytes == 100 * MIB
    assert two.stream_reserved_bytes == two.stream_peak_requested_bytes == {0: 100 * MIB, 1: 100 * MIB}


def test_requested_bytes_count_rounded_requests_not_unsplit_remainders() -> None:
    alloc = CachingAllocator()
    alloc.malloc(19 * MIB)  # a 20 MiB segment kept whole (remainder 1 MiB): allocated 20, requested 19
    alloc.malloc(1)  # one 512-byte granule
    assert (alloc.allocated_bytes, alloc.requested_bytes) == (20 * MIB + 512, 19 * MIB + 512)


def test_capacity_releases_whole_cached_segments_then_fails() -> None:
    alloc = CachingAllocator(capacity_bytes=100 * MIB)
    alloc.free(alloc.malloc(60 * MIB))  # cached, unsplit
    alloc.malloc(80 * MIB)  # 60 + 80 > 100: the cached 60 MiB segment is released, then 80 fits
    assert (alloc.reserved_bytes, alloc.peak_reserved_bytes, alloc.num_segments_released) == (80 * MIB, 80 * MIB, 1)
    alloc.malloc(5 * MIB)  # 80 + 20 = 100: fits (a 20 MiB segment, split: 15 MiB cached)
    with pytest.raises(AllocatorOutOfMemory):
        alloc.malloc(16 * MIB)  # the 15 MiB block is too small and its segment is split: nothing to release


def test_event_order_allocates_before_it_frees_at_each_op() -> None:
    t_alloc = np.array([1, 1, 2])
    t_free = np.array([2, NEVER_FREED, 2])
    idx, times = event_order(t_alloc, t_free)
    assert idx.tolist() == [0, 1, 2, 0, 2] and times.tolist() == [1, 1, 2, 2, 2]


def test_steady_state_places_the_optimizer_states_in_the_first_step() -> None:
    """Weights 60 MiB; the step allocates a 100 MiB temporary (op 1, freed at op 2); the optimizer (op 3)
    adds 60 MiB of states on the first step. They land in the freed 100 MiB block (split, 40 MiB cached), so
    the second step's 100 MiB temporary needs a new segment: 60 + 100 + 100 MiB reserved; states loaded with
    the weights would have left the 100 MiB block whole (60 + 60 + 100)."""
    nbytes = np.array([60, 60, 1, 100]) * MIB
    kind = np.array([KIND_WEIGHT, KIND_OPTIMIZER_STATE, KIND_INPUT, KIND_STEP])
    t_alloc = np.array([0, 0, 0, 1])
    t_free = np.array([NEVER_FREED, NEVER_FREED, NEVER_FREED, 2])
    reserved = steady_state_reserved_bytes(nbytes, t_alloc, t_free, kind, t_optimizer=3)
    assert reserved == (60 + 100 + 100 + 2) * MIB  # + the 1 MiB batch's small-pool segment


ops = st.lists(st.tuples(st.booleans(), st.integers(1, 40 * MIB), st.integers(0, 10**6)), min_size=1, max_size=120)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(1, 3))
def test_reserved_covers_allocated_and_frees_back_to_whole_segments(seq, num_streams) -> None:
    """On any number of streams (each request's stream drawn from its size): per stream and in all, the reserve
    covers the live blocks; freeing everything merges every segment back whole."""
    alloc = CachingAllocator()
    live: list[tuple[int, int, int]] = []
    for is_free, nbytes, pick in seq:
        if is_free and live:
            alloc.free(live.pop(pick % len(live))[0])
        else:
            stream = nbytes % num_streams
            live.append((alloc.malloc(nbytes, stream), round_size_bytes(nbytes), stream))
        assert alloc.allocated_bytes >= alloc.requested_bytes == sum(size for _, size, _ in live)
        assert alloc.reserved_bytes >= alloc.allocated_bytes
        assert alloc.reserved_bytes == sum(alloc.stream_reserved_bytes.values())
        for stream, requested in alloc.stream_requested_bytes.items():
            assert alloc.stream_reserved_bytes[stream] >= requested
        assert alloc.peak_reserved_bytes >= alloc.peak_allocated_bytes >= alloc.peak_requested_bytes
    for addr, _, _ in live:
        alloc.free(addr)
    alloc.release_cached_segments()  # every block merged back into its segment: all of them released
    assert (alloc.allocated_bytes, alloc.reserved_bytes) == (0, 0)
    assert set(alloc.stream_reserved_bytes.values()) <= {0}


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 40 * MIB), st.lists(st.booleans(), min_size=1, max_size=200))
def test_one_size_reserves_whole_segments_for_the_live_peak(nbytes, frees) -> None:
    """With one request size s, blocks sit at multiples of s in their segments, so every free piece of a
    segment is a multiple of s (plus the unsplittable tail) and a new segment is reserved only when every
    segment is full: k = segment // s blocks each. Reserved = ceil(peak live / k) segments."""
    alloc = CachingAllocator()
    live: list[int] = []
    peak = 0
    for is_free in frees:
        if is_free and live:
            alloc.free(live.pop(0))
        else:
            live.append(alloc.malloc(nbytes))
        peak = max(peak, len(live))
    s, seg = round_size_bytes(nbytes), segment_bytes(round_size_bytes(nbytes))
    per_segment = seg // s
    assert alloc.peak_reserved_bytes == -(-peak // per_segment) * seg


def test_a_full_depth_step_reserves_whole_segments(config_path) -> None:
    """Every segment is 2 MiB, 20 MiB or a request rounded up to 2 MiB, so the replayed reserve of a full trace
    is a whole number of 2 MiB and at least the allocated peak."""
    from tunecost.simulate import simulate_step
    from tunecost.workload.job import FineTuneJob

    for method in ("lora", "full"):
        job = FineTuneJob(model=config_path("small-mixtral"), method=method, batch_size=2, seq_len=64)
        sim = simulate_step(job, num_layers_to_trace=99, use_cache=False)
        assert sim.layers_traced == (6,)
        assert sim.peak_reserved_bytes % (2 * MIB) == 0 and sim.peak_reserved_bytes >= sim.peak_bytes


def test_scaled_reserve_keeps_the_deeper_traces_excess() -> None:
    """combine: the full-depth reserve is the scaled allocated peak plus the reserve's excess over the allocated
    peak at the deeper traced depth (one unit: peak 10, two units: peak 14 -> 6 units: 10 + 5 x 4 = 30; the
    two-unit reserve 20 exceeds its peak 14 by 6 -> 36)."""
    from tunecost.simulate.simulator import combine
    from tunecost.simulate.trace import SegmentPeak, TraceResult

    def trace(units: int, peak: int, reserved: int) -> TraceResult:
        seg = {"backward:unit_last": SegmentPeak(total=peak, by_category={"activations": peak}, by_group={})}
        return TraceResult(
            num_layers=units,
            num_units=units,
            segments=seg,
            flops={},
            bytes={},
            flops_by_group={},
            weight_bytes={},
            seconds=0.0,
            peak_reserved_bytes=reserved,
        )

    parts = combine(trace(1, 10, 12), trace(2, 14, 20), full_units=6, full_layers=6)
    assert (parts["peak_bytes"], parts["peak_reserved_bytes"]) == (30, 36)
