"""One tensor-parallel rank's simulated step at full depth, in the single-GPU step's terms (`single_step`): the
model under `tensor_parallel.apply_tp` on a fake process group of `tp` ranks, traced at one and two decoder
layers and scaled, so every segment's bytes are one rank's (its weight, gradient and optimizer-state shards, its
activations: 1/tp inside the parallel regions, and with sequence parallelism in the norms too).

Sources and derivations: docs/multi-gpu.md, section "Tensor parallelism: one rank on a fake process group vs gloo".
"""

from __future__ import annotations

import dataclasses
import time

from tunecost.distributed.recorder import ShardedStepRecorder
from tunecost.distributed.sharded_step import fake_process_group
from tunecost.distributed.single_step import LAYOUT_VERSION, SingleGpuStep, cached_step, scaled_step, traced_units
from tunecost.distributed.tensor_parallel import check_tp_supported, loss_context, prepare_tp_rank, tp_strategy
from tunecost.models.anatomy import layer_pattern
from tunecost.models.catalog import resolve_model
from tunecost.simulate import cache
from tunecost.simulate.batch_line import BatchLine
from tunecost.simulate.checkpointing import reentrant_checkpointing
from tunecost.simulate.fp8 import LinearShape, fp8_linears
from tunecost.simulate.overhead import DEFAULT_OVERHEAD
from tunecost.simulate.prepare import check_supported
from tunecost.simulate.recorder import flat_tensors
from tunecost.simulate.step import make_batch, run_step
from tunecost.simulate.trace import TraceResult, analyze, read_off_line
from tunecost.workload.job import FineTuneJob

TP_LAYOUT_VERSION = "1"  # of the TP plan behind a cached step
_LINES: dict[tuple, tuple[BatchLine, list]] = {}  # (layout, job shape, units) -> its steps' line, its FP8 linears


def trace_tp_step(
    prepared,
    batch_size: int,
    seq_len: int,
    *,
    tp: int,
    round_bytes: int = 512,
    loss_parallel: bool = True,
    line: BatchLine | None = None,
) -> TraceResult:
    """`simulate.trace.trace_step` for a model whose parameters are DTensors: their local shards registered, and
    the collectives recorded (`ShardedStepRecorder`); the step is added to `line`, if given."""
    start = time.perf_counter()
    batch = make_batch(prepared.spec.vocab_size, batch_size, seq_len, prepared.fake_mode)
    rec = ShardedStepRecorder(
        world_size=tp,
        plan=prepared.plan,
        module_info=prepared.module_info,
        round_bytes=round_bytes,
        desugar_dtensor=True,
    )
    for tensor, category, group in prepared.static:
        for local in flat_tensors(tensor):
            rec.register_static(local, category, group)
    for tensor in batch.values():
        rec.register_static(tensor, "inputs", "other")
    rec.install_hooks(prepared.model, prepared.trainable)
    try:
        with loss_context(loss_parallel):
            run_step(prepared, batch, rec)
    finally:
        rec.finish()
    result = analyze(rec, prepared.plan.num_layers, time.perf_counter() - start)
    result.extra["collectives"] = rec.collectives
    if line is not None:
        line.observe(batch_size, rec)
    return result


def tp_single_gpu_step(
    job: FineTuneJob,
    *,
    tp: int,
    sequence_parallel: bool,
    granule_bytes: int = 512,
    use_cache: bool = True,
    full_depth: bool = False,
    loss_parallel: bool = True,
) -> SingleGpuStep:
    """One TP rank's `SingleGpuStep`: traced at one and two units on a fake process group of `tp` ranks and scaled
    to full depth (or, `full_depth`, slow: traced at full depth). Cached as `single_step.single_gpu_step` is, with
    tp and sequence parallelism in the key."""
    spec = resolve_model(job.model)
    check_supported(job, spec)
    check_tp_supported(job, tp, sequence_parallel=sequence_parallel)
    layout = tp_strategy(tp, sequence_parallel, loss_parallel)
    key = f"rank-{layout}-{TP_LAYOUT_VERSION}-{LAYOUT_VERSION}-" + cache.job_key(
        job, None, DEFAULT_OVERHEAD, granule_bytes, None
    )
    if full_depth:
        key += "-full"

    def trace() -> SingleGpuStep:
        linears: list[list[LinearShape]] = []
        batchless = dataclasses.replace(job, batch_size=1)
        shape = (layout, cache.job_key(batchless, None, DEFAULT_OVERHEAD, granule_bytes, None))

        def trace_units(units: int) -> TraceResult:
            line, unit_linears = _LINES.setdefault((*shape, units), (BatchLine(granule_bytes), []))
            result = read_off_line(line, job.batch_size)
            linears.append(unit_linears)
            if result is not None:
                return result
            with fake_process_group(tp):
                prepared = prepare_tp_rank(
                    job,
                    sequence_parallel=sequence_parallel,
                    real=False,
                    num_units=units,
                    loss_parallel=loss_parallel,
                )
                sp_tp = tp if sequence_parallel else 1
                unit_linears[:] = fp8_linears(
                    prepared.model.named_modules(), full=job.method == "full", sequence_parallel_tp=sp_tp
                )
                return trace_tp_step(
                    prepared,
                    job.batch_size,
                    job.worst_case_seq_len,
                    tp=tp,
                    round_bytes=granule_bytes,
                    loss_parallel=loss_parallel,
                    line=line,
                )

        units = traced_units(spec, full_depth=full_depth)
        traces = [trace_units(u) for u in units]
        full_units = layer_pattern(spec)[2]
        return scaled_step(
            job,
            spec,
            traces,
            reentrant=reentrant_checkpointing(job),
            linears=linears[: len(traces)],
            granule_bytes=granule_bytes,
            deeper=lambda: trace_units(units[-1] + 1) if units[-1] < full_units else None,
        )

    return cached_step(key, trace, use_cache=use_cache)
