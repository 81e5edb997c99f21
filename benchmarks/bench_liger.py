"""Liger's kernels (`--liger-kernel`) side by side with the same job without them: the simulated peak at a fixed
batch, the largest batch that fits an 80 GB H100, and the estimated throughput and cost of 10,000 queries there.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_liger.py [--allocator]

--allocator instead compares the simulated peak of a tiny Llama's step with Liger with the CPU allocator's peak of
the same step on real tensors (`simulate.measure`), for each method, checkpointing and LoRA target set, then the same
for tiny models of other families Liger patches (Gemma 2, Phi-3, Qwen3, GLM-4, Mixtral, DeepSeek-V3).

Nothing here is a measurement of Liger: the peaks are the step simulator's (docs/memory-model.md, section
`tunecost.simulate.liger`), the throughput the calibrated model's counts (docs/throughput-model.md, 'Liger').
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

JOBS = [
    ("meta-llama/Meta-Llama-3-8B", "lora", 4096, 2),
    ("mistralai/Mistral-7B-v0.1", "qlora", 4096, 2),
    ("Qwen/Qwen2.5-0.5B", "full", 2048, 4),
    ("google/gemma-2-2b", "lora", 2048, 4),
]


def tunecost(*args: str) -> dict | list:
    out = subprocess.run(
        [sys.executable, "-m", "tunecost.cli.main", *args, "--json"], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout)


TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
}


ROOT = Path(__file__).resolve().parents[1]
_SMALL = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4}
_SMALL |= {"num_key_value_heads": 2, "vocab_size": 500, "max_position_embeddings": 128}
_SMALL |= {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
FAMILIES = {
    "gemma2": {"model_type": "gemma2", **_SMALL, "head_dim": 16},
    "phi3": {"model_type": "phi3", **_SMALL},
    "qwen3": {"model_type": "qwen3", **_SMALL, "head_dim": 16},
    "glm4": {"model_type": "glm4", **_SMALL, "head_dim": 16},
    "mixtral": ROOT / "tests" / "fixtures" / "simulate" / "tiny-mixtral-2l.json",
    "deepseek_v3": ROOT / "tests" / "fixtures" / "simulate" / "tiny-deepseek-v3.json",
}


def _families_check(tmp: Path) -> None:
    from tunecost.simulate import simulate_step
    from tunecost.simulate.measure import measure_step_peak
    from tunecost.workload.job import FineTuneJob, LoraConfig

    print(f"{'family':<12} {'method':<6} {'simulated':>10} {'allocator':>10} {'diff':>7}")
    for name, config in FAMILIES.items():
        path = config if isinstance(config, Path) else tmp / f"{name}.json"
        if not isinstance(config, Path):
            path.write_text(json.dumps(config))
        targets = ("attention",) if name in ("mixtral", "deepseek_v3") else ("attention", "mlp")
        for method in ("full", "lora"):
            job = FineTuneJob(
                model=str(path), method=method, compute_dtype="fp32", batch_size=2, seq_len=32, liger_kernel=True,
                gradient_checkpointing=False, lora=LoraConfig(rank=4, targets=targets),
            )  # fmt: skip
            sim = simulate_step(job, num_layers_to_trace=99, granule_bytes=1, use_cache=False).peak_bytes
            real = measure_step_peak(job).peak_bytes
            print(f"{name:<12} {method:<6} {sim:>10} {real:>10} {sim / real - 1:>+7.2%}")


def allocator_check() -> None:
    from tunecost.simulate import simulate_step
    from tunecost.simulate.measure import measure_step_peak
    from tunecost.workload.job import FineTuneJob, LoraConfig

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "llama.json"
        path.write_text(json.dumps(TINY_LLAMA))
        print(f"{'method':<6} {'targets':<15} {'checkpointing':<13} {'simulated':>10} {'allocator':>10} {'diff':>7}")
        for method, targets, gc in [
            ("full", (), False),
            ("full", (), True),
            ("lora", ("attention",), False),
            ("lora", ("attention",), True),
            ("lora", ("attention", "mlp"), False),
            ("lora", ("attention", "mlp"), True),
        ]:
            job = FineTuneJob(
                model=str(path), method=method, compute_dtype="fp32", batch_size=2, seq_len=64, liger_kernel=True,
                gradient_checkpointing=gc, lora=LoraConfig(rank=8, targets=targets or ("attention",)),
            )  # fmt: skip
            sim = simulate_step(job, num_layers_to_trace=99, granule_bytes=1, use_cache=False).peak_bytes
            real = measure_step_peak(job).peak_bytes
            print(f"{method:<6} {','.join(targets) or '-':<15} {gc!s:<13} {sim:>10} {real:>10} {sim / real - 1:>+7.2%}")
        _families_check(Path(tmp))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--allocator", action="store_true", help="the simulated vs CPU allocator check")
    if parser.parse_args().allocator:
        allocator_check()
        return
    head = f"{'model':<28} {'method':<6} {'tokens':>6} {'liger':<5} {'peak GB':>8} {'max batch':>9}"
    print(f"{head} {'q/s':>6} {'h':>5} {'$':>6}")
    for model, method, seq, batch in JOBS:
        for flag in ("--no-liger-kernel", "--liger-kernel"):
            job = ["--model", model, "--method", method, "--seq-len", str(seq), flag]
            peak = tunecost("memory", *job, "--batch-size", str(batch))
            row = tunecost("estimate", *job, "--gpu", "H100", "--epochs", "1", "--queries", "10000")
            best = row[0] if isinstance(row, list) else row
            qps = best.get("queries_per_s") or 0.0
            cost = best.get("usd") or 0.0
            print(
                f"{model.split('/')[-1]:<28} {method:<6} {batch}x{seq:<4} {'on' if 'no' not in flag else 'off':<5} "
                f"{peak['peak_bytes'] / 1e9:>8.2f} {best.get('max_batch_size')!s:>9} {qps:>6.2f} "
                f"{best.get('hours') or 0:>5.2f} {cost:>6.2f}"
            )


if __name__ == "__main__":
    main()
