"""torch.compile's speed-up, predicted by the throughput counts and measured side by side on this machine.

    .venv/bin/python benchmarks/gpu_compile_check.py [--model llama-3.2-1b] [--batch 4] [--seq-len 2048]
        [--steps 10] [--warmup 3] [--gpu NAME] [--device cuda] [--backend inductor]

A full fine-tune step (forward, backward, foreach AdamW) of the model built with random weights, eager and under
torch.compile (the model's forward compiled, as torchtune and the HF Trainer do), timed after warm-up. The
prediction is the throughput model's step at the GPU's catalog terms and the stack priors' centres, with and
without `torch_compile` (each layer's element-wise chains fused); only the ratio is compared, as the GEMM
efficiency cancels out of it. `--device cpu --backend eager --gpu A100-80GB` runs the path on a CPU.
"""

from __future__ import annotations

import argparse
import json
import time

from gpu_throughput_check import detect_gpu
from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.estimate.throughput.counts import analytic_step_counts
from tunecost.estimate.throughput.model import catalog_gpu_terms, step_time
from tunecost.estimate.throughput.priors import PRIORS
from tunecost.models.build import build_model
from tunecost.models.catalog import resolve_model
from tunecost.validate.throughput import stack_params
from tunecost.workload.job import FineTuneJob


def predicted_seconds(model: str, gpu: str, batch: int, seq_len: int) -> dict[str, float]:
    """The throughput model's full fine-tune step, eager and compiled, at the stack priors' centres."""
    spec, terms = resolve_model(model), catalog_gpu_terms(resolve_gpu_name(gpu).gpu)
    params = stack_params(PRIORS["gemm_efficiency"].centre)
    job = FineTuneJob(model=model, method="full", batch_size=batch, seq_len=seq_len, gradient_checkpointing=False)
    return {
        mode: step_time(analytic_step_counts(spec, job.with_(torch_compile=mode == "compiled")), terms, params).step_s
        for mode in ("eager", "compiled")
    }


def time_steps(model, compiled: bool, args: argparse.Namespace) -> float:
    """Seconds per full fine-tune step of `model`, after warm-up (compilation included in the warm-up)."""
    import torch

    forward = torch.compile(model, backend=args.backend) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    tokens = torch.randint(0, model.config.vocab_size, (args.batch, args.seq_len), device=model.device)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            sync()
            start = time.perf_counter()
        forward(input_ids=tokens, labels=tokens).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync()
    return (time.perf_counter() - start) / args.steps


def measured_seconds(args: argparse.Namespace) -> dict[str, float]:
    """Seconds per step of the model built with random weights, eager and compiled."""
    import torch

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    out = {}
    for mode in ("eager", "compiled"):
        model = build_model(resolve_model(args.model), device=device, dtype=dtype)
        model.train()
        out[mode] = time_steps(model, mode == "compiled", args)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.2-1b")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--gpu", help="catalog GPU for the prediction (default: the CUDA device's)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (eager: dynamo only)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if min(args.steps, args.batch, args.seq_len) < 1 or args.warmup < 0:
        parser.error("--steps, --batch and --seq-len must be at least 1, --warmup at least 0")
    gpu = args.gpu or detect_gpu()[0]
    if gpu is None:
        parser.error(f"--gpu: the device is not in the catalog ({detect_gpu()[1]}); name a catalog GPU")
    predicted = predicted_seconds(args.model, gpu, args.batch, args.seq_len)
    measured = measured_seconds(args)
    print(f"{args.model}, full fine-tune, batch {args.batch} x {args.seq_len}, {gpu}, torch.compile {args.backend}")
    for name, figures in (("predicted", predicted), ("measured", measured)):
        eager, compiled = figures["eager"], figures["compiled"]
        print(f"  {name:<9} eager {eager:.4f} s  compiled {compiled:.4f} s  speed-up x {eager / compiled:.3f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"gpu": gpu, "predicted": predicted, "measured": measured, **vars(args)}, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
