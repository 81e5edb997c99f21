"""FP8 training: predicted step time of a dense Llama fine-tune on H100 in bf16 and under each FP8 recipe, with the
op classes that change, and (--memory) the simulated peak with what FP8 adds per category (docs/fp8.md).
Unvalidated: no FP8 measurement is bundled.

    PYTHONPATH=src python benchmarks/bench_fp8.py [--model M] [--gpu G] [--batch-size N] [--seq-len L] [--memory]
"""

from __future__ import annotations

import argparse

from tunecost.estimate.calibrated import calibrated_model
from tunecost.estimate.throughput.targets import ThroughputTarget
from tunecost.workload.job import FP8_RECIPES, FineTuneJob


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="meta-llama/Llama-3.1-8B")
    parser.add_argument("--gpu", default="H100")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--method", default="full")
    parser.add_argument("--memory", action="store_true", help="simulated peak memory instead of step time")
    args = parser.parse_args()
    if args.memory:
        memory(args)
        return
    model = calibrated_model()
    base = None
    print(f"{args.model}, {args.method}, batch {args.batch_size} x {args.seq_len} tokens on {args.gpu}")
    print("recipe       step s  speed-up  dense_matmul s  elementwise s  lm_head s  attention s  other s")
    for recipe in FP8_RECIPES:
        job = recipe_job(args, recipe, gradient_checkpointing=False)
        step = model.predict(ThroughputTarget(job=job, gpu=args.gpu)).step
        base = base or step.step_s
        c = step.class_s
        print(
            f"{recipe:11s} {step.step_s:7.3f}  {base / step.step_s:7.2f}x  {c.get('dense_matmul', 0):14.3f}  "
            f"{c.get('elementwise', 0):13.3f}  {c.get('lm_head', 0):9.3f}  {c.get('attention', 0):11.3f}  "
            f"{step.step_s - sum(c.get(k, 0) for k in SHOWN):7.3f}"
        )


SHOWN = ("dense_matmul", "elementwise", "lm_head", "attention")


def recipe_job(args: argparse.Namespace, recipe: str, *, gradient_checkpointing: bool) -> FineTuneJob:
    """The benchmark's job under one FP8 recipe."""
    return FineTuneJob(
        model=args.model,
        method=args.method,
        lora=model_lora(args.method),
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        gradient_checkpointing=gradient_checkpointing,
        fp8=recipe,
    )


def memory(args: argparse.Namespace) -> None:
    from tunecost.simulate import simulate_step

    print(f"{args.model}, {args.method}, batch {args.batch_size} x {args.seq_len} tokens: simulated peak (GiB)")
    base = None
    for recipe in FP8_RECIPES:
        job = recipe_job(args, recipe, gradient_checkpointing=args.method != "full")
        sim = simulate_step(job)
        base = base or sim.breakdown_bytes
        added = {k: v - base.get(k, 0) for k, v in sim.breakdown_bytes.items() if v != base.get(k, 0)}
        shown = ", ".join(f"{k} +{v / 2**30:.2f}" for k, v in sorted(added.items())) or "-"
        print(f"{recipe:11s} peak {sim.peak_bytes / 2**30:7.2f}  added: {shown}")


def model_lora(method: str):
    from tunecost.workload.job import DEFAULT_DENSE_LORA_TARGETS, LoraConfig

    return LoraConfig(targets=DEFAULT_DENSE_LORA_TARGETS) if method != "full" else LoraConfig()


if __name__ == "__main__":
    main()
