"""What a throughput calibration covers: the range of each model's points, and what the points leave open."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ModelRange:
    batch_sizes: tuple[int, int]
    experts_per_token: frozenset[int]
    methods: frozenset[str]
    tokens_per_step: tuple[float, float]


def model_ranges(prepared: Sequence[tuple]) -> dict[str, ModelRange]:
    """Per model: the batch sizes, top-k, methods and tokens per step the calibration points span."""
    by_model: dict[str, list] = defaultdict(list)
    for _, _, job, counts, _ in prepared:
        by_model[job.model].append((job, counts))
    return {
        model: ModelRange(
            batch_sizes=(min(j.batch_size for j, _ in rows), max(j.batch_size for j, _ in rows)),
            experts_per_token=frozenset(int(j.experts_per_token) for j, _ in rows),
            methods=frozenset(j.method for j, _ in rows),
            tokens_per_step=(min(c.tokens_per_step for _, c in rows), max(c.tokens_per_step for _, c in rows)),
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
