"""Predict, BEFORE measuring, the throughput of a workload on the GPU this runs on.

    .venv/bin/python benchmarks/gpu_throughput_check.py [--gpu NAME] [--model mixtral-8x7b] [--method qlora]
        [--experts-per-token 2] [--batch-sizes 1,2,4,8] [--seq-len 128 | --dataset math_14k]
        [--calibrate MEASUREMENTS.csv] [--run-queries N] [--json OUT.json]

The GPU is detected with torch (`torch.cuda.get_device_name`) and mapped to the catalog, or named with --gpu.
Predictions come from the calibration (default: the paper's A40 measurements only) without refitting: record
them, then profile the same points (e.g. `tunecost profile ...`) and put both in docs/gpu-measurements.md.

Caveat printed with the numbers: the calibrated model describes the paper's 2024 software stack (transformers 4.40
eager expert loop, bitsandbytes per-expert 4-bit linears, PEFT LoRA, FlashAttention-2, gradient checkpointing).
A profile taken with another stack (tunecost's own) launches different kernels; the fair test of the transfer is
the same stack on both GPUs, or a calibration on the new stack's measurements from one GPU.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

# (substring tests on torch's device name) -> catalog name; first match wins
_DEVICE_NAMES = (
    (("H200",), "H200-141GB"),
    (("H100", "PCIE"), "H100-80GB-PCIE"),
    (("H100",), "H100-80GB-SXM"),
    (("A100", "80GB", "PCIE"), "A100-80GB-PCIE"),
    (("A100", "80GB"), "A100-80GB-SXM"),
    (("A100",), "A100-40GB"),
    (("L40S",), "L40S-48GB"),
    (("A40",), "A40-48GB"),
    (("L4",), "L4-24GB"),
    (("A10",), "A10G-24GB"),
    (("4090",), "RTX4090-24GB"),
)


def catalog_name_for_device(device_name: str) -> str | None:
    upper = device_name.upper().replace(" ", "")
    for needles, name in _DEVICE_NAMES:
        if all(n in upper for n in needles):
            return name
    return None


def detect_gpu() -> tuple[str | None, str]:
    try:
        import torch
    except ImportError:
        return None, "torch not importable"
    if not torch.cuda.is_available():
        return None, "no CUDA device"
    device = torch.cuda.get_device_name(0)
    return catalog_name_for_device(device), device


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", help="catalog GPU name (default: detect)")
    parser.add_argument("--model", default="mixtral-8x7b")
    parser.add_argument("--method", default=None, help="qlora | lora | full (default: the paper's for its models)")
    parser.add_argument("--experts-per-token", type=int, default=2)
    parser.add_argument("--batch-sizes", default="1,2,4,8")
    parser.add_argument("--seq-len", type=int, default=None, help="fixed tokens per query (e.g. 128)")
    parser.add_argument("--dataset", default=None, help="a catalog dataset (lengths from its median)")
    parser.add_argument("--calibrate", type=Path, default=None)
    parser.add_argument("--run-queries", type=int, default=None, help="predict runs of N queries (start-up included)")
    parser.add_argument("--json", type=Path, default=None, help="also write the predictions here")
    parser.add_argument("--host-cpu", default=None, help="the machine's CPU (default: read from /proc/cpuinfo)")
    args = parser.parse_args(argv)

    from tunecost.errors import TunecostError
    from tunecost.estimate.calibrated import calibrated_model
    from tunecost.estimate.throughput.targets import throughput_target

    gpu, device = (args.gpu, "named with --gpu") if args.gpu else detect_gpu()
    if gpu is None:
        print(f"error: cannot map the device ({device}) to the GPU catalog; pass --gpu NAME", file=sys.stderr)
        return 2
    if args.seq_len is None and args.dataset is None:
        args.seq_len = 128  # the paper's latency / Nsight runs
    host_read = "named with --host-cpu"
    if args.host_cpu is None:  # this machine's CPU, when the host catalog knows it; else the GPU's default host
        from tunecost.catalog.host_cpus import host_cpu_from_model_name
        from tunecost.results.meta import cpu_model_name

        host_read = cpu_model_name() or "not read"
        found = host_cpu_from_model_name(host_read)
        args.host_cpu = found.name if found else None
    try:
        batches = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
        model = calibrated_model(args.calibrate)
        preds = [
            model.predict(
                throughput_target(
                    model=args.model,
                    gpu=gpu,
                    batch_size=b,
                    method=args.method,
                    experts_per_token=args.experts_per_token,
                    dataset=args.dataset,
                    seq_len=args.seq_len,
                    host_cpu=args.host_cpu,
                ),
                run_queries=args.run_queries,
            )
            for b in batches
        ]
    except (TunecostError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"# gpu_throughput_check {datetime.datetime.now().isoformat(timespec='seconds')}  device: {device} -> "
        f"{preds[0].gpu}"
    )
    print(
        f"# calibration: {model.source} ({model.num_points} points on {', '.join(model.gpus)}, "
        f"in-sample MAPE {100 * model.in_sample_mape:.1f} %), no refit"
    )
    print(
        f"# workload: {args.model} {preds[0].method} top-{preds[0].experts_per_token}, "
        + (f"{args.seq_len} tokens per query" if args.seq_len else f"{args.dataset} lengths")
        + ("; steady state" if args.run_queries is None else f"; runs of {args.run_queries} queries")
    )
    print(f"# host: {preds[0].host_cpu or 'measured'} (this machine's CPU: {host_read})")
    print(f"{'batch':>5s} {'queries/s':>10s} {'95 % interval':>17s} {'step s':>8s} {'launch s':>9s}  top classes (s)")
    rows = []
    for p in preds:
        top = sorted(p.step.class_s.items(), key=lambda kv: -kv[1])[:3]
        print(
            f"{p.target.job.batch_size:5d} {p.queries_per_s:10.3f} "
            f"{p.queries_per_s_low:8.3f}-{p.queries_per_s_high:<8.3f} "
            f"{p.step.step_s:8.3f} {p.step.kernel_overhead_s:9.3f}  "
            + ", ".join(f"{k} {v:.3f} ({p.step.bound_by_class[k]})" for k, v in top)
        )
        rows.append(
            {
                "gpu": p.gpu,
                "device": device,
                "model": args.model,
                "method": p.method,
                "experts_per_token": p.experts_per_token,
                "batch_size": p.target.job.batch_size,
                "seq_len": args.seq_len,
                "dataset": args.dataset,
                "queries_per_s": p.queries_per_s,
                "queries_per_s_low": p.queries_per_s_low,
                "queries_per_s_high": p.queries_per_s_high,
                "step_s": p.step.step_s,
                "run_queries": args.run_queries,
                "host_cpu": p.host_cpu,
                "extrapolation_reasons": list(p.extrapolation_reasons),
            }
        )
    flags = sorted({r for p in preds for r in p.extrapolation_reasons})
    if flags:
        print("extrapolation: " + "; ".join(flags))
    print(
        "caveat: the model describes the paper's 2024 stack (HF 4.40 eager expert loop, bnb per-expert 4-bit, PEFT "
        "LoRA, FA2, checkpointing); a run on another stack launches different kernels."
    )
    if args.json is not None:
        from tunecost.io import atomic_write_json

        atomic_write_json(
            args.json,
            {
                "predicted_at": datetime.datetime.now().isoformat(timespec="seconds"),
                "calibration": model.source,
                "predictions": rows,
            },
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
