"""How well the caching allocator's reserve at full depth follows from the two small traced depths.

For each corpus row (ids on the command line, default a mix of methods and stacks), traces the model at one and
two repeating units and at its full depth, replays the caching allocator on each, and prints the full-depth
reserve beside three ways of getting it from the small depths: the reserve extrapolated affinely in the number of
units, the full-depth allocated peak plus the reserve's excess over the allocated peak at two units (what
`simulate_step` stated before `simulate.full_depth`), and what `simulate_step` states (the allocator replayed over
the step made whole).

    PYTHONPATH=src .venv/bin/python benchmarks/bench_reserved_extrapolation.py [ROW_ID ...]
"""

from __future__ import annotations

import sys
import time

from tunecost.models.anatomy import layer_pattern
from tunecost.models.catalog import resolve_model
from tunecost.simulate import simulate_step
from tunecost.simulate.pool import prepared_model
from tunecost.simulate.trace import trace_step
from tunecost.validate.corpus import read_corpus
from tunecost.validate.mapping import map_row

GIB = 2**30
DEFAULT_ROWS = ("fms-14", "fms-33", "fms-63", "fms-75", "qwen-01", "qwen-85", "swift-01")


def _peaks(job, units: int, stack: str) -> tuple[int, int]:
    trace = trace_step(prepared_model(job.with_(stack=stack), units), job.batch_size, job.worst_case_seq_len)
    return max(s.total for s in trace.segments.values()), trace.peak_reserved_bytes


def main(row_ids: list[str]) -> None:
    rows = {r.id: r for r in read_corpus()}
    columns = ("alloc GiB", "reserved", "affine", "excess@2", "tunecost")
    print(f"{'row':10} {'units':>5} " + " ".join(f"{c:>9}" for c in columns) + f" {'s':>6}")
    for row_id in row_ids:
        mapped = map_row(rows[row_id])
        if mapped.num_gpus > 1:
            print(f"{row_id:10} skipped: a {mapped.num_gpus}-GPU row (this compares single-GPU steps)")
            continue
        job, stack = mapped.job, mapped.stack.simulator_stack or "tunecost"
        _, _, full = layer_pattern(resolve_model(job.model))
        start = time.perf_counter()
        (_, r1), (a2, r2), (af, rf) = (_peaks(job, u, stack) for u in (1, 2, full))
        affine = r1 + (r2 - r1) * (full - 1)
        stated = simulate_step(job.with_(stack=stack), use_cache=False).peak_reserved_bytes
        print(
            f"{row_id:10} {full:5d} {af / GIB:9.3f} {rf / GIB:9.3f} {affine / GIB:9.3f} {(af + r2 - a2) / GIB:9.3f} "
            f"{stated / GIB:9.3f} "
            f"{time.perf_counter() - start:6.1f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:] or list(DEFAULT_ROWS))
