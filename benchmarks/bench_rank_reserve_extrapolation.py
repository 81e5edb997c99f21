"""How well a rank's reserve at full depth follows from the traced depths (`distributed.rank_reserve`).

For each corpus row on several GPUs (ids on the command line, default a mix of methods), builds the single-GPU
step traced at one and two units (what tunecost uses) and traced at full depth, and prints one rank's allocated
peak, the reserve tunecost states (the compute stream's full-depth peak plus its excess replayed over the step
made whole, `simulate.full_depth`; the side streams' pools laid out at full depth), the same composition from the
full-depth trace, and the caching
allocator replayed over the rank's whole full-depth allocations on every stream at once.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_rank_reserve_extrapolation.py [ROW_ID ...]
"""

from __future__ import annotations

import sys
import time

from tunecost.distributed.rank_memory import rank_memory, single_gpu_step
from tunecost.distributed.rank_reserve import rank_allocations
from tunecost.distributed.single_step import trace_single_gpu_step
from tunecost.simulate.allocator import steady_state_replay
from tunecost.simulate.step_types import AllocationTrace
from tunecost.validate.corpus import read_corpus
from tunecost.validate.mapping import map_row
from tunecost.workload.parallel import ParallelPlan

GIB = 2**30
DEFAULT_ROWS = ("fms-16", "fms-22", "fms-36", "fms-60", "fms-134")


def full_depth_replay_bytes(step, job, plan) -> int:
    """The caching allocator over the rank's allocations of a full-depth trace, every stream at once."""
    a = rank_allocations(step, job, plan)
    t_optimizer = AllocationTrace(**step.allocations).t_optimizer
    replay = steady_state_replay(a["nbytes"], a["t_alloc"], a["t_free"], a["kind"], t_optimizer, stream=a["stream"])
    return replay.peak_reserved_bytes


def main(row_ids: list[str]) -> None:
    rows = {r.id: r for r in read_corpus()}
    print(f"{'row':8} {'layers':>6} {'alloc GiB':>9} {'tunecost':>9} {'full comp':>9} {'full replay':>11} {'s':>6}")
    for row_id in row_ids:
        mapped = map_row(rows[row_id])
        if mapped.num_gpus == 1:
            print(f"{row_id:8} skipped: a single-GPU row (bench_reserved_extrapolation.py compares those)")
            continue
        assert mapped.strategy is not None
        job = mapped.job.with_(stack=mapped.stack.simulator_stack or "tunecost")
        plan = ParallelPlan(num_gpus=mapped.num_gpus, gpus_per_node=mapped.num_gpus, strategy=mapped.strategy)
        start = time.perf_counter()
        stated = rank_memory(single_gpu_step(job, behaviour=mapped.behaviour), job, plan)
        full_step = trace_single_gpu_step(job, 512, mapped.behaviour, full_depth=True)
        full = rank_memory(full_step, job, plan)
        replayed = full_depth_replay_bytes(full_step, job, plan)
        print(
            f"{row_id:8} {full_step.num_layers:6d} {stated.peak_bytes / GIB:9.3f} "
            f"{stated.peak_reserved_bytes / GIB:9.3f} {full.peak_reserved_bytes / GIB:9.3f} {replayed / GIB:11.3f} "
            f"{time.perf_counter() - start:6.1f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:] or list(DEFAULT_ROWS))
