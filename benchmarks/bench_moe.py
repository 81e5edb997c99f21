"""The speed and memory targets of the fast MoE layer, measured side by side in one run.

    .venv/bin/python benchmarks/bench_moe.py                    # CPU: H 512, I 1792, 8 experts, top-2, 2048 tokens
    .venv/bin/python benchmarks/bench_moe.py --tokens 4096 --threads 2
    .venv/bin/python benchmarks/bench_moe.py --device cuda      # GPU: bf16, full Mixtral-8x7B shapes

Runs `tunecost.moe.bench.bench_moe_layer` (the same as `tunecost bench moe`) for peft-fused, qlora-linear4bit,
fast, fast-4bit and the no-LoRA floor grouped_mm-frozen, then prints each target with the measured ratio:
  CPU and GPU: fast >= 2x faster than peft-fused (LoRA on experts + router, top-2, >= 2048 tokens), with less
               peak memory;
  GPU:         fast-4bit >= 1.3x faster than qlora-linear4bit.
Single-threaded by default on CPU: on a shared CPU two threads spin-wait on each other (load average printed).
Exit status is 0 whether or not a target is met: this reports, it does not gate.
"""

from __future__ import annotations

import argparse
import os

from tunecost.moe.bench import bench_moe_layer

IMPLS = ("grouped_mm-frozen", "peft-fused", "qlora-linear4bit", "fast", "fast-4bit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=None)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default 1 on CPU)")
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    threads = args.threads if args.threads is not None else (1 if device == "cpu" else None)
    rows = {
        r.impl: r
        for r in bench_moe_layer(
            tokens=args.tokens, top_k=args.top_k, repeats=args.repeats, impls=IMPLS, device=device, threads=threads
        )
    }
    first = rows["fast"]
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") and device == "cpu" else ""
    print(
        f"{first.tokens} tokens, H={first.hidden}, I={first.intermediate}, E={first.experts}, top-{first.top_k}, "
        f"{first.dtype} on {first.device}, {first.threads} thread(s){load}"
    )
    for row in rows.values():
        print(
            f"  {row.impl:18s} {row.ms_forward_backward:9.1f} ms  (CPU {row.cpu_ms_forward_backward:9.1f} ms)  "
            f"peak {row.peak_bytes / 2**20:9.1f} MiB  x{row.speedup_vs_peft_fused:.2f} vs peft-fused"
        )
    fast, peft = rows["fast"], rows["peft-fused"]
    speedup = peft.ms_forward_backward / fast.ms_forward_backward
    print(
        f"fast vs peft-fused: {speedup:.2f}x (target >= 2x: {'met' if speedup >= 2 else 'NOT met'}), "
        f"peak {fast.peak_bytes / peft.peak_bytes:.2f}x (target < 1: "
        f"{'met' if fast.peak_bytes < peft.peak_bytes else 'NOT met'})"
    )
    floor = peft.ms_forward_backward / rows["grouped_mm-frozen"].ms_forward_backward
    print(f"  (no-LoRA floor grouped_mm-frozen is {floor:.2f}x faster than peft-fused)")
    if device != "cpu":
        ratio = rows["qlora-linear4bit"].ms_forward_backward / rows["fast-4bit"].ms_forward_backward
        print(f"fast-4bit vs qlora-linear4bit: {ratio:.2f}x (target >= 1.3x: {'met' if ratio >= 1.3 else 'NOT met'})")


if __name__ == "__main__":
    main()
