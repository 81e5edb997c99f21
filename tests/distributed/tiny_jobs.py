"""The small multi-GPU jobs that tests/distributed and benchmarks/bench_multigpu.py run: tiny configs of real
architectures (tests/fixtures/distributed), fp32, 2 sequences of 16 tokens."""

from __future__ import annotations

from pathlib import Path

from tunecost.workload.job import FineTuneJob, LoraConfig

CONFIGS = Path(__file__).parents[1] / "fixtures" / "distributed"

# (config, method, LoRA) compared between the fake-process-group simulation and 2 real gloo ranks
GLOO_CASES = [
    ("tiny-mixtral-2l", "full", LoraConfig(rank=8)),
    ("tiny-mixtral-2l", "lora", LoraConfig(rank=8, targets=("attention", "experts", "router"))),
    ("tiny-llama-2l", "full", LoraConfig(rank=8, targets=("attention", "mlp"))),
]


def tiny_job(config: str, method: str, lora: LoraConfig, *, gradient_checkpointing: bool = False) -> FineTuneJob:
    """The job of `method` on the tiny config CONFIG.json in tests/fixtures/distributed."""
    return FineTuneJob(
        model=str(CONFIGS / f"{config}.json"),
        method=method,
        lora=lora,
        compute_dtype="fp32",
        batch_size=2,
        seq_len=16,
        gradient_checkpointing=gradient_checkpointing,
    )


def gloo_job(config: str, method: str, lora: LoraConfig) -> FineTuneJob:
    """The job of a GLOO_CASES row: activation checkpointing with LoRA, none in full fine-tuning."""
    return tiny_job(config, method, lora, gradient_checkpointing=method != "full")


def pipeline_job(*, config: str = "tiny-llama-2l", seq_len: int = 64, batch_size: int = 4) -> FineTuneJob:
    """A tiny Llama split into pipeline stages (tests/distributed/test_pipeline.py): full fine-tuning, fp32,
    4 sequences of 64 tokens (4 micro-batches of one), long enough that activations weigh beside the states."""
    return FineTuneJob(
        model=str(CONFIGS / f"{config}.json"),
        method="full",
        compute_dtype="fp32",
        batch_size=batch_size,
        seq_len=seq_len,
    )


def stage_estimate(micro_step, job: FineTuneJob, *, stages: int, micro_batches: int, schedule: str, stage: int, v: int):
    """A pipeline rank's memory as `estimate` derives it on one data-parallel rank (`model_parallel.stage_step` of
    the single-GPU step at the micro-batch)."""
    from tunecost.distributed.model_parallel import stage_step
    from tunecost.distributed.rank_memory import rank_memory
    from tunecost.workload.parallel import ParallelPlan

    plan = ParallelPlan(
        num_gpus=stages,
        strategy="ddp",
        pp=stages,
        micro_batches=micro_batches,
        pipeline_schedule=schedule,
        virtual_stages=v,
    )
    return rank_memory(stage_step(micro_step, plan, stage), job, ParallelPlan())
