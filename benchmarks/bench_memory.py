"""Benchmarks of the step simulator. Every number printed here is measured in this run.

Sections (default: accuracy scaling speed):
  accuracy  simulated peak vs the peak measured on real CPU tensors (PyTorch's CPU allocator events through
            torch.profiler(profile_memory=True): an independent measurement), tiny models of real architectures,
            full / LoRA / QLoRA, top-2 / top-8 / dense, checkpointing on and off (target: within 3 %)
  scaling   traces of two small depths scaled to the full depth vs a full trace (peak and FLOPs)
  speed     `tunecost memory` on full-size Mixtral-8x7B (qlora, top-2, seq 512, --gpu-memory-gb 48): a cold run in
            a fresh process with an empty cache, then the same command cached (target: < 15 s and < 1 s)
  table3    predicted maximum batch sizes for the paper's Table III (A40, 48 GB), from the LLM-Adapters
            files under --data-dir (its llm-adapters/ folder)

Run: .venv/bin/python benchmarks/bench_memory.py [--section accuracy,scaling,speed,table3] [--data-dir DIR]
The machine is shared: the load average is printed; timings on a loaded 2-core machine run 2-4x slower.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "fixtures" / "simulate"
DATA_DIR = Path(os.environ.get("TUNECOST_DATA_DIR", "data"))  # set by --data-dir
GB = 1e9

ACCURACY_CASES = [  # (config, method, experts per token (None: the model's), gradient checkpointing)
    ("tiny-mixtral", "full", 2, False),
    ("tiny-mixtral", "qlora", 2, True),
    ("tiny-mixtral", "qlora", 8, False),
    ("small-mixtral", "lora", 8, True),
    ("small-mixtral", "qlora", 2, False),
    ("small-mixtral", "full", 8, True),
    ("tiny-olmoe", "qlora", 4, True),
    ("tiny-olmoe", "lora", 16, False),
    ("tiny-qwen2-moe", "qlora", 8, True),
    ("tiny-qwen2-moe", "full", 2, False),
    ("tiny-deepseek-v2", "qlora", 2, True),
]


def _job(name: str, method: str, experts_per_token: int, gradient_checkpointing: bool, compute_dtype: str):
    """The job of one case: config NAME (the catalog's tiny-mixtral, or a file in tests/fixtures/simulate), a batch of
    4 sequences of 64 tokens, LoRA rank 8."""
    from tunecost.workload.job import FineTuneJob, LoraConfig

    return FineTuneJob(
        model=name if name == "tiny-mixtral" else str(CONFIGS / f"{name}.json"),
        method=method,
        experts_per_token=experts_per_token,
        gradient_checkpointing=gradient_checkpointing,
        compute_dtype=compute_dtype,
        batch_size=4,
        seq_len=64,
        lora=LoraConfig(rank=8),
    )


def section_accuracy() -> None:
    from tunecost.simulate import simulate_step
    from tunecost.simulate.measure import measure_step_peak

    print("\n== accuracy: simulated (fake tensors) vs measured (real CPU tensors, allocator events) ==")
    print(f"{'model':17} {'method':6} {'top-k':>5} {'ckpt':>5} {'simulated B':>13} {'measured B':>13} {'error':>8}")
    worst = 0.0
    for name, method, k, ckpt in ACCURACY_CASES:
        job = _job(name, method, k, ckpt, compute_dtype="fp32")
        sim = simulate_step(job, num_layers_to_trace=99, granule_bytes=1, use_cache=False)
        real = measure_step_peak(job)
        err = sim.peak_bytes / real.peak_bytes - 1
        worst = max(worst, abs(err))
        print(
            f"{name:17} {method:6} {k:>5} {ckpt!s:>5} {sim.peak_bytes:>13,} {real.peak_bytes:>13,} {100 * err:>7.3f}%"
        )
    print(f"worst |error|: {100 * worst:.3f}% over {len(ACCURACY_CASES)} configurations (target 3 %)")


def section_scaling() -> None:
    from tunecost.simulate import simulate_step

    print("\n== scaling: traces of 1 and 2 repeating units scaled to the full depth vs a full trace ==")
    cases = [
        ("small-mixtral", "qlora", 2, True),
        ("small-mixtral", "full", 8, False),
        ("small-mixtral", "lora", 2, False),
        ("tiny-deepseek-v2", "qlora", 2, True),
        ("tiny-blackmamba", "full", 8, False),
    ]
    for name, method, k, ckpt in cases:
        job = _job(name, method, k, ckpt, compute_dtype="bf16" if "blackmamba" in name else "fp32")
        t0 = time.perf_counter()
        full = simulate_step(job, num_layers_to_trace=99, use_cache=False)
        t1 = time.perf_counter()
        scaled = simulate_step(job, use_cache=False)
        t2 = time.perf_counter()
        print(
            f"{name:17} {method:6} k={k} ckpt={ckpt!s:5} layers {full.num_layers:2}: peak full {full.peak_bytes:>12,}"
            f" scaled {scaled.peak_bytes:>12,} ({100 * (scaled.peak_bytes / full.peak_bytes - 1):+.3f}%), FLOPs "
            f"{100 * (scaled.flops_per_step / full.flops_per_step - 1):+.4f}%; {t1 - t0:.1f} s vs {t2 - t1:.1f} s"
        )


def section_speed() -> None:
    print("\n== speed: tunecost memory, full-size Mixtral-8x7B, qlora top-2, seq 512, --gpu-memory-gb 48 ==")
    print(f"load average before: {os.getloadavg()}")
    cmd = [
        str(ROOT / ".venv" / "bin" / "tunecost"),
        "memory",
        "--model",
        "mixtral-8x7b",
        "--method",
        "qlora",
        "--experts-per-token",
        "2",
        "--seq-len",
        "512",
        "--batch-size",
        "8",
        "--gpu-memory-gb",
        "48",
        "--json",
    ]
    with tempfile.TemporaryDirectory() as cache_dir:
        env = {**os.environ, "TUNECOST_CACHE_DIR": cache_dir}
        times, outs = [], []
        for label in ("cold (empty cache, new process)", "cached (new process)"):
            t0 = time.perf_counter()
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            times.append(time.perf_counter() - t0)
            outs.append(json.loads(res.stdout))
            print(f"{label:34}: {times[-1]:6.2f} s")
    out = outs[0]
    assert outs[1]["peak_bytes"] == out["peak_bytes"]
    print(f"ratio cold/cached: {times[0] / times[1]:.1f}x; load average after: {os.getloadavg()}")
    print(
        f"peak {out['peak_bytes'] / GB:.2f} GB at batch 8; max batch {out['max_batch_size']} "
        f"({out['max_batch']['simulations']})"
    )
    w = out["weight_bytes"]
    stored = {k: v for k, v in w.items() if not k.endswith("trainable_params")}
    print(
        "stored weights (GB): "
        + ", ".join(f"{k} {v / GB:.3f}" for k, v in sorted(stored.items(), key=lambda kv: -kv[1]))
    )
    print(f"stored total {sum(stored.values()) / GB:.2f} GB (paper Table I: 23.35 GB = 0.5 byte x 46.7 B parameters)")


def _dataset_lengths() -> dict[str, tuple[int, ...]]:
    from tunecost.workload.datasets import load_file
    from tunecost.workload.lengths import length_distribution
    from tunecost.workload.templates import template_by_name
    from tunecost.workload.tokenizers import tokenizer_by_name

    tok, tpl = tokenizer_by_name("mistral"), template_by_name("mistral")
    cs_files = [
        "boolq_train",
        "ARC-Easy_train",
        "ARC-Challenge_train",
        "openbookqa_train",
        "piqa_test",
        "social_i_qa_test",
        "winogrande_test",
    ]
    cs: list[int] = []
    for name in cs_files:
        cs += length_distribution(load_file(DATA_DIR / "llm-adapters" / f"{name}.json"), tok, tpl).lengths
    math = length_distribution(load_file(DATA_DIR / "llm-adapters" / "math_data.json"), tok, tpl).lengths
    train_only: list[int] = []
    for name in cs_files[:4]:
        train_only += length_distribution(load_file(DATA_DIR / "llm-adapters" / f"{name}.json"), tok, tpl).lengths
    return {"CS": tuple(cs), "MATH": tuple(math), "CS-train": tuple(train_only)}


PAPER_TABLE3 = {
    ("mixtral-8x7b", "CS", 8): 2,
    ("mixtral-8x7b", "CS", 2): 8,
    ("mixtral-8x7b", "MATH", 8): 1,
    ("mixtral-8x7b", "MATH", 2): 3,
    ("blackmamba-2.8b", "CS", 8): 6,
    ("blackmamba-2.8b", "CS", 2): 20,
    ("blackmamba-2.8b", "MATH", 8): 2,
    ("blackmamba-2.8b", "MATH", 2): 8,
}
CUTOFF_LEN = 1024  # LLaMA-Factory cutoff_len in the paper's runs


def section_table3() -> None:
    from tunecost.errors import TunecostError
    from tunecost.simulate import max_batch_size
    from tunecost.workload.job import FineTuneJob

    print("\n== table3: predicted max batch size on a 48 GB GPU (A40), no safety margin, vs the paper's Table III ==")
    lengths = _dataset_lengths()
    for ds, xs in lengths.items():
        s = sorted(xs)
        print(
            f"{ds}: {len(xs)} queries, median {s[len(s) // 2]}, max {s[-1]} tokens (Mixtral tokenizer, "
            f"LLaMA-Factory 'mistral' template)"
        )
    variants = [("tunecost", True), ("hf-2024", True), ("hf-2024", False)]
    print(f"{'model':16} {'data':5} {'mode':6} {'paper':>5}  " + "  ".join(f"{s}/ckpt={c!s:5}" for s, c in variants))
    cells = list(PAPER_TABLE3.items())
    cells += [
        ((m, "CS-train", k), PAPER_TABLE3[(m, "CS", k)]) for m in ("mixtral-8x7b", "blackmamba-2.8b") for k in (8, 2)
    ]  # sensitivity: CS from the four train files only (longest query 249 tokens)
    for (model, ds, k), paper in cells:
        row = []
        for stack, ckpt in variants:
            if model.startswith("blackmamba") and stack == "hf-2024" and ckpt:
                row.append("   (same as tunecost)")
                continue
            job = FineTuneJob(
                model=model,
                method="qlora" if model.startswith("mixtral") else "full",
                experts_per_token=k,
                seq_len=None,
                lengths=tuple(min(CUTOFF_LEN, x) for x in lengths[ds]),
                gradient_checkpointing=ckpt,
            )
            try:
                # the paper measured the boundary itself: the largest batch that fits, no safety margin
                r = max_batch_size(job.with_(stack=stack), int(48 * GB), margin_fraction=0.0)
                row.append(f"{r.batch_size:>4} (L={r.seq_len}, {r.bytes_per_sample / GB:.2f} GB/query)")
            except TunecostError as exc:
                row.append("   0 (" + str(exc).split("short by ")[-1] + " short)")
        mode = "dense" if k == 8 else "sparse"
        print(f"{model:16} {ds:5} {mode:6} {paper:>5}  " + "  ".join(row), flush=True)


SECTIONS = {"accuracy": section_accuracy, "scaling": section_scaling, "speed": section_speed, "table3": section_table3}


def main() -> None:
    global DATA_DIR
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", default="accuracy,scaling,speed")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="folder with llm-adapters/ (table3 only)")
    args = parser.parse_args()
    DATA_DIR = args.data_dir
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()}")
    for name in args.section.split(","):
        SECTIONS[name.strip()]()


if __name__ == "__main__":
    main()
