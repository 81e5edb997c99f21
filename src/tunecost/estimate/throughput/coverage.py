"""What a throughput calibration covers: the range of each model's points, and what the points leave open."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# What the step counts read of how a job trains, beyond its size (`counts.analytic_step_counts`): a request's
# are carried into its target (`targets.with_setup`); a setup no calibration point ran is not calibrated.
SETUP_FIELDS = (
    "lora",
    "compute_dtype",
    "fp32_params",
    "quant_type",
    "double_quant",
    "gptq_group_size",
    "gptq_kernel",
    "gradient_checkpointing",
    "selective_recompute",
    "recompute_layers",
    "attention",
    "fp8",
    "fp8_params",
    "torch_compile",
    "liger_kernel",
    "grad_accum",
)


def setup_label(job: Any) -> str:
    """How `job` trains, in words: checkpointing, precision, 4-bit storage, LoRA, FP8, eager attention and
    torch.compile (what the counts read)."""
    recompute = "selective recompute" if job.selective_recompute else "no checkpointing"
    checkpointing = "checkpointing" + (f" of {job.recompute_layers} layers" if job.recompute_layers else "")
    dtype = f"fp32 params, {job.compute_dtype} autocast" if job.fp32_params else job.compute_dtype
    parts = [checkpointing if job.gradient_checkpointing else recompute, dtype]
    if job.method == "qlora":
        gptq = f"gptq g{job.gptq_group_size} {job.gptq_kernel}"
        double = " + double quant" * (job.double_quant and job.quant_type in ("nf4", "fp4"))
        parts.append(gptq if job.quant_type == "gptq" else job.quant_type + double)
    if job.method != "full":
        dropout = f" dropout {job.lora.dropout:g}" if job.lora.dropout else ""
        parts.append(f"LoRA r{job.lora.rank}{dropout} on {'+'.join(job.lora.targets)}")
    if job.fp8 != "none":
        parts.append(f"FP8 {job.fp8}" + (" params" if job.fp8_params else ""))
    if job.attention == "eager":  # flash and SDPA run the same fused kernels on a GPU
        parts.append("eager attention")
    if job.torch_compile:
        parts.append("torch.compile")
    if job.liger_kernel:
        parts.append("Liger kernels")
    return ", ".join(parts)


@dataclass(frozen=True, kw_only=True)
class ModelRange:
    batch_sizes: tuple[int, int]
    experts_per_token: frozenset[int]
    methods: frozenset[str]
    tokens_per_step: tuple[float, float]
    setups: frozenset[str] = frozenset()  # `setup_label` of each calibrated job


def model_ranges(prepared: Sequence[tuple]) -> dict[str, ModelRange]:
    """Per model: the batch sizes, top-k, methods, tokens per step and setups the calibration points span."""
    by_model: dict[str, list] = defaultdict(list)
    for _, _, job, counts, _ in prepared:
        by_model[job.model].append((job, counts))
    return {
        model: ModelRange(
            batch_sizes=(min(j.batch_size for j, _ in rows), max(j.batch_size for j, _ in rows)),
            experts_per_token=frozenset(int(j.experts_per_token) for j, _ in rows),
            methods=frozenset(j.method for j, _ in rows),
            tokens_per_step=(min(c.tokens_per_step for _, c in rows), max(c.tokens_per_step for _, c in rows)),
            setups=frozenset(setup_label(j) for j, _ in rows),
        )
        for model, rows in by_model.items()
    }


def coverage_notes(prepared: Sequence[tuple]) -> list[str]:
    """What the calibration points leave unconstrained."""
    notes = []
    models = {job.model for _, _, job, _, _ in prepared}
    if len(models) == 1:
        notes.append("calibrated on one model only: launch/host overheads and GPU efficiencies are poorly separated")
    if len({job.batch_size for _, _, job, _, _ in prepared}) == 1:
        notes.append("all points share one batch size: the batch-size saturation is not constrained by data")
    return notes
