"""A replay of PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`, native backend, default
settings) over an ordered trace of allocations and frees: what `torch.cuda.memory_reserved` would show.

Sources and derivations: docs/memory-model.md, section `tunecost.simulate.allocator`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from tunecost.errors import TunecostError

MIN_BLOCK_BYTES = 512  # kMinBlockSize: every size is rounded up to a multiple of it
SMALL_REQUEST_BYTES = 2**20  # kSmallSize: requests up to 1 MiB use the small pool
SMALL_SEGMENT_BYTES = 2 * 2**20  # kSmallBuffer: small-pool segments are 2 MiB
LARGE_SEGMENT_BYTES = 20 * 2**20  # kLargeBuffer: large requests under 10 MiB get a 20 MiB segment
MIN_LARGE_ALLOC_BYTES = 10 * 2**20  # kMinLargeAlloc
ROUND_LARGE_BYTES = 2 * 2**20  # kRoundLarge: larger requests get a segment rounded up to 2 MiB
_SEGMENT_GAP = MIN_BLOCK_BYTES  # address gap between segments, so that blocks of two segments never touch


class AllocatorOutOfMemory(TunecostError):
    """The replayed allocator could not reserve a segment within the device capacity."""


def round_size_bytes(nbytes: int) -> int:
    """`round_size`: a request rounded up to a multiple of 512 bytes (at least 512)."""
    return max(MIN_BLOCK_BYTES, -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES)


def is_small_request(size_bytes: int) -> bool:
    return size_bytes <= SMALL_REQUEST_BYTES


def segment_bytes(size_bytes: int) -> int:
    """`get_allocation_size`: the segment reserved for a (rounded) request no cached block can serve."""
    if is_small_request(size_bytes):
        return SMALL_SEGMENT_BYTES
    if size_bytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_SEGMENT_BYTES
    return -(-size_bytes // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


class CachingAllocator:
    """Blocks addressed by integers; segments laid out at increasing addresses. `malloc` returns a block address
    to pass to `free`. `reserved_bytes` is what `torch.cuda.memory_reserved` reports, `peak_reserved_bytes` its
    maximum (`max_memory_reserved`), `allocated_bytes` the sum of the live blocks (a block not split keeps its
    remainder), `peak_requested_bytes` the most live requests, each rounded to 512 bytes (what the simulated
    trace counts as its allocated peak); `stream_reserved_bytes` and `stream_peak_requested_bytes` split the
    reserve and the peak requests per stream."""

    def __init__(self, capacity_bytes: int | None = None) -> None:
        self.capacity_bytes = capacity_bytes
        self.reserved_bytes = 0
        self.peak_reserved_bytes = 0
        self.allocated_bytes = 0
        self.peak_allocated_bytes = 0
        self.requested_bytes = 0
        self.peak_requested_bytes = 0
        self.num_segments_released = 0
        self.stream_reserved_bytes: dict[int, int] = {}
        self.stream_requested_bytes: dict[int, int] = {}
        self.stream_peak_requested_bytes: dict[int, int] = {}
        self._free: dict[tuple[int, bool], list[tuple[int, int]]] = {}  # (stream, small?) -> sorted (size, addr)
        # block address -> [size, pool (stream, small?), its rounded request (0: a free block)]
        self._blocks: dict[int, list] = {}
        self._end: dict[int, int] = {}  # end address -> address of the block ending there
        self._segment: dict[int, int] = {}  # segment start -> segment size
        self._next_address = 0

    # ---- blocks --------------------------------------------------------------------------------------------
    def _add_free_block(self, addr: int, size: int, pool: tuple[int, bool]) -> None:
        self._blocks[addr] = [size, pool, 0]
        self._end[addr + size] = addr
        cached = self._free.get(pool)
        if cached is None:
            self._free[pool] = [(size, addr)]
        else:
            bisect.insort(cached, (size, addr))

    def _drop_free_block(self, addr: int, size: int, pool: tuple[int, bool]) -> None:
        del self._blocks[addr], self._end[addr + size]
        cached = self._free[pool]
        del cached[bisect.bisect_left(cached, (size, addr))]

    # ---- malloc / free --------------------------------------------------------------------------------------
    def malloc(self, nbytes: int, stream: int = 0) -> int:
        """A block for `nbytes` requested on `stream`: only blocks cached for that stream can serve it."""
        size = MIN_BLOCK_BYTES if nbytes <= MIN_BLOCK_BYTES else -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
        small = size <= SMALL_REQUEST_BYTES
        pool = (stream, small)
        cached = self._free.get(pool)
        i = bisect.bisect_left(cached, (size, -1)) if cached else 0
        if cached and i < len(cached):
            block_size, addr = cached.pop(i)
            del self._blocks[addr], self._end[addr + block_size]
        else:
            block_size = segment_bytes(size)
            addr = self._new_segment(block_size, stream)
        remaining = block_size - size
        if remaining >= MIN_BLOCK_BYTES if small else remaining > SMALL_REQUEST_BYTES:  # should_split
            self._add_free_block(addr + size, remaining, pool)
            block_size = size
        self._blocks[addr] = [block_size, pool, size]
        self._end[addr + block_size] = addr
        self.allocated_bytes += block_size
        if self.allocated_bytes > self.peak_allocated_bytes:
            self.peak_allocated_bytes = self.allocated_bytes
        self.requested_bytes += size
        if self.requested_bytes > self.peak_requested_bytes:
            self.peak_requested_bytes = self.requested_bytes
        live = self.stream_requested_bytes[stream] = self.stream_requested_bytes.get(stream, 0) + size
        if live > self.stream_peak_requested_bytes.get(stream, 0):
            self.stream_peak_requested_bytes[stream] = live
        return addr

    def free(self, addr: int) -> None:
        size, pool, request = self._blocks.pop(addr)
        assert request, "block freed twice"
        del self._end[addr + size]  # back to the cache of the stream that allocated it
        self.allocated_bytes -= size
        self.requested_bytes -= request
        self.stream_requested_bytes[pool[0]] -= request
        prev = self._end.get(addr)
        if prev is not None:
            before = self._blocks[prev]
            if not before[2]:
                self._drop_free_block(prev, before[0], before[1])
                addr, size = prev, before[0] + size
        after = self._blocks.get(addr + size)
        if after is not None and not after[2]:
            self._drop_free_block(addr + size, after[0], after[1])
            size += after[0]
        self._add_free_block(addr, size, pool)

    def _new_segment(self, nbytes: int, stream: int) -> int:
        cap = self.capacity_bytes
        if cap is not None and self.reserved_bytes + nbytes > cap:
            self.release_cached_segments()
            if self.reserved_bytes + nbytes > cap:
                raise AllocatorOutOfMemory(
                    f"cannot reserve a {nbytes / 2**20:.0f} MiB segment: {self.reserved_bytes / 2**20:.0f} MiB "
                    f"reserved of {cap / 2**20:.0f} MiB"
                )
        addr = self._next_address
        self._next_address += nbytes + _SEGMENT_GAP
        self._segment[addr] = nbytes
        self.reserved_bytes += nbytes
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        self.stream_reserved_bytes[stream] = self.stream_reserved_bytes.get(stream, 0) + nbytes
        return addr

    def release_cached_segments(self) -> None:
        """`release_cached_blocks`: return every wholly free (unsplit) cached segment to the driver."""
        for pool, cached in list(self._free.items()):
            for size, addr in list(cached):
                if self._segment.get(addr) == size:
                    self._drop_free_block(addr, size, pool)
                    del self._segment[addr]
                    self.reserved_bytes -= size
                    self.stream_reserved_bytes[pool[0]] -= size
                    self.num_segments_released += 1


def replay_events(
    sizes: Sequence[int], order: Sequence[int], allocator: CachingAllocator, streams: Sequence[int] | None = None
) -> CachingAllocator:
    """Replay an event list on `allocator`: `order` holds record indices, the first occurrence of an index
    allocates `sizes[index]` bytes (on stream `streams[index]`, default 0) and the second frees it."""
    live: dict[int, int] = {}
    malloc, free = allocator.malloc, allocator.free
    for i in order:
        addr = live.pop(i, None)
        if addr is None:
            live[i] = malloc(sizes[i], streams[i]) if streams is not None else malloc(sizes[i])
        else:
            free(addr)
    return allocator


KIND_WEIGHT, KIND_OPTIMIZER_STATE, KIND_INPUT, KIND_STEP = 0, 1, 2, 3
NEVER_FREED = np.iinfo(np.int64).max


def event_order(t_alloc: np.ndarray, t_free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(record indices, op indices) of the events in order: at each op index its allocations (in record order),
    then its frees (in record order); a record never freed (t_free NEVER_FREED) appears once."""
    freed = np.flatnonzero(t_free != NEVER_FREED)
    times = np.concatenate((t_alloc, t_free[freed]))
    keys = np.concatenate((2 * t_alloc, 2 * t_free[freed] + 1))
    idx = np.concatenate((np.arange(len(t_alloc)), freed))
    order = np.argsort(keys, kind="stable")
    return idx[order], times[order]


def steady_state_reserved_bytes(
    nbytes: np.ndarray,
    t_alloc: np.ndarray,
    t_free: np.ndarray,
    kind: np.ndarray,
    t_optimizer: int,
    *,
    max_steps: int = 4,
    capacity_bytes: int | None = None,
) -> int:
    """Peak reserved bytes of a training run whose every step is the recorded one (`steady_state_replay`)."""
    replay = steady_state_replay(
        nbytes, t_alloc, t_free, kind, t_optimizer, max_steps=max_steps, capacity_bytes=capacity_bytes
    )
    return replay.peak_reserved_bytes


def steady_state_replay(
    nbytes: np.ndarray,
    t_alloc: np.ndarray,
    t_free: np.ndarray,
    kind: np.ndarray,
    t_optimizer: int,
    *,
    stream: np.ndarray | None = None,
    max_steps: int = 4,
    capacity_bytes: int | None = None,
) -> CachingAllocator:
    """The allocator after a training run whose every step is the recorded one.

    kind per record: KIND_WEIGHT (loaded before training, never freed), KIND_OPTIMIZER_STATE (allocated by the
    first optimizer step, before the op with index `t_optimizer`, then kept), KIND_INPUT (the batch: allocated
    at the start of each step, freed at its end) or KIND_STEP (the step's own tensors, at their recorded op
    indices; any still alive at the end of the recording is freed with the batch). stream per record: the
    stream that requests it (None: all on stream 0). Steps are replayed until one reserves no new segment (at
    most `max_steps`): the first step differs (it allocates the optimizer states), and the cache it leaves
    shapes the next."""
    alloc = CachingAllocator(capacity_bytes)
    sizes = nbytes.tolist()
    streams = None if stream is None else stream.tolist()
    replay_events(sizes, np.flatnonzero(kind == KIND_WEIGHT).tolist(), alloc, streams)
    step = np.flatnonzero(kind == KIND_STEP)
    order, times = event_order(t_alloc[step], t_free[step])
    events = step[order]
    split_at = int(np.searchsorted(times, t_optimizer, side="left"))
    head, tail = events[:split_at].tolist(), events[split_at:].tolist()
    inputs = np.flatnonzero(kind == KIND_INPUT).tolist()
    ends = inputs + step[t_free[step] == NEVER_FREED].tolist()
    states = np.flatnonzero(kind == KIND_OPTIMIZER_STATE).tolist()
    replay_events(sizes, inputs + head + states + tail + ends, alloc, streams)
    for _ in range(max_steps - 1):
        before = alloc.reserved_bytes
        replay_events(sizes, inputs + head + tail + ends, alloc, streams)
        if alloc.reserved_bytes == before:
            break
    return alloc
