"""The op classes that a training step's work is split into, shared by the step simulator (`tunecost.simulate`)
and the analytic throughput model (`tunecost.estimate.throughput`): one taxonomy, defined here once."""

from __future__ import annotations

OP_CLASSES: tuple[str, ...] = (
    "expert_matmul",
    "lora",
    "dequant",
    "attention",
    "router",
    "dense_matmul",
    "lm_head",
    "embedding",
    "ssm_scan",
    "elementwise",
    "optimizer",
)
