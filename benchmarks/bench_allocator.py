"""The caching allocator's replay (`tunecost.simulate.allocator`) at another revision and in this tree, side by
side on the same random malloc/free traces: seconds per trace without a capacity (as a rank's replay runs), and
whether both return the same addresses, counters and out-of-memory errors, with and without a capacity.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_allocator.py --base 8d266b3 [--ops 300000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from tunecost.simulate import allocator as this_tree

ROOT = Path(__file__).resolve().parents[1]


def module_at(rev: str) -> ModuleType:
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:src/tunecost/simulate/allocator.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "allocator_base.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("allocator_base", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trace(seed: int, ops: int) -> list[tuple[int, int]]:
    """(bytes, stream) to allocate, or (-index, 0) to free the index-th live block: small, mid and large requests
    on three streams, about as many frees as allocations."""
    rng, out, live = random.Random(seed), [], 0
    for _ in range(ops):
        if live and rng.random() < 0.48:
            out.append((-rng.randrange(live), 0))
            live -= 1
            continue
        k = rng.random()
        size = (
            rng.randint(1, 4096)
            if k < 0.5
            else rng.randint(4096, 3 * 2**20)
            if k < 0.9
            else rng.randint(2**20, 40 * 2**20)
        )
        out.append((size, rng.choice((0, 0, 0, 1, 2))))
        live += 1
    return out


def replay(module: ModuleType, events: list[tuple[int, int]], capacity: int | None) -> tuple[float, tuple]:
    """Seconds to replay `events`, and what the replay returned and counted."""
    alloc, live, addresses = module.CachingAllocator(capacity), [], []
    start = time.perf_counter()
    for size, stream in events:
        if size > 0:
            try:
                live.append(alloc.malloc(size, stream))
            except module.AllocatorOutOfMemory as exc:
                addresses.append(str(exc))
                live.append(None)  # nothing to free
            continue
        j = -size
        live[j], live[-1] = live[-1], live[j]
        block = live.pop()
        if block is not None:
            alloc.free(block)
    seconds = time.perf_counter() - start
    counters = (alloc.reserved_bytes, alloc.peak_reserved_bytes, alloc.peak_allocated_bytes, alloc.peak_requested_bytes)
    counters += (alloc.num_segments_released, alloc.stream_reserved_bytes, alloc.stream_peak_requested_bytes)
    return seconds, (tuple(live), tuple(addresses), counters)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the revision to compare with")
    parser.add_argument("--ops", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base = module_at(args.base)
    same, times = True, {"base": [], "this": []}
    for r in range(args.rounds):
        for capacity in (None, 2**30):
            events = trace(r, args.ops)
            t_base, out_base = replay(base, events, capacity)
            t_this, out_this = replay(this_tree, events, capacity)
            same &= out_base == out_this
            if capacity is None:  # at a capacity, most of the time is the release of cached segments per refusal
                times["base"].append(t_base)
                times["this"].append(t_this)
    b, t = sorted(times["base"])[len(times["base"]) // 2], sorted(times["this"])[len(times["this"]) // 2]
    print(f"{args.rounds} traces of {args.ops} events, median seconds per trace (and as many at 1 GiB, compared)")
    print(f"| tree | seconds |\n|---|---|\n| {args.base} | {b:.3f} |\n| this tree | {t:.3f} |")
    print(f"speed-up: {b / t:.2f}x; same addresses and counters: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
