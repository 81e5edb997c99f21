"""FSDP1's held layer inputs in the caching-allocator replay: do they explain the Llama-2-70B rows on 2 GPUs?

tunecost counts FSDP1's held layer inputs (`distributed.fsdp1`) in a rank's allocated peak but not in its replayed
reserve (`distributed.rank_reserve`). This benchmark traces a row's single-GPU step at full depth, finds in the
rank's allocations the records FSDP1 holds (under re-entrant checkpointing the only storage allocated in layer
l-1's forward and freed in layer l's backward is layer l's checkpointed input, and the only one allocated in
layer l's backward and freed in layer l-1's is the gradient of that input), keeps them to the end of backward,
replays the caching allocator over every stream at once, and prints the rank's peak requests and reserve with and
without them, beside what tunecost states (`tunecost validate`: traced at one and two units), the memory outside
the allocator (CUDA context, NCCL) and the GPU's memory. Rows named `ID@B` are the row at B sequences per GPU.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_fsdp1_held_replay.py [ROW_ID[@BATCH] ...]
"""

from __future__ import annotations

import sys
import time

import numpy as np

from tunecost.distributed.rank_memory import rank_memory, single_gpu_step
from tunecost.distributed.rank_reserve import rank_allocations
from tunecost.distributed.single_step import trace_single_gpu_step
from tunecost.simulate.allocator import steady_state_replay
from tunecost.simulate.step_types import AllocationTrace
from tunecost.validate.corpus import CorpusRow, read_corpus
from tunecost.validate.mapping import map_row

GIB = 2**30
DEFAULT_ROWS = ("fms-82", "fms-82@4")


def _within(t: int, window: list[int]) -> bool:
    return 0 <= window[0] <= t <= window[1]


def held_records(trace: AllocationTrace, nbytes: np.ndarray, t_alloc, t_free, per_layer: int) -> list[int]:
    """Indices of the layer inputs and input gradients that FSDP1 keeps to the end of backward."""
    held = []
    for i in np.flatnonzero(nbytes == per_layer):
        for layer in range(1, len(trace.forward_ops)):
            crosses_forward = _within(t_alloc[i], trace.forward_ops[layer - 1]) and _within(
                t_free[i], trace.backward_ops[layer]
            )
            crosses_backward = _within(t_alloc[i], trace.backward_ops[layer]) and _within(
                t_free[i], trace.backward_ops[layer - 1]
            )
            if crosses_forward or crosses_backward:
                held.append(int(i))
                break
    return held


def row(rows: dict[str, CorpusRow], spec: str) -> CorpusRow:
    row_id, _, batch = spec.partition("@")
    base = rows[row_id]
    cells = {**base.cells, "batch_size_per_gpu": batch} if batch else base.cells
    return CorpusRow(path=base.path, line=base.line, cells=cells)


def main(specs: list[str]) -> None:
    rows = {r.id: r for r in read_corpus()}
    print(
        f"{'row':10} {'held GiB':>8} {'peak, no':>8} {'reserve, no':>11} {'peak, held':>10} {'reserve, held':>13} "
        f"{'stated peak':>11} {'stated reserve':>14} {'outside':>7} {'GPU GiB':>7} {'s':>5}"
    )
    for spec in specs:
        mapped = map_row(row(rows, spec))
        if mapped.strategy != "fsdp1":
            print(f"{spec:10} skipped: not a row of the fsdp1 strategy")
            continue
        start = time.perf_counter()
        job, plan = mapped.simulator_job, mapped.plan()
        step = trace_single_gpu_step(job, 512, mapped.behaviour, full_depth=True)
        trace = AllocationTrace(**step.allocations)
        a = rank_allocations(step, job, plan)
        per_layer = step.batch_size * step.seq_len * step.hidden_size * step.activation_bytes_per_element
        held = held_records(trace, a["nbytes"], a["t_alloc"], a["t_free"], per_layer)
        kept = a["t_free"].copy()
        kept[held] = trace.t_optimizer - 1
        out = []
        for t_free in (a["t_free"], kept):
            r = steady_state_replay(a["nbytes"], a["t_alloc"], t_free, a["kind"], trace.t_optimizer, stream=a["stream"])
            out += [r.peak_requested_bytes / GIB, r.peak_reserved_bytes / GIB]
        stated = rank_memory(single_gpu_step(job, behaviour=mapped.behaviour), job, plan)  # as validate states
        outside = (stated.device_overhead_bytes + stated.nccl_bytes) / GIB
        print(
            f"{spec:10} {len(held) * per_layer / GIB:8.2f} {out[0]:8.2f} {out[1]:11.2f} {out[2]:10.2f} {out[3]:13.2f} "
            f"{stated.peak_bytes / GIB:11.2f} {stated.peak_reserved_bytes / GIB:14.2f} {outside:7.2f} "
            f"{(mapped.gpu_memory_bytes or 0) / GIB:7.1f} "
            f"{time.perf_counter() - start:5.1f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:] or list(DEFAULT_ROWS))
