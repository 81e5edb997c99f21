"""Measure one sweep point (model, method, experts per token, batch size, sequence length or dataset, device).

Sources and derivations: docs/profiling.md, section `tunecost.profile.point`.
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tunecost.errors import TunecostError
from tunecost.models.anatomy import set_top_k
from tunecost.profile.expert_load import ExpertLoad, ExpertLoadCounter
from tunecost.profile.gpu_busy import GpuBusy, measure_gpu_busy
from tunecost.profile.inputs import BatchSource
from tunecost.profile.kernel_breakdown import KernelBreakdown, profile_kernels
from tunecost.profile.layers import LayerTimer, LayerTimes
from tunecost.profile.loop import DEFAULT_LR, StepResult, TrainableSnapshot, forward_only, make_optimizer, train_step
from tunecost.profile.memory import PeakMemory, PeakMemoryMeter
from tunecost.profile.model_setup import PreparedModel
from tunecost.profile.timers import StepTimes, make_clock, median_step_index
from tunecost.results.schema import point_id

ProgressFn = Callable[[int, int, str], None]


@dataclass(frozen=True, kw_only=True)
class MeasureOptions:
    """How much to measure per point.

    steps: timed steps (each run plain and, with `instrumentation_overhead`, instrumented).
    warmup_steps: untimed steps first (allocator, kernels, lazy optimizer state).
    instrumentation_overhead: interleave instrumented steps with the plain ones and report their time ratio;
        False: one instrumented step only (layer breakdown), no overhead row.
    kernels: profile one step with torch.profiler for the MoE kernel classes.
    expert_load: count tokens per expert before and after the point's training.
    gpu_busy: on CUDA, run a few more steps under torch.profiler for the GPU-busy time per step
        (tunecost.profile.gpu_busy); nothing on CPU.
    router_aux_loss: train with the load-balancing loss (the paper's setup) where the model has one.
    """

    steps: int = 3
    warmup_steps: int = 1
    instrumentation_overhead: bool = True
    kernels: bool = True
    expert_load: bool = True
    gpu_busy: bool = True
    router_aux_loss: bool = True
    lr: float = DEFAULT_LR

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise TunecostError(f"--steps must be at least 1, got {self.steps}")
        if self.warmup_steps < 0:
            raise TunecostError(f"warm-up steps must be >= 0, got {self.warmup_steps}")


@dataclass(frozen=True, kw_only=True)
class Workload:
    """The keys a measurement belongs to (docs/dev/records.md), plus the experts implementation: one point of a
    sweep, as recorded. Not a job description: `FineTuneJob` says what to run; this names what was measured."""

    model: str
    method: str
    experts_impl: str
    experts_per_token: int
    batch_size: int
    seq_len: int | None
    dataset: str | None
    device: str

    def keys(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "method": self.method,
            "experts_impl": self.experts_impl,
            "experts_per_token": self.experts_per_token,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "dataset": self.dataset,
            "device": self.device,
        }

    @property
    def point_id(self) -> str:
        return point_id(self.keys())


@dataclass
class PointMeasurement:
    workload: Workload
    status: str  # "done" | "oom"
    message: str = ""
    plain: list[StepResult] = field(default_factory=list)
    instrumented: list[StepResult] = field(default_factory=list)
    layers: LayerTimes | None = None
    layers_step: StepTimes | None = None
    num_queries: int = 0
    num_tokens: int = 0
    padded_tokens: int = 0
    memory: PeakMemory | None = None
    kernels: KernelBreakdown | None = None
    gpu_busy: GpuBusy | None = None  # CUDA only
    load_before: ExpertLoad | None = None
    load_after: ExpertLoad | None = None
    timer: str = "perf_counter"
    elapsed_seconds: float = 0.0


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    if isinstance(exc, oom):
        return True
    return isinstance(exc, RuntimeError) and (
        "out of memory" in str(exc).lower() or "can't allocate memory" in str(exc).lower()
    )


def release_memory(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def measure_point(
    prepared: PreparedModel,
    source: BatchSource,
    workload: Workload,
    options: MeasureOptions,
    *,
    snapshot: TrainableSnapshot | None = None,
    on_step: ProgressFn | None = None,
) -> PointMeasurement:
    """Measure one point on an already prepared model (see docs/profiling.md)."""
    model, device = prepared.model, workload.device
    t_start = time.perf_counter()
    batches_cpu = source.batches(workload.batch_size, options.steps)  # raises on a too-small dataset
    set_top_k(model, workload.experts_per_token)
    if snapshot is not None:
        snapshot.restore()
    result = PointMeasurement(
        workload=workload, status="done", timer="cuda-events" if device.startswith("cuda") else "perf_counter"
    )
    optimizer, batches = None, []
    try:
        batches = [b.to(device) for b in batches_cpu]
        result.num_queries = sum(b.batch_size for b in batches)
        result.num_tokens = sum(b.num_tokens for b in batches)
        result.padded_tokens = sum(b.padded_tokens for b in batches)
        counter = (
            ExpertLoadCounter(model, experts_per_token=workload.experts_per_token) if options.expert_load else None
        )
        if counter is not None:
            result.load_before = _expert_load(model, counter, batches)
        optimizer = make_optimizer(model, options.lr)
        clock = make_clock(device)
        step = _stepper(model, optimizer, clock, device, options)
        for _ in range(options.warmup_steps):
            step(batches[0], None)
        _measure_steps(result, model, clock, step, batches, options, on_step)
        if options.gpu_busy:
            cycle = iter(batches * 3)
            result.gpu_busy = measure_gpu_busy(lambda: step(next(cycle), None), device, steps=min(3, len(batches)))
        if options.kernels:
            result.kernels = profile_kernels(functools.partial(step, batches[0], None), model, device=device)
        if counter is not None:
            result.load_after = _expert_load(model, counter, batches)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        result = PointMeasurement(
            workload=workload,
            status="oom",
            timer=result.timer,
            message=f"out of memory at batch size {workload.batch_size}: {str(exc).splitlines()[0][:200]}",
        )
    finally:
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)  # an OOM mid-backward leaves gradients behind
        del optimizer, batches
        release_memory(device)
    result.elapsed_seconds = time.perf_counter() - t_start
    return result


def _stepper(model: Any, optimizer: Any, clock: Any, device: str, options: MeasureOptions) -> Callable:
    def step(batch: Any, layer_timer: LayerTimer | None) -> StepResult:
        return train_step(
            model,
            optimizer,
            batch,
            clock,
            device=device,
            layer_timer=layer_timer,
            router_aux_loss=options.router_aux_loss,
        )

    return step


def _measure_steps(
    result: PointMeasurement,
    model: Any,
    clock: Any,
    step: Callable,
    batches: list,
    options: MeasureOptions,
    on_step: ProgressFn | None,
) -> None:
    meter = PeakMemoryMeter(result.workload.device)
    timer = LayerTimer(model, clock)
    total = 2 * len(batches) if options.instrumentation_overhead else len(batches) + 1
    done = 0
    meter.start()
    for batch in batches:
        result.plain.append(step(batch, None))
        done += 1
        if on_step:
            on_step(done, total, "plain step")
        if options.instrumentation_overhead:
            result.instrumented.append(_instrumented(step, batch, timer))
            done += 1
            if on_step:
                on_step(done, total, "instrumented step")
    result.memory = meter.stop()
    if not options.instrumentation_overhead:
        result.instrumented.append(_instrumented(step, batches[0], timer))
        if on_step:
            on_step(total, total, "instrumented step")
    pick = result.instrumented[median_step_index([s.times for s in result.instrumented])]
    result.layers, result.layers_step = pick.layers, pick.times


def _instrumented(step: Callable, batch: Any, timer: LayerTimer) -> StepResult:
    timer.attach()
    try:
        return step(batch, timer)
    finally:
        timer.detach()


def _expert_load(model: Any, counter: ExpertLoadCounter, batches: list) -> ExpertLoad:
    counter.reset()
    counter.attach()
    try:
        for batch in batches:
            counter.set_token_mask(batch.attention_mask)
            forward_only(model, batch)
    finally:
        counter.set_token_mask(None)
        counter.detach()
    return counter.counts()
