"""Shared fixtures of the estimator tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tunecost.catalog.gpus import get_gpu
from tunecost.estimate.cost import estimate_job
from tunecost.estimate.estimators import EstimateRequest, EstimatorOptions


def _make_request(
    gpu: str = "A40",
    *,
    model: str = "mixtral-8x7b",
    method: str = "qlora",
    experts_per_token: int = 2,
    seq_len: int | None = None,
    batch_size: int | None = None,
    stack: str | None = None,
    **options,
) -> EstimateRequest:
    """Mixtral-8x7B QLoRA top-2 on math_14k (Table IV's job) unless told (`seq_len`: every query that long, no
    dataset); `batch_size` fixes the batch; `stack` is the job's; `options` are `EstimatorOptions` fields."""
    dataset = None if seq_len else "math_14k"
    job = estimate_job(
        model, method=method, experts_per_token=experts_per_token, dataset=dataset, seq_len=seq_len, stack=stack
    )
    return EstimateRequest(
        job=job if batch_size is None else job.with_(batch_size=batch_size),
        gpu=get_gpu(gpu),
        options=EstimatorOptions(**options),
        fixed_batch=batch_size is not None,
    )


@pytest.fixture
def make_request() -> Callable[..., EstimateRequest]:
    """Builds an `EstimateRequest` (see `_make_request`)."""
    return _make_request
