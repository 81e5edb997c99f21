"""Time forward+backward of ONE Mixtral MoE block under each experts implementation, side by side in one run.

Sources and derivations: docs/moe-layer.md, section `tunecost.moe.bench`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tunecost.errors import TunecostError, unknown_name_error
from tunecost.moe.install import install_experts
from tunecost.moe.memory import PeakMemoryTracker
from tunecost.moe.spec import LoraSpec
from tunecost.workload.device import check_device

BENCH_IMPLS: tuple[str, ...] = ("eager", "grouped_mm", "peft-fused", "qlora-linear4bit", "fast", "fast-4bit")
# Opt-in (--impls): transformers' grouped_mm experts with every expert weight frozen and no LoRA, i.e. the
# floor any LoRA-on-experts implementation can reach (it still computes the input gradient).
EXTRA_BENCH_IMPLS: tuple[str, ...] = ("grouped_mm-frozen",)
REFERENCE_IMPL = "peft-fused"
CPU_SHAPE = dict(tokens=2048, hidden=512, intermediate=1792)  # Mixtral's 4096 / 14336 scaled by 1/8
GPU_SHAPE = dict(tokens=2048, hidden=4096, intermediate=14336)  # Mixtral-8x7B


@dataclass(frozen=True, kw_only=True)
class MoeBenchRow:
    """One implementation's result. Times in milliseconds (medians), memory in bytes."""

    impl: str
    ms_forward_backward: float
    ms_forward: float
    # CPU time of this process over forward+backward (all its threads): on a CPU shared with other work and
    # one torch thread this is the compute time without the waits for a core; with several threads it also
    # counts threads spinning at barriers. On CUDA it is host time only.
    cpu_ms_forward_backward: float
    peak_bytes: int  # weights of the block + peak bytes allocated during one forward+backward
    weight_bytes: int  # parameters and buffers of the block (4-bit where quantized)
    step_peak_bytes: int  # peak bytes allocated during one forward+backward, beyond what existed before
    trainable: str  # "full", "lora" or "router" (grouped_mm-frozen)
    trainable_params: int
    tokens: int
    hidden: int
    intermediate: int
    experts: int
    top_k: int
    rank: int
    dtype: str
    device: str
    repeats: int
    threads: int  # torch intra-op CPU threads during the run
    speedup_vs_peft_fused: float | None = None  # peft-fused time / this time (> 1: faster than peft-fused)
    cpu_speedup_vs_peft_fused: float | None = None  # the same with process CPU times
    peak_vs_peft_fused: float | None = None  # this peak / peft-fused peak (< 1: less memory)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _state_bytes(module: torch.nn.Module) -> int:
    tensors = {t.data_ptr(): t for t in [*module.parameters(), *module.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _build(impl: str, base_block: torch.nn.Module, lora: LoraSpec) -> torch.nn.Module:
    block: Any = copy.deepcopy(base_block)  # a transformers MoE block (gate, experts)
    if impl in ("eager", "grouped_mm", "grouped_mm-frozen"):
        block.experts.config._experts_implementation = impl.removesuffix("-frozen")
        for p in block.parameters():
            p.requires_grad_(impl != "grouped_mm-frozen" or p is block.gate.weight)
        return block
    block.experts.config._experts_implementation = "grouped_mm"
    return install_experts(block, impl, lora)


def _step(block, x, grad_out, device) -> tuple[float, float, float]:
    """(wall seconds forward+backward, wall seconds forward, process CPU seconds forward+backward)."""
    for p in block.parameters():
        p.grad = None
    inputs = x.detach().requires_grad_(True)
    _sync(device)
    cpu_start, start = time.process_time(), time.perf_counter()
    out = block(inputs)
    _sync(device)
    mid = time.perf_counter()
    out.backward(grad_out)
    _sync(device)
    end, cpu_end = time.perf_counter(), time.process_time()
    return end - start, mid - start, cpu_end - cpu_start


def _step_peak_bytes(block, x, grad_out, device) -> int:
    for p in block.parameters():
        p.grad = None
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        _step(block, x, grad_out, device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    with PeakMemoryTracker() as tracker:
        _step(block, x, grad_out, device)
    return int(tracker.peak_bytes)


def _check_shape(shape: dict[str, int]) -> None:
    """`shape`: the block's tokens, hidden, intermediate, experts, top_k and LoRA rank (MoeBenchRow's names)."""
    if min(shape.values()) < 1:
        raise TunecostError("tokens, hidden, intermediate, experts, top-k, rank and repeats must be positive")
    if shape["top_k"] > shape["experts"]:
        raise TunecostError(f"top-k {shape['top_k']} is more than the {shape['experts']} experts")
    if shape["hidden"] % 4 or shape["intermediate"] % 4:
        raise TunecostError("hidden and intermediate sizes must be multiples of 4 (16-byte rows for grouped GEMMs)")
    if (shape["hidden"] * shape["intermediate"]) % 64:
        raise TunecostError("hidden x intermediate must be a multiple of 64 (the 4-bit blocksize)")


def mixtral_moe_block(
    *, hidden: int, intermediate: int, experts: int, top_k: int, experts_impl: str = "grouped_mm"
) -> torch.nn.Module:
    """A transformers MixtralSparseMoeBlock of this shape (no router jitter), built on the current default device
    with transformers' initial weights."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = MixtralConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_local_experts=experts,
        num_experts_per_tok=top_k,
        router_jitter_noise=0.0,
    )
    config._experts_implementation = experts_impl
    return MixtralSparseMoeBlock(config)


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op CPU threads set to `threads` inside (None: unchanged), restored after."""
    if threads is None:
        yield
        return
    if threads < 1:
        raise TunecostError(f"threads must be at least 1, got {threads}")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def bench_moe_layer(
    *,
    tokens: int | None = None,
    hidden: int | None = None,
    intermediate: int | None = None,
    experts: int = 8,
    top_k: int = 2,
    rank: int = 16,
    alpha: float = 32,
    repeats: int = 5,
    warmup: int = 1,
    impls: Sequence[str] | None = None,
    device: str | None = None,
    dtype: str | None = None,
    seed: int = 0,
    measure_memory: bool = True,
    threads: int | None = None,
    on_progress: Callable[[int, int, str], None] | None = None,
) -> list[MoeBenchRow]:
    """Benchmark one MoE block per implementation; shapes default to Mixtral/8 in fp32 on CPU, full Mixtral-8x7B
    in bf16 on CUDA. Rows come in `impls` order, with ratios against peft-fused when it was measured.
    `threads` sets torch's intra-op CPU threads for the run (restored after)."""
    with _torch_threads(threads):
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        check_device(device)
        dev = torch.device(device)
        default = GPU_SHAPE if dev.type == "cuda" else CPU_SHAPE
        shape = {  # None: the device's default; 0 is an error below, not "the default"
            "tokens": default["tokens"] if tokens is None else tokens,
            "hidden": default["hidden"] if hidden is None else hidden,
            "intermediate": default["intermediate"] if intermediate is None else intermediate,
            "experts": experts,
            "top_k": top_k,
            "rank": rank,
        }
        dtype_name = dtype or ("bfloat16" if dev.type == "cuda" else "float32")
        if dtype_name not in ("float32", "bfloat16", "float16"):
            raise TunecostError(f"dtype must be float32, bfloat16 or float16, got {dtype_name!r}")
        impls = list(impls or BENCH_IMPLS)
        for impl in impls:
            if impl not in BENCH_IMPLS + EXTRA_BENCH_IMPLS:
                raise unknown_name_error("benchmark implementation", impl, BENCH_IMPLS + EXTRA_BENCH_IMPLS)
        if repeats < 1 or warmup < 0:
            raise TunecostError("tokens, hidden, intermediate, experts, top-k, rank and repeats must be positive")
        _check_shape(shape)
        return _run(
            shape,
            LoraSpec(rank=rank, alpha=alpha),
            impls,
            repeats,
            warmup,
            dev,
            dtype_name,
            seed,
            measure_memory,
            on_progress,
        )


def _run(
    shape: dict[str, int],
    lora: LoraSpec,
    impls: list[str],
    repeats: int,
    warmup: int,
    dev: torch.device,
    dtype_name: str,
    seed: int,
    measure_memory: bool,
    on_progress: Callable[[int, int, str], None] | None,
) -> list[MoeBenchRow]:
    torch_dtype = getattr(torch, dtype_name)
    torch.manual_seed(seed)
    with torch.device(dev):
        hidden, intermediate, experts, top_k = (shape[k] for k in ("hidden", "intermediate", "experts", "top_k"))
        base: Any = mixtral_moe_block(hidden=hidden, intermediate=intermediate, experts=experts, top_k=top_k)
        base = base.to(torch_dtype)
        with torch.no_grad():
            base.gate.weight.normal_(0.0, 0.02)
            base.experts.gate_up_proj.normal_(0.0, 0.02)
            base.experts.down_proj.normal_(0.0, 0.02)
        x = torch.randn(1, shape["tokens"], shape["hidden"], dtype=torch_dtype)
        grad_out = torch.randn(1, shape["tokens"], shape["hidden"], dtype=torch_dtype)

    total = len(impls) * (repeats + warmup + (1 if measure_memory else 0)) + len(impls)
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if on_progress is not None:
            on_progress(done, total, label)

    blocks = {}
    for impl in impls:
        blocks[impl] = _build(impl, base, lora)
        tick(f"build {impl}")
    times: dict[str, list[tuple[float, float, float]]] = {impl: [] for impl in impls}
    for round_index in range(warmup + repeats):
        shift = round_index % len(impls)
        for impl in impls[shift:] + impls[:shift]:
            timing = _step(blocks[impl], x, grad_out, dev)
            if round_index >= warmup:
                times[impl].append(timing)
            tick(f"{impl} round {round_index + 1}")
    step_peaks = {}
    for impl in impls:
        step_peaks[impl] = _step_peak_bytes(blocks[impl], x, grad_out, dev) if measure_memory else 0
        if measure_memory:
            tick(f"{impl} memory")

    rows = []
    for impl in impls:
        block = blocks[impl]
        weight_bytes = _state_bytes(block)
        rows.append(
            MoeBenchRow(
                impl=impl,
                ms_forward_backward=1e3 * statistics.median(t[0] for t in times[impl]),
                ms_forward=1e3 * statistics.median(t[1] for t in times[impl]),
                cpu_ms_forward_backward=1e3 * statistics.median(t[2] for t in times[impl]),
                peak_bytes=weight_bytes + step_peaks[impl],
                weight_bytes=weight_bytes,
                step_peak_bytes=step_peaks[impl],
                trainable={"eager": "full", "grouped_mm": "full", "grouped_mm-frozen": "router"}.get(impl, "lora"),
                trainable_params=sum(p.numel() for p in block.parameters() if p.requires_grad),
                **shape,
                dtype=dtype_name,
                device=str(dev),
                repeats=repeats,
                threads=torch.get_num_threads(),
            )
        )
    return _with_ratios(rows, measure_memory)


def _with_ratios(rows: list[MoeBenchRow], measure_memory: bool) -> list[MoeBenchRow]:
    reference = next((row for row in rows if row.impl == REFERENCE_IMPL), None)
    if reference is None:
        return rows
    return [
        dataclasses.replace(
            row,
            speedup_vs_peft_fused=reference.ms_forward_backward / row.ms_forward_backward,
            cpu_speedup_vs_peft_fused=reference.cpu_ms_forward_backward / row.cpu_ms_forward_backward,
            peak_vs_peft_fused=(row.peak_bytes / reference.peak_bytes) if measure_memory else None,
        )
        for row in rows
    ]
