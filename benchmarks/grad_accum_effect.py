"""What gradient accumulation moves in an estimate: queries/s of a few jobs with the optimizer stepped after every
micro-batch (accumulation 1) and after N of them, side by side, on the bundled calibration.

    PYTHONPATH=src .venv/bin/python benchmarks/grad_accum_effect.py
"""

from __future__ import annotations

from dataclasses import replace

from tunecost.estimate.calibrated import calibrated_model
from tunecost.estimate.throughput.targets import throughput_target

JOBS = [  # model, method, GPU, micro-batch, tokens per query
    ("llama-3.2-1b", "full", "A100-80GB", 4, 512),
    ("qwen2.5-0.5b", "full", "A100-80GB", 8, 512),
    ("meta-llama/Llama-3.1-8B", "full", "H100", 1, 1024),
    ("meta-llama/Llama-3.1-8B", "lora", "H100", 1, 1024),
]
ACCUMULATIONS = (1, 4, 16)


def main() -> None:
    model = calibrated_model()
    print(f"{'job':<48} " + " ".join(f"{'q/s at ' + str(n):>11}" for n in ACCUMULATIONS) + f" {'16 vs 1':>8}")
    for name, method, gpu, batch, seq in JOBS:
        target = throughput_target(model=name, gpu=gpu, batch_size=batch, seq_len=seq, method=method)
        qps = []
        for n in ACCUMULATIONS:
            job = target.job.with_(grad_accum=n, gradient_checkpointing=method != "full")
            qps.append(model.predict(replace(target, job=job)).queries_per_s)
        label = f"{name} {method} {gpu} {batch}x{seq}"
        print(f"{label:<48} " + " ".join(f"{q:>11.2f}" for q in qps) + f" {100 * (qps[-1] / qps[0] - 1):>+7.1f}%")


if __name__ == "__main__":
    main()
