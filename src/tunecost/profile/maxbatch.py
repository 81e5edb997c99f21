"""Largest batch size that fits (paper Table III): grow by doubling until a probe fails, then bisect.

Sources and derivations: docs/profiling.md, section `tunecost.profile.maxbatch`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.errors import TunecostError
from tunecost.profile.loop import make_optimizer, train_step
from tunecost.profile.model_setup import build_training_model, resolve_profile_model
from tunecost.profile.point import is_out_of_memory, release_memory
from tunecost.profile.sweep import make_source
from tunecost.profile.timers import make_clock
from tunecost.results.records import record
from tunecost.results.schema import point_id
from tunecost.simulate.batch import default_margin_fraction, device_need_bytes, fits_with_margin, search_with_margin
from tunecost.simulate.simulator import simulate_step
from tunecost.units import format_bytes
from tunecost.workload.job import FineTuneJob, LoraConfig, default_lora_targets


@dataclass(frozen=True, kw_only=True)
class Probe:
    batch_size: int
    fits: bool
    peak_bytes: int | None = None
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class MaxBatchSearch:
    max_batch_size: int  # 0: not even batch size 1 fits
    probes: tuple[Probe, ...]
    memory_bytes: int  # the budget searched against
    source: str  # "measured-cuda" | "simulated"
    estimator: str  # how a probe decided
    seq_len: int  # tokens per query of the probed (longest) batch
    hit_limit: bool = False  # stopped at `limit` while still fitting
    borderline_batch_size: int | None = None  # simulated: largest within the card without the safety margin
    margin_fraction: float = 0.0  # simulated: the safety margin a fit is judged with

    @property
    def boundary(self) -> Probe | None:
        """The smallest batch size that did not fit (None if none failed)."""
        fails = [p for p in self.probes if not p.fits]
        return min(fails, key=lambda p: p.batch_size) if fails else None


def search_max_batch_size(
    probe: Callable[[int], Probe], *, start: int = 1, limit: int = 4096, on_probe: Callable[[Probe], None] | None = None
) -> tuple[int, list[Probe], bool]:
    """Grow (x2) from `start` until a probe fails or `limit`, then bisect. Returns (max that fit, probes, hit_limit).

    Assumes fitting is monotone in the batch size (a larger batch never needs less memory).
    """
    if start < 1 or limit < start:
        raise TunecostError(f"bad batch-size search range: start {start}, limit {limit}")
    probes: list[Probe] = []

    def run(b: int) -> bool:
        p = probe(b)
        probes.append(p)
        if on_probe:
            on_probe(p)
        return p.fits

    good, bad, b = 0, None, start
    while b <= limit:
        if run(b):
            good = b
            if b == limit:
                break
            b = min(b * 2, limit)
        else:
            bad = b
            break
    if bad is None:
        return good, probes, good == limit
    lo, hi = good, bad  # lo fits (0: nothing yet), hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if run(mid):
            lo = mid
        else:
            hi = mid
    return lo, probes, False


# ------------------------------------------------------------------------------------------------- CUDA


def measured_max_batch_size(
    prepared: Any,
    source: Any,
    *,
    device: str,
    memory_bytes: int | None = None,
    limit: int = 4096,
    router_aux_loss: bool = True,
    on_probe: Callable[[Probe], None] | None = None,
) -> MaxBatchSearch:
    """Search on the GPU with real training steps on `source.longest_batch(b)` (see docs/profiling.md)."""
    import torch

    if not device.startswith("cuda"):
        raise TunecostError("a measured max-batch search needs a CUDA device; on CPU use the simulated search")
    index = torch.device(device).index or 0
    total = torch.cuda.get_device_properties(index).total_memory
    if memory_bytes is not None:
        if memory_bytes > total:
            raise TunecostError(f"memory budget {format_bytes(memory_bytes)} exceeds this GPU's {format_bytes(total)}")
        torch.cuda.set_per_process_memory_fraction(memory_bytes / total, index)
    model = prepared.model
    clock = make_clock(device)

    def probe(b: int) -> Probe:
        optimizer = batch = None
        try:
            batch = source.longest_batch(b).to(device)
            optimizer = make_optimizer(model)
            torch.cuda.reset_peak_memory_stats(index)
            train_step(model, optimizer, batch, clock, device=device, router_aux_loss=router_aux_loss)
            return Probe(batch_size=b, fits=True, peak_bytes=int(torch.cuda.max_memory_allocated(index)))
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            return Probe(batch_size=b, fits=False, detail=str(exc).splitlines()[0][:200])
        finally:
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
            model.zero_grad(set_to_none=True)
            del optimizer, batch
            release_memory(device)

    try:
        best, probes, hit = search_max_batch_size(probe, limit=limit, on_probe=on_probe)
    finally:
        if memory_bytes is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, index)
    return MaxBatchSearch(
        max_batch_size=best,
        probes=tuple(probes),
        memory_bytes=memory_bytes or total,
        source="measured-cuda",
        estimator="training step on the longest batch, OOM caught",
        seq_len=source.max_length,
        hit_limit=hit,
    )


# -------------------------------------------------------------------------------------------------- CPU


def simulated_search(
    job: Any,
    memory_bytes: int,
    *,
    limit: int = 4096,
    peak_bytes_fn: Callable[[Any], int] | None = None,
    on_probe: Callable[[Probe], None] | None = None,
) -> MaxBatchSearch:
    """The simulator's search against `memory_bytes`: each probe the device need of `job` at that batch size
    (reserved + CUDA context), judged with the safety margin as `memory` and `estimate` judge it."""
    need_of = peak_bytes_fn or simulator_need_bytes
    margin = default_margin_fraction()
    needs: dict[int, int] = {}

    def need(b: int) -> int:
        if b not in needs:
            needs[b] = int(need_of(job.with_(batch_size=b)))
            if on_probe:
                on_probe(
                    Probe(batch_size=b, fits=fits_with_margin(needs[b], memory_bytes, margin), peak_bytes=needs[b])
                )
        return needs[b]

    best, border = search_with_margin(need, memory_bytes, margin, first=1, max_batch=limit)
    probes = tuple(
        Probe(batch_size=b, fits=fits_with_margin(n, memory_bytes, margin), peak_bytes=n) for b, n in needs.items()
    )
    return MaxBatchSearch(
        max_batch_size=best,
        probes=probes,
        memory_bytes=memory_bytes,
        source="simulated",
        estimator=getattr(need_of, "estimator", "tunecost.simulate step simulator"),
        seq_len=job.worst_case_seq_len,
        hit_limit=best == limit,
        borderline_batch_size=border,
        margin_fraction=margin,
    )


def simulator_need_bytes(job: Any) -> int:
    """What one training step of `job` takes from a GPU per the step simulator: the caching allocator's reserve
    plus the device overhead (CUDA context)."""
    sim = simulate_step(job)
    return device_need_bytes(sim.peak_reserved_bytes, sim.device_overhead_bytes)


simulator_need_bytes.estimator = (  # type: ignore[attr-defined]
    "tunecost.simulate.simulate_step: reserved memory + device overhead, with the safety margin"
)


def catalog_gpu_budget(gpu: Any, device: str) -> int | None:
    """The memory a search against catalog GPU `gpu` (`--gpu`) gets: the GPU's usable memory (the total CUDA
    reports, from the catalog); None, the device's whole memory, when the search runs on a CUDA device that is
    that GPU: its own total is then measured, not taken from the catalog (drivers differ by a few MiB)."""
    if device.startswith("cuda"):
        import torch

        try:
            here = resolve_gpu_name(torch.cuda.get_device_name(torch.device(device).index or 0)).gpu.name
        except TunecostError:
            here = None
        if here == gpu.name:
            return None
    return gpu.usable_memory_bytes


def find_max_batch_size(
    setup: Any,
    inputs: Any,
    *,
    memory_bytes: int | None = None,
    limit: int = 4096,
    on_probe: Callable[[Probe], None] | None = None,
) -> MaxBatchSearch:
    """Measured search on CUDA (`setup.device`), simulated search against `memory_bytes` elsewhere.

    setup: a `tunecost.profile.model_setup.ModelSetup`; inputs: a `tunecost.profile.sweep.InputSpec` with one
    sequence length or a dataset (the probes use its longest queries).
    """
    if len(inputs.resolved_seq_lens) != 1:
        raise TunecostError("max-batch takes one sequence length (or a dataset)")
    seq_len = inputs.resolved_seq_lens[0]
    spec = resolve_profile_model(setup.model)
    if setup.device.startswith("cuda"):
        prepared = build_training_model(setup, spec=spec)
        vocab = int(getattr(prepared.model.config, "vocab_size", spec.vocab_size))
        source = make_source(inputs, vocab_size=vocab, seq_len=seq_len, num_queries=1, seed=setup.seed)
        return measured_max_batch_size(
            prepared, source, device=setup.device, memory_bytes=memory_bytes, limit=limit, on_probe=on_probe
        )
    if memory_bytes is None:
        raise TunecostError("on CPU the search is simulated against a GPU's memory: give --gpu G or --gpu-memory-gb X")
    if setup.experts_impl is not None:
        raise TunecostError(
            f"--experts-impl {setup.experts_impl}: the implementation a measured search (CUDA) runs; the simulated "
            "search (CPU) traces the job's stack"
        )

    lengths = None
    if inputs.dataset:
        lengths = make_source(inputs, vocab_size=spec.vocab_size, seq_len=None, num_queries=1).lengths
    job = FineTuneJob(
        model=setup.model,
        method=setup.method,
        experts_per_token=setup.experts_per_token,
        lora=LoraConfig(rank=setup.lora_rank, alpha=setup.lora_alpha, targets=default_lora_targets(is_moe=spec.is_moe)),
        compute_dtype=setup.dtype or "bf16",
        gradient_checkpointing=setup.gradient_checkpointing,
        batch_size=1,
        seq_len=seq_len,
        lengths=lengths,
        dataset=inputs.dataset,
    )
    return simulated_search(job, memory_bytes, limit=limit, on_probe=on_probe)


def max_batch_row(result: MaxBatchSearch, setup: Any, inputs: Any, *, gpu: str | None = None) -> dict[str, Any]:
    """The `max_batch.jsonl` row (docs/dev/records.md) of a search, with every probe."""
    spec = resolve_profile_model(setup.model)
    keys = {
        "model": setup.model,
        "method": setup.method,
        "experts_impl": setup.resolved_experts_impl,
        "experts_per_token": spec.top_k(setup.experts_per_token),
        "batch_size": None,
        "seq_len": inputs.resolved_seq_lens[0],
        "dataset": inputs.dataset,
        "device": "cuda" if setup.device.startswith("cuda") else "cpu",
    }
    return record(
        "max_batch",
        **{
            **keys,
            "point_id": point_id({**keys, "memory_bytes": result.memory_bytes}),
            "max_batch_size": result.max_batch_size,
            "borderline_batch_size": result.borderline_batch_size,
            "margin_fraction": result.margin_fraction,
            "gpu": gpu,
            "memory_bytes": result.memory_bytes,
            "source": result.source,
            "estimator": result.estimator,
            "probe_seq_len": result.seq_len,
            "hit_limit": result.hit_limit,
            "probes": [
                {"batch_size": p.batch_size, "fits": p.fits, "peak_bytes": p.peak_bytes, "detail": p.detail}
                for p in result.probes
            ],
        },
    )
