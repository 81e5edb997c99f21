"""Per-rank memory of an FSDP2 step: the fake-process-group simulation of one rank against 2 real CPU ranks on
gloo (same step, same tracker), tiny models; and DDP's gradient buckets against the real reducer's. Every number
printed here is measured in this run (about 5-8 minutes on 2 cores).

Run: PYTHONPATH=src .venv/bin/python benchmarks/bench_multigpu.py [--repeat N]
(--repeat N measures the real ranks N times and prints every distinct measured peak.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tunecost.distributed.ddp import ddp_bucket_bytes
from tunecost.distributed.measure import measure_ddp_buckets, measure_fsdp_ranks
from tunecost.distributed.sharded_step import simulate_fsdp_rank

# the same jobs as tests/distributed/test_gloo_ranks.py checks
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "distributed"))
from tiny_jobs import GLOO_CASES, gloo_job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="measure the real ranks this many times")
    repeat = max(1, parser.parse_args().repeat)
    print("FSDP2, 2 ranks, fp32, batch 2 x 16 tokens; bytes as the step simulator's recorder counts them")
    print(f"{'model':<16} {'method':<6} {'simulated':>10} {'rank 0':>10} {'rank 1':>10} {'error':>7} collectives")
    for model, method, lora in GLOO_CASES:
        job = gloo_job(model, method, lora)
        start = time.perf_counter()
        sim = simulate_fsdp_rank(job, world_size=2, granule_bytes=1)
        runs = [measure_fsdp_ranks(job, world_size=2) for _ in range(repeat)]
        real = runs[0]
        err = max(abs(sim.peak_bytes - r.peak_bytes) / r.peak_bytes for r in real)
        same = all(
            [(c.op, c.phase, c.nbytes) for c in r.collectives] == [(c.op, c.phase, c.nbytes) for c in sim.collectives]
            for r in real
        )
        print(
            f"{model:<16} {method:<6} {sim.peak_bytes:>10} {real[0].peak_bytes:>10} {real[1].peak_bytes:>10} "
            f"{100 * err:>6.3f}% {len(sim.collectives)} calls, {'equal' if same else 'DIFFERENT'} "
            f"({time.perf_counter() - start:.0f} s)"
        )
        print(f"    simulated breakdown at the peak: {sim.breakdown_bytes}")
        if repeat > 1:
            peaks = sorted({r.peak_bytes for run in runs for r in run})
            print(f"    distinct measured peaks over {repeat} runs x 2 ranks: {peaks}")
    print("\nDDP gradient buckets (bytes, all-reduce order): predicted vs the real reducer's rebuilt buckets")
    from tunecost.simulate.prepare import build_prepared

    for model, method, lora in GLOO_CASES[:2]:
        job = gloo_job(model, method, lora)
        predicted = ddp_bucket_bytes(build_prepared(job, num_units=None).trainable)
        print(f"{model:<16} {method:<6} predicted {predicted}  measured {measure_ddp_buckets(job)}")


if __name__ == "__main__":
    main()
