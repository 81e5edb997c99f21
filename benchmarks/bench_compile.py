"""torch.compile in the throughput counts, on the shipped corpus's torchtune rows: each throughput row predicted
with the compiled rows' element-wise work fused (what tunecost does) and with every row counted eager (compile
ignored), one GEMM efficiency per (stack, GPU) calibrated on the same row in both.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_compile.py
"""

from __future__ import annotations

import dataclasses
import statistics

from tunecost.catalog.held_out_errors import THROUGHPUT_QUANTITIES
from tunecost.validate import read_corpus, validate_rows
from tunecost.validate.mapping import MappedRow
from tunecost.validate.throughput import AT_BOUND_REASON, micro_batch_counts


def eager_counts(mapped: MappedRow):
    return micro_batch_counts(dataclasses.replace(mapped, job=mapped.job.with_(torch_compile=False)))


def main() -> None:
    rows = [r for r in read_corpus() if r.get("source") == "pytorch/torchtune"]
    fused, eager = validate_rows(rows, held_out=()), validate_rows(rows, counts_fn=eager_counts, held_out=())
    compiled = {r.id for r in rows if "torch.compile on" in r.get("stack_versions")}
    print(f"{'row':<7} {'compiled':<9} {'measured':>9} {'fused':>9} {'error':>7} {'eager':>9} {'error':>7}")
    errors: dict[str, list[float]] = {"fused": [], "eager": []}
    for f, e in zip(fused, eager):
        if f.quantity not in THROUGHPUT_QUANTITIES or f.status != "ok":
            continue
        cells = [f"{f.id:<7} {'yes' if f.id in compiled else 'no':<9} {f.measured:>9.0f}"]
        for name, v in (("fused", f), ("eager", e)):
            if v.error is not None:
                errors[name].append(abs(v.error))
            error = f"{v.error:>+6.1f}%" if v.error is not None else "  calib" if v.predicted else "   skip"
            cells.append(f"{v.predicted:>9.0f} {error}" if v.predicted else f"{'-':>9} {error}")
        print(" ".join(cells))
    for name, v in (("fused", fused), ("eager", eager)):
        errs = errors[name]
        median = f"median |error| {statistics.median(errs):.1f} %" if errs else "no row predicted"
        print(f"{name}: {median} over {len(errs)} rows")
        for reason in sorted(
            {r.reason for r in v if r.quantity in THROUGHPUT_QUANTITIES and r.reason.startswith(AT_BOUND_REASON)}
        ):
            print(f"  {name}: {reason}")


if __name__ == "__main__":
    main()
