"""Microbenchmarks of one device, for the throughput model's per-GPU terms (`tunecost calibrate-gpu`).

Sources and derivations: docs/profiling.md, section `tunecost.profile.gpu_bench`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from tunecost.catalog.gpu_terms import GpuTerms
from tunecost.errors import TunecostError
from tunecost.results.meta import device_info

ProgressFn = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class BenchPlan:
    """Sizes of every benchmark. `for_device` picks the defaults (full or `quick`)."""

    square: int  # M = K = N of the peak GEMM
    expert_k: int  # hidden size of the expert GEMMs
    expert_n: int  # expert intermediate size
    rows: tuple[int, ...]  # the M values of the small-M GEMMs
    elementwise_numel: int
    dequant_shape: tuple[int, int]
    launches: int  # tiny kernels per round of the launch benchmark
    host_steps: int  # empty steps per round
    repeats: int
    warmup: int

    @classmethod
    def for_device(cls, device: str, *, quick: bool = False) -> BenchPlan:
        kind = "cuda" if device.startswith("cuda") else "cpu"
        columns = [f.name for f in fields(cls) if f.name != "dequant_shape"]  # _PLANS' columns, in field order
        sizes: dict[str, Any] = dict(zip(columns, _PLANS[(kind, quick)], strict=True))
        # the de-quantization benchmark uses one expert weight of the GEMM benchmark
        return cls(dequant_shape=(sizes["expert_k"], sizes["expert_n"]), **sizes)


# The default plans by (device kind, quick). CUDA uses Mixtral-8x7B's expert shape (hidden K=4096, expert
# intermediate N=14336); the CPU plans keep its (K, N) ratio at a size a CPU runs in seconds (K, N / 4 in full,
# / 16 in quick). Columns: BenchPlan's fields in order, without dequant_shape.
_PLANS: dict[tuple[str, bool], tuple[Any, ...]] = {
    ("cuda", False): (8192, 4096, 14336, tuple(2**i for i in range(13)), 2**28, 10000, 1000, 10, 3),
    ("cuda", True): (4096, 4096, 14336, (1, 16, 256, 4096), 2**26, 2000, 200, 5, 2),
    ("cpu", False): (1024, 1024, 3584, (1, 4, 16, 64, 256, 1024), 2**24, 5000, 500, 5, 1),
    ("cpu", True): (256, 256, 896, (1, 8, 64, 256), 2**20, 500, 50, 3, 1),
}


@dataclass(frozen=True, kw_only=True)
class GemmTiming:
    rows: int  # M
    k: int
    n: int
    seconds: float  # median per call
    flops_per_s: float


@dataclass(frozen=True, kw_only=True)
class Measured:
    value: float | None
    unit: str
    method: str  # how it was measured (stored in the profile beside the value)


@dataclass(frozen=True, kw_only=True)
class GpuBenchResult:
    device: str  # "cpu" | "cuda"
    device_name: str
    dtype: str  # of the matmul benchmarks ("bfloat16" on CUDA, "float32" on CPU)
    values: dict[str, Measured]  # keyed by GpuTerms field name
    gemms: tuple[GemmTiming, ...]
    plan: BenchPlan
    seconds: float  # wall time of the whole calibration

    def terms(self, *, source: str) -> GpuTerms:
        v = {k: m.value for k, m in self.values.items()}
        return GpuTerms(name=self.device_name, source=source, **v)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------------ timing


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def time_call(fn: Callable[[], Any], device: str, *, repeats: int, warmup: int, calls: int = 1) -> float:
    """Median seconds per call of `fn` over `repeats` rounds of `calls` calls each, after `warmup` untimed calls.

    CUDA: device synchronised before each round, CUDA events around its calls, one synchronisation to read them.
    CPU: perf_counter around each round."""
    for _ in range(warmup):
        fn()
    _sync(device)
    per_call: list[float] = []
    if device.startswith("cuda"):
        import torch

        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            torch.cuda.synchronize()
            per_call.append(start.elapsed_time(end) / 1e3 / calls)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            per_call.append((time.perf_counter() - t0) / calls)
    return float(statistics.median(per_call))


def host_time_per_call(fn: Callable[[], Any], device: str, *, count: int, repeats: int, warmup: int) -> float:
    """Median host seconds per call over rounds of `count` calls: the device is idle at the start of a round and
    not waited for inside it, so on CUDA this is the time to issue the work, not to run it."""
    for _ in range(warmup):
        for _ in range(count):
            fn()
    per_call: list[float] = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(count):
            fn()
        per_call.append((time.perf_counter() - t0) / count)
    _sync(device)
    return float(statistics.median(per_call))


# ------------------------------------------------------------------------------------------------------ fitting


def gemm_flops(rows: int, k: int, n: int) -> float:
    """FLOPs of an (M, K) x (K, N) GEMM: one multiply and one add per output element and K."""
    return 2.0 * rows * k * n


def fit_half_rows(gemms: tuple[GemmTiming, ...] | list[GemmTiming], peak_flops_per_s: float) -> float | None:
    """M_half of throughput(M) = P * M / (M + M_half), with P fixed at the large-shape peak.

    Equivalently time(M) = 2*K*N*(M + M_half) / P. With c_i = 2*K*N / (P * t_i) the relative time residual is
    c_i*M_i + c_i*M_half - 1, linear in M_half; its least-squares solution is sum c_i (1 - c_i M_i) / sum c_i^2.
    None when the fit is not positive (small-M GEMMs as fast per FLOP as the peak: no small-M penalty measured)."""
    if not gemms or not (peak_flops_per_s > 0):
        return None
    c = [2.0 * g.k * g.n / (peak_flops_per_s * g.seconds) for g in gemms]
    den = sum(ci * ci for ci in c)
    num = sum(ci * (1.0 - ci * g.rows) for ci, g in zip(c, gemms, strict=True))
    half = num / den if den > 0 else 0.0
    return half if half > 0 else None


# ------------------------------------------------------------------------------------------------------ benchmarks


def _resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise TunecostError("--device cuda: no CUDA device is available (use --device cpu or auto)")
        return "cuda"
    if device == "cpu":
        return "cpu"
    raise TunecostError(f"unknown device {device!r}: use cpu, cuda or auto")


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return str(torch.cuda.get_device_name())

    return str(device_info("cpu").get("name") or "cpu")


def run_gpu_bench(
    device: str = "auto", *, quick: bool = False, plan: BenchPlan | None = None, on_progress: ProgressFn | None = None
) -> GpuBenchResult:
    """Run every microbenchmark on `device` ("cpu" | "cuda" | "auto") and return the measured values."""
    import torch

    t_start = time.perf_counter()
    dev = _resolve_device(device)
    plan = plan or BenchPlan.for_device(dev, quick=quick)
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    say = on_progress or (lambda _label: None)
    r, w = plan.repeats, plan.warmup
    values: dict[str, Measured] = {}

    say(f"square GEMM {plan.square}^3 ({str(dtype).split('.')[-1]})")
    values["matmul_flops_per_s"] = Measured(
        value=_square_gemm(plan.square, dtype, dev, r, w),
        unit="FLOP/s",
        method=f"median of {r} rounds: ({plan.square}x{plan.square}) @ ({plan.square}x{plan.square}) "
        f"{str(dtype).split('.')[-1]} torch.matmul, 2*M*K*N FLOPs per call",
    )
    gemms = []
    weight = torch.randn(plan.expert_k, plan.expert_n, device=dev, dtype=dtype)
    for rows in plan.rows:
        say(f"expert GEMM M={rows}, K={plan.expert_k}, N={plan.expert_n}")
        gemms.append(_expert_gemm(rows, weight, dev, r, w))
    del weight
    half = fit_half_rows(gemms, values["matmul_flops_per_s"].value or 0.0)
    values["matmul_half_rows"] = Measured(
        value=half,
        unit="rows",
        method=f"least-squares fit of time(M) = 2KN(M + M_half)/P to GEMMs M in {list(plan.rows)}, "
        f"K={plan.expert_k}, N={plan.expert_n}, P = the square GEMM's FLOP/s",
    )

    say("fp32 GEMM (TF32 off)")
    values["fp32_flops_per_s"] = Measured(
        value=_square_gemm(plan.square, torch.float32, dev, r, w),
        unit="FLOP/s",
        method=f"median of {r} rounds: {plan.square}^3 float32 torch.matmul with TF32 off",
    )

    say(f"element-wise add, {plan.elementwise_numel} elements")
    values["memory_bytes_per_s"] = _elementwise(plan.elementwise_numel, dtype, dev, r, w)

    say("NF4 de-quantization (bitsandbytes)")
    values["dequant_bytes_per_s"] = _dequant(plan, dev, r, w)

    say(f"kernel launch, {plan.launches} tiny ops")
    tiny = torch.zeros(1, device=dev)
    tiny_out = torch.empty_like(tiny)
    values["kernel_launch_s"] = Measured(
        value=host_time_per_call(
            lambda: torch.add(tiny, 1.0, out=tiny_out), dev, count=plan.launches, repeats=r, warmup=1
        ),
        unit="s",
        method=f"median of {r} rounds of {plan.launches} torch.add on a 1-element tensor: host perf_counter per op, "
        "device idle at the start, not waited for inside",
    )

    say("empty training step")
    values["host_step_s"] = Measured(
        value=_empty_step(dev, plan.host_steps, r),
        unit="s",
        method=f"median of {r} rounds of {plan.host_steps} steps: synchronize, AdamW.step and zero_grad over a "
        "parameter without gradient (no kernels), synchronize; perf_counter per step",
    )
    return GpuBenchResult(
        device=dev,
        device_name=device_name(dev),
        dtype=str(dtype).split(".")[-1],
        values=values,
        gemms=tuple(gemms),
        plan=plan,
        seconds=time.perf_counter() - t_start,
    )


def _square_gemm(size: int, dtype: Any, dev: str, repeats: int, warmup: int) -> float:
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        a = torch.randn(size, size, device=dev, dtype=dtype)
        b = torch.randn(size, size, device=dev, dtype=dtype)
        s = time_call(lambda: torch.matmul(a, b), dev, repeats=repeats, warmup=warmup)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    return gemm_flops(size, size, size) / s


def _expert_gemm(rows: int, weight: Any, dev: str, repeats: int, warmup: int) -> GemmTiming:
    import torch

    k, n = weight.shape
    a = torch.randn(rows, k, device=dev, dtype=weight.dtype)
    calls = max(1, min(50, 4096 // rows))  # several calls per round where one is too short to time alone
    s = time_call(lambda: torch.matmul(a, weight), dev, repeats=repeats, warmup=warmup, calls=calls)
    return GemmTiming(rows=rows, k=k, n=n, seconds=s, flops_per_s=gemm_flops(rows, k, n) / s)


def _elementwise(numel: int, dtype: Any, dev: str, repeats: int, warmup: int) -> Measured:
    import torch

    x = torch.randn(numel, device=dev, dtype=dtype)
    y = torch.randn_like(x)
    z = torch.empty_like(x)
    s = time_call(lambda: torch.add(x, y, out=z), dev, repeats=repeats, warmup=warmup)
    return Measured(
        value=3 * x.numel() * x.element_size() / s,
        unit="bytes/s",
        method=f"median of {repeats} rounds: c = a + b over {numel} {str(dtype).split('.')[-1]} elements, "
        "3 * numel * element size bytes",
    )


def _dequant(plan: BenchPlan, dev: str, repeats: int, warmup: int) -> Measured:
    import torch

    try:
        import bitsandbytes.functional as bnbf
    except ImportError:
        return Measured(value=None, unit="bytes/s", method="not measured: bitsandbytes is not installed")
    weight = torch.randn(*plan.dequant_shape, device=dev, dtype=torch.bfloat16)
    packed, state = bnbf.quantize_4bit(weight, blocksize=64, compress_statistics=True, quant_type="nf4")
    del weight
    # out= is CUDA-only in bitsandbytes 0.50, so every call allocates its output (the caching allocator's reuse on CUDA)
    s = time_call(lambda: bnbf.dequantize_4bit(packed, state, quant_type="nf4"), dev, repeats=repeats, warmup=warmup)
    numel = plan.dequant_shape[0] * plan.dequant_shape[1]
    return Measured(
        value=numel * 2 / s,
        unit="bytes/s",
        method=f"median of {repeats} rounds: bitsandbytes dequantize_4bit of a {plan.dequant_shape[0]}x"
        f"{plan.dequant_shape[1]} NF4 weight (blocksize 64, double quantization), bf16 bytes written",
    )


def _empty_step(dev: str, count: int, repeats: int) -> float:
    import torch

    param = torch.nn.Parameter(torch.zeros(1, device=dev))
    optimizer = torch.optim.AdamW([param], lr=1e-4)

    def step() -> None:
        _sync(dev)
        optimizer.step()  # no gradient: AdamW skips the parameter, nothing is launched
        optimizer.zero_grad(set_to_none=True)
        _sync(dev)

    return host_time_per_call(step, dev, count=count, repeats=repeats, warmup=1)
