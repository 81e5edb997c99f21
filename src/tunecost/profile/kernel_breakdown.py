"""Kernel-level breakdown of the MoE layer (paper Fig. 6) from one `torch.profiler` step.

Sources and derivations: docs/profiling.md, section `tunecost.profile.kernel_breakdown`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tunecost.models.anatomy import moe_blocks
from tunecost.profile import instrument, nvtx
from tunecost.profile import kernels as taxonomy

_EXPERT_PROJECTIONS = {
    "w1": nvtx.W1,
    "w3": nvtx.W3,
    "w2": nvtx.W2,
    "gate_proj": nvtx.W1,
    "up_proj": nvtx.W3,
    "down_proj": nvtx.W2,
    "linear_fc1": nvtx.W1W3,
    "linear_fc2": nvtx.W2,
}
_LORA_FACTORS = ("lora_A", "lora_B")


@dataclass(frozen=True, kw_only=True)
class KernelClassTime:
    kernel_class: str
    seconds: float
    count: int


@dataclass(frozen=True, kw_only=True)
class KernelBreakdown:
    """Time per kernel class inside the MoE layers over one profiled step (all layers, forward + backward)."""

    classes: tuple[KernelClassTime, ...]
    source: str  # "torch.profiler"
    timing: str  # "cuda-kernels" | "cpu-self-time"
    profiled_seconds: float  # wall time of the profiled step (profiler overhead included)

    @property
    def moe_seconds(self) -> float:
        return sum(c.seconds for c in self.classes)


# ----------------------------------------------------------------------------------------------- labelling


def _wrap(module: Any, name: str, restores: list[Callable[[], None]]) -> None:
    if "forward" in vars(module):  # already labelled (by instrument.instrument_moe_block or the module itself)
        return
    original = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return nvtx.call_in_range(name, original, *args, **kwargs)

    module.forward = forward
    restores.append(lambda: vars(module).pop("forward", None))


def label_moe_layers(model: Any) -> instrument.InstrumentationHandle:
    """Put tunecost ranges on every MoE block of `model` (forward and backward); `.remove()` undoes it."""
    handle = instrument.InstrumentationHandle()
    try:
        blocks = instrument.gated_moe_blocks(model)
        block_ids = {id(b.block) for b in blocks}
        for found in blocks:
            handle._restores.extend(instrument.instrument_moe_block(found.block)._restores)
        for found in moe_blocks(model):  # MoE blocks named otherwise (BlackMamba: router + local_experts)
            if id(found.block) not in block_ids:
                experts = found.experts
                _wrap(found.block, nvtx.MOE_BLOCK, handle._restores)
                _wrap(found.router, nvtx.ROUTER, handle._restores)
                if type(experts).__name__ != "ModuleList":
                    _wrap(experts, nvtx.EXPERTS, handle._restores)
                block_ids.add(id(found.block))
        for name, module in model.named_modules():
            leaf = name.rsplit(".", 1)[-1]
            inside_moe = ".experts." in f".{name}." or ".local_experts." in f".{name}."
            if inside_moe and leaf in _EXPERT_PROJECTIONS:
                _wrap(module, _EXPERT_PROJECTIONS[leaf], handle._restores)
            elif inside_moe and leaf in _LORA_FACTORS:
                _wrap(module, nvtx.LORA, handle._restores)
    except BaseException:
        handle.remove()
        raise
    return handle


# ----------------------------------------------------------------------------------------------- profiling


def profile_kernels(run_step: Callable[[], None], model: Any, *, device: str) -> KernelBreakdown:
    """Run `run_step()` once under torch.profiler with the MoE layers labelled; classify what ran inside them."""
    import time

    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities, record_shapes=False, with_stack=False)
    with label_moe_layers(model):
        with _quiet_native_stderr():  # kineto prints "profiler_start" lines straight to fd 2
            prof.start()
        try:
            t0 = time.perf_counter()
            run_step()
            if cuda:
                import torch

                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
        finally:
            with _quiet_native_stderr():
                prof.stop()
    classes = classify_events(prof.events(), cuda=cuda)
    return KernelBreakdown(
        classes=classes,
        source="torch.profiler",
        timing="cuda-kernels" if cuda else "cpu-self-time",
        profiled_seconds=seconds,
    )


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for the duration (native libraries write there directly)."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        sys.stderr.flush()
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _span(event: Any) -> tuple[float, float]:
    return float(event.time_range.start), float(event.time_range.end)


def _is_cpu(event: Any) -> bool:
    return str(getattr(event, "device_type", "CPU")).rsplit(".", 1)[-1] == "CPU"


def classify_events(events: Iterable[Any], *, cuda: bool) -> tuple[KernelClassTime, ...]:
    """Seconds and counts per kernel class of the ops (CPU) or kernels (CUDA) run inside tunecost MoE ranges."""
    by_thread: dict[Any, list[Any]] = defaultdict(list)
    ranges_by_thread: dict[Any, list[tuple[float, float, str]]] = defaultdict(list)
    for e in events:
        if not _is_cpu(e):
            continue
        if e.name.startswith(nvtx.RANGE_PREFIX):
            ranges_by_thread[e.thread].append((*_span(e), e.name))
        else:
            by_thread[e.thread].append(e)
    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for thread, ops in by_thread.items():
        ranges = sorted(ranges_by_thread.get(thread, []))
        if not ranges:
            continue
        self_us = {} if cuda else _self_times(ops)  # CPU ops: self time; CUDA: the kernels
        for e, stack in _with_ranges(ops, ranges):
            if not stack:
                continue
            if cuda:
                for k in getattr(e, "kernels", ()) or ():
                    if k.name.startswith(nvtx.RANGE_PREFIX) or k.duration <= 0:
                        continue
                    cls = taxonomy.classify_kernel(k.name, stack)
                    seconds[cls] += k.duration * 1e-6
                    counts[cls] += 1
            else:
                own = self_us[id(e)]
                if own <= 0:
                    continue
                cls = taxonomy.classify_cpu_op(e.name, stack)
                seconds[cls] += own * 1e-6
                counts[cls] += 1
    order = {c: i for i, c in enumerate(taxonomy.KERNEL_CLASSES)}
    return tuple(
        KernelClassTime(kernel_class=c, seconds=seconds[c], count=counts[c])
        for c in sorted(seconds, key=lambda c: order.get(c, 99))
    )


def _with_ranges(ops: list[Any], ranges: list[tuple[float, float, str]]) -> Iterable[tuple[Any, list[str]]]:
    """Each op with the names of the ranges (outer to inner) whose interval contains it: one sweep in start
    order, keeping only the ranges still open (a handful at any time)."""
    ptr = 0
    active: list[tuple[float, float, str]] = []
    for e in sorted(ops, key=lambda e: _span(e)[0]):
        s, t = _span(e)
        while ptr < len(ranges) and ranges[ptr][0] <= s:
            active.append(ranges[ptr])
            ptr += 1
        active = [r for r in active if r[1] >= s]
        inside = sorted((r for r in active if r[1] >= t), key=lambda r: (r[0], -r[1]))
        yield e, [r[2] for r in inside]


def _self_times(ops: list[Any]) -> dict[int, float]:
    """Self time (µs) of each op: its duration minus that of its direct children (by containment; ops on one
    thread nest properly)."""
    order = sorted(ops, key=lambda e: (_span(e)[0], -_span(e)[1]))
    own = {id(e): _span(e)[1] - _span(e)[0] for e in order}
    stack: list[Any] = []
    for e in order:
        s, t = _span(e)
        while stack and _span(stack[-1])[1] < t:
            stack.pop()
        if stack and _span(stack[-1])[1] >= t:
            own[id(stack[-1])] -= t - s
        stack.append(e)
    return own
