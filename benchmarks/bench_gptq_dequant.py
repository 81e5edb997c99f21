"""How fast auto-gptq's torch path de-quantizes a GPTQ int4 matrix, beside a plain copy on the same device.

The throughput counts price the torch path (`tunecost.simulate.gptq.unpack_weight`, auto-gptq's cuda-old
`QuantLinear` without its CUDA kernel) at 16.5 bytes moved per weight element
(`quant_counts.GPTQ_TORCH_DEQUANT_BYTES_PER_PARAM`) and at the streaming bandwidth of element-wise work. This script
times the real op sequence and a bf16 copy of the same matrix, side by side in one run, and prints the bandwidth
each reaches and their ratio: a ratio below 1 means the integer kernels reach less than plain element-wise work,
which the counts do not model. On CPU the figures describe the CPU only; the check is meant for a GPU
(`benchmarks/gpu_batch.sh gptq`).

    PYTHONPATH=src python benchmarks/bench_gptq_dequant.py [--device cuda] [--out-features 8192 --in-features 8192]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tunecost.estimate.throughput.quant_counts import GPTQ_TORCH_DEQUANT_BYTES_PER_PARAM
from tunecost.simulate.gptq import quantize_rtn, unpack_weight


def _seconds(fn, device: str, repeats: int) -> float:
    """Median wall time of `fn` over `repeats` runs after two warm-ups, synchronising the device around each."""
    times = []
    for i in range(repeats + 2):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out-features", type=int, default=8192)
    parser.add_argument("--in-features", type=int, default=8192)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    elements = args.out_features * args.in_features
    weight = torch.randn(args.out_features, args.in_features, dtype=torch.float16)
    buffers = {k: v.to(args.device) for k, v in quantize_rtn(weight, args.group_size).items()}
    src = torch.empty(elements, dtype=torch.bfloat16, device=args.device).normal_()
    dst = torch.empty_like(src)

    unpack_s = _seconds(lambda: unpack_weight(**buffers), args.device, args.repeats)
    copy_s = _seconds(lambda: dst.copy_(src), args.device, args.repeats)
    unpack_gb_s = elements * GPTQ_TORCH_DEQUANT_BYTES_PER_PARAM / unpack_s / 1e9
    copy_gb_s = elements * 2 * src.element_size() / copy_s / 1e9  # read + write
    device = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    print(
        f"device: {device}; torch {torch.__version__}; matrix {args.out_features} x {args.in_features}, "
        f"group {args.group_size}; median of {args.repeats}"
    )
    print(
        f"gptq torch-path unpack: {unpack_s * 1e3:.3f} ms, {unpack_gb_s:.1f} GB/s "
        f"(counting {GPTQ_TORCH_DEQUANT_BYTES_PER_PARAM} bytes per element)"
    )
    print(f"bf16 copy:              {copy_s * 1e3:.3f} ms, {copy_gb_s:.1f} GB/s (4 bytes per element)")
    print(f"ratio unpack / copy bandwidth: {unpack_gb_s / copy_gb_s:.2f}")


if __name__ == "__main__":
    main()
