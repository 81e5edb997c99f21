"""Predictions per corpus row beside its measurement, and the accuracy and interval coverage per quantity and stack.

Memory quantities come from one simulated step plus the device overhead it states; throughput quantities from
the throughput model (`throughput`); each prediction carries its 95 % interval (`intervals`).
Sources and derivations: docs/validation.md, section `tunecost.validate.run`.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace

from tunecost.catalog.gpu_terms import GpuTerms
from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.catalog.held_out_errors import THROUGHPUT_QUANTITIES, HeldOutError, StackEfficiency
from tunecost.catalog.held_out_errors import stack_efficiencies as tp_priors
from tunecost.errors import TunecostError
from tunecost.estimate.throughput.stack_priors import FITTED_PARAMETER, model_kind, prior_efficiency, stack_family
from tunecost.simulate import simulate_step
from tunecost.simulate.batch import default_margin_fraction
from tunecost.simulate.batch import fit_verdict as margin_verdict
from tunecost.units import BYTES_PER_GIB
from tunecost.validate import throughput as tp
from tunecost.validate.cells import measured_value
from tunecost.validate.corpus import CorpusRow
from tunecost.validate.intervals import with_intervals
from tunecost.validate.mapping import MappedRow, Skip, map_row

OUTPUT_COLUMNS = ("id", "quantity", "measured", "predicted", "low", "high", "unit", "error", "status", "reason")
# "GB", "G" (as some tables print it) and "MB" are read as binary units, as the corpus's sources use them
_UNIT_BYTES = {
    **dict.fromkeys(("gib", "gb", "g", "gi", "gbyte", "gbytes", "gigabyte", "gigabytes"), BYTES_PER_GIB),
    **dict.fromkeys(("mib", "mb", "mi", "mbyte", "mbytes", "megabyte", "megabytes"), 2**20),
    **dict.fromkeys(("bytes", "byte", "b"), 1),
}


def unit_bytes(unit: str) -> int | None:
    """Bytes per unit of a memory value ("GiB", "GB", "G", "MiB", "MB", "bytes", in any case, with a qualifier:
    "GiB per GPU", "GB/GPU", "GB (per device)"); None for an unknown unit."""
    first = re.match(r"\s*([a-z]+)\s*(?:$|/|\(|per\b)", unit.lower())
    return _UNIT_BYTES.get(first[1]) if first else None


@dataclass(frozen=True, kw_only=True)
class ValidationRow:
    id: str
    quantity: str
    measured: float | None
    predicted: float | None
    unit: str
    error: float | None
    status: str  # ok | skipped
    reason: str
    stack: str = ""  # the named stack (summary key; not an output column)
    # tunecost's verdict that the row's setting fits its GPU (None: GPU memory unknown; not an output column);
    # on a peak-memory row the run did fit
    fits: bool | None = None
    # the commands' verdict with the safety margin on what the device gives (reserve + CUDA context): yes,
    # borderline or no (None: GPU memory unknown; not an output column)
    fit: str | None = None
    source: str = ""  # the row's publication (not an output column): its own errors never set its interval
    low: float | None = None  # the 95 % interval of the prediction (validate.intervals), where it has one
    high: float | None = None
    interval: str = ""  # which held-out errors set it (not an output column)
    prior: bool = False  # a throughput predicted with its stack family's prior (no row of its group calibrated)
    model_kind: str = "dense"  # dense or moe (`catalog.held_out_errors.MODEL_KINDS`): its interval's pool

    def as_output(self) -> dict[str, object]:
        d = asdict(self)
        return {k: d[k] for k in OUTPUT_COLUMNS}

    @property
    def inside(self) -> bool | None:
        """The measurement lies in the interval (None: no interval)."""
        if self.low is None or self.high is None or self.measured is None:
            return None
        return self.low <= self.measured <= self.high


def _outcome(
    row: CorpusRow,
    measured: float | None,
    *,
    predicted: float | None = None,
    error: float | None = None,
    reason: str = "",
    stack: str = "",
    fits: bool | None = None,
    fit: str | None = None,
) -> ValidationRow:
    """A row's outcome: `ok` with its prediction, else `skipped` (no prediction) with the reason."""
    return ValidationRow(
        id=row.id,
        quantity=row.get("quantity"),
        measured=measured,
        predicted=predicted,
        unit=row.get("unit"),
        error=error,
        status="skipped" if predicted is None else "ok",
        reason=reason,
        stack=stack,
        fits=fits,
        fit=fit,
        source=row.get("source"),
    )


def _skipped(row: CorpusRow, reason: str, stack: str = "") -> ValidationRow:
    measured: float | None
    try:
        measured = measured_value(row)
    except ValueError:
        measured = None
    return _outcome(row, measured, reason=reason, stack=stack)


def outside_allocator_bytes(sim) -> int:
    """Device memory the caching allocator does not manage: the CUDA context, and NCCL's on a multi-GPU rank."""
    return int(sim.device_overhead_bytes + getattr(sim, "nccl_bytes", 0))


def predicted_bytes(quantity: str, sim, gpu_memory_bytes: int | None = None) -> int:
    """The simulated figure a memory quantity measures, in bytes (`sim`: a `StepSimulation` or, for one rank of
    a multi-GPU row, a `RankMemory`). The reserve is capped by what a GPU of `gpu_memory_bytes` leaves the
    allocator, and is never below the allocated peak."""
    allocated = int(sim.peak_bytes)
    if quantity == "peak_allocated_gib":
        return allocated
    outside = outside_allocator_bytes(sim)
    reserved = max(allocated, int(getattr(sim, "peak_reserved_bytes", allocated)))
    if gpu_memory_bytes is not None:
        reserved = max(allocated, min(reserved, gpu_memory_bytes - outside))
    return reserved if quantity == "peak_reserved_gib" else reserved + outside


def fit_verdict(need_bytes: int, gpu_memory_bytes: int) -> str:
    """The verdict `memory` and `estimate` give: yes, borderline or no with the default safety margin."""
    return margin_verdict(need_bytes, gpu_memory_bytes, default_margin_fraction())


def _simulate(mapped: MappedRow):
    if mapped.model_parallel is not None:  # the most loaded rank of the row's TP/PP/CP layout
        from tunecost.distributed.model_parallel import model_parallel_rank_memory

        return model_parallel_rank_memory(tp.rank_step(mapped), mapped.simulator_job, mapped.plan())
    if mapped.strategy is not None:  # one rank of the row's layout (or of DeepSpeed's ZeRO on one GPU)
        from tunecost.distributed.rank_memory import rank_memory

        return rank_memory(tp.rank_step(mapped), mapped.simulator_job, mapped.plan())

    return simulate_step(mapped.simulator_job, behaviour=mapped.behaviour)


def _simulation_failed(exc: Exception) -> str:
    """A skip reason for a simulation that raised: the first line of its message (or the exception's type)."""
    message = str(exc).strip()
    return f"simulation failed: {message.splitlines()[0] if message else type(exc).__name__}"


def validate_row(row: CorpusRow, simulate: Callable[[MappedRow], object] = _simulate) -> ValidationRow:
    """One row's prediction beside its measurement, or the reason it is skipped (never raises). A throughput
    row alone is its own calibration row (use `validate_rows` to predict throughput)."""
    if row.get("quantity") in THROUGHPUT_QUANTITIES:
        return validate_throughput_rows([row])[0]
    try:
        mapped = map_row(row)
    except Skip as exc:
        return _skipped(row, str(exc))
    quantity, unit = row.get("quantity"), row.get("unit")
    try:
        measured = measured_value(row)
    except ValueError:
        return _skipped(row, f"value {row.get('value')!r} is not a number", mapped.stack.name)
    if quantity != "oom" and unit_bytes(unit) is None:
        return _skipped(row, f"unit {unit!r} not known for {quantity}", mapped.stack.name)
    if quantity != "oom" and not 0 < measured < math.inf:
        return _skipped(row, "value must be a finite number > 0", mapped.stack.name)
    try:
        sim = simulate(mapped)
    except Exception as exc:  # a row the simulator cannot run is reported, never a crash
        return _skipped(row, _simulation_failed(exc), mapped.stack.name)
    error: float | None
    needed = predicted_bytes("peak_allocated_gib", sim) + outside_allocator_bytes(sim)
    fits = None if mapped.gpu_memory_bytes is None else needed <= mapped.gpu_memory_bytes
    device_need = predicted_bytes("nvidia_smi_gib", sim)
    fit = None if mapped.gpu_memory_bytes is None else fit_verdict(device_need, mapped.gpu_memory_bytes)
    if quantity == "oom":
        assert fits is not None
        predicted = 0.0 if fits else 1.0
        error = predicted - measured
    else:
        predicted = round(
            predicted_bytes(quantity, sim, mapped.gpu_memory_bytes) / (unit_bytes(unit) or BYTES_PER_GIB), 3
        )
        error = round((predicted - measured) / measured * 100.0, 2) if measured else None
    out = _outcome(
        row, measured, predicted=predicted, error=error, reason=mapped.note, stack=mapped.stack.name, fits=fits, fit=fit
    )
    return replace(out, model_kind=model_kind(mapped.job.model))


def _throughput_ok(
    row: CorpusRow, mapped: MappedRow, measured: float, predicted: float, reason: str, prior: bool = False
) -> ValidationRow:
    error = None if reason == tp.CALIBRATION_REASON else round((predicted - measured) / measured * 100.0, 2)
    reason = "; ".join(r for r in (reason, mapped.note) if r)
    out = _outcome(row, measured, predicted=round(predicted, 4), error=error, reason=reason, stack=mapped.stack.name)
    return replace(out, prior=prior, model_kind=model_kind(mapped.job.model))


def validate_throughput_rows(
    rows: list[CorpusRow],
    counts_fn: tp.CountsFn = tp.micro_batch_counts,
    rank_step_fn: tp.RankStepFn = tp.rank_step,
    priors: Sequence[StackEfficiency] | None = None,
    prior_only: bool = False,
    calibrated: list[StackEfficiency] | None = None,
) -> dict[int, ValidationRow]:
    """Throughput rows by position: one calibration row per (stack, GPU) (see `throughput`), the rest predicted.
    A calibration row is `ok` with reason "calibration row" and no error (it is fitted, not predicted). A group of
    one row is predicted with its family's prior (`stack_priors.prior_efficiency`) over `priors` (default: the
    shipped corpus's efficiencies) and this file's calibrated groups; `prior_only` predicts every group so, from
    the file's other stacks (the held-out errors of that kind). `calibrated` collects the fitted efficiencies."""
    out: dict[int, ValidationRow] = {}
    groups: dict[tuple[str, str, str], list[tuple[int, CorpusRow, MappedRow, float, tp.AnalyticStepCounts]]] = {}
    for i, row in enumerate(rows):
        try:
            mapped = map_row(row)
        except Skip as exc:
            out[i] = _skipped(row, str(exc))
            continue
        try:
            measured = measured_value(row)
        except ValueError:
            out[i] = _skipped(row, f"value {row.get('value')!r} is not a number", mapped.stack.name)
            continue
        if not 0 < measured < math.inf:
            out[i] = _skipped(row, "value must be a finite number > 0", mapped.stack.name)
            continue
        unmodelled = tp.unmodelled_settings(row, mapped)
        if unmodelled:
            out[i] = _skipped(row, unmodelled, mapped.stack.name)
            continue
        try:
            counts = tp.step_counts(mapped, counts_fn)
            implausible = tp.beyond_peak(row, mapped, resolve_gpu_name(tp.group_key(row, mapped)[2]).gpu, measured)
        except Exception as exc:  # a model tunecost cannot count is reported, never a crash
            out[i] = _skipped(row, f"step counts failed: {exc}", mapped.stack.name)
            continue
        if implausible:
            out[i] = _skipped(row, implausible, mapped.stack.name)
            continue
        groups.setdefault(tp.group_key(row, mapped), []).append((i, row, mapped, measured, counts))
    ready: list[tuple[tuple[str, str, str], list, dict[int, tp.StepFn], GpuTerms]] = []
    for (stack, stack_cell, gpu_name), members in groups.items():
        gpu = resolve_gpu_name(gpu_name).gpu
        try:
            terms = tp.gpu_terms(gpu)
        except TunecostError as exc:  # a catalog GPU without the achieved rates the step time needs
            for i, row, mapped, _, _ in members:
                out[i] = _skipped(row, str(exc), mapped.stack.name)
            continue
        steps: dict[int, tp.StepFn] = {}
        for i, row, mapped, _, counts in members:
            try:
                steps[i] = tp.row_step_fn(mapped, counts, terms, gpu, counts_fn, rank_step_fn)
            except Exception as exc:  # a rank the simulator cannot trace is reported, never a crash
                out[i] = _skipped(row, _simulation_failed(exc), mapped.stack.name)
        members = [m for m in members if m[0] in steps]
        if members:
            ready.append(((stack, stack_cell, gpu_name), members, steps, terms))
    calibrated = [] if calibrated is None else calibrated
    for key, members, steps, terms in ready:
        if len(members) > 1 or prior_only:
            eff = _calibrate_group(key, members, steps, terms, out, record=not prior_only)
            if eff is not None:
                calibrated.append(_efficiency(key, eff))
    shipped = [] if prior_only else (tp_priors() if priors is None else priors)
    for key, members, steps, terms in ready:
        if len(members) == 1 or prior_only:  # this file's stack on other GPUs, else the shipped corpus's
            own = (
                None if prior_only else _other_gpus_efficiency(calibrated, key) or _other_gpus_efficiency(shipped, key)
            )
            _predict_with_prior(key, members, steps, terms, [*calibrated, *shipped], out, own, check_fit=not prior_only)
    return out


def _predict_with_prior(
    key,
    members,
    steps,
    terms: GpuTerms,
    pool,
    out: dict[int, ValidationRow],
    own: tuple[float, str] | None,
    *,
    check_fit: bool,
) -> None:
    """The group's rows at `own` (its stack's efficiency on other GPUs, and why; the efficiency is a fraction of
    each GPU's achieved rates), else at its family's prior over `pool`: either way borrowed from outside the group,
    so of the prior's kind (its intervals and held-out errors); with `check_fit`, the reason of a row no
    efficiency reproduces says so."""
    prior = own or prior_efficiency(pool, key[0], key[1])
    if prior is None:
        for i, row, mapped, _, _ in members:
            out[i] = _skipped(row, "no calibration row and no stack to borrow a prior from", mapped.stack.name)
        return
    eff, reason = prior
    for i, row, mapped, measured, counts in members:
        measured_step_s = tp.to_step_seconds(row.get("quantity"), measured, tp.shape_of(mapped))
        beyond = check_fit and not tp.reproducible(steps[i], measured_step_s)
        failure = beyond and tp.calibration_failure(
            steps[i], counts, terms, measured_step_s, one_gpu=mapped.num_gpus == 1
        )
        why = f"{reason}; {failure}" if failure else reason
        predicted = tp.from_step_seconds(row.get("quantity"), steps[i](eff), tp.shape_of(mapped))
        out[i] = _throughput_ok(row, mapped, measured, predicted, why, prior=True)


def _other_gpus_efficiency(pool: Sequence[StackEfficiency], key: tuple[str, str, str]) -> tuple[float, str] | None:
    """The median efficiency of the group's stack (and stack cell) calibrated on other GPUs, and its reason."""
    stack, cell, gpu = key
    same = [e for e in pool if (e.stack, e.stack_cell) == (stack, cell) and e.gpu != gpu]
    if not same:
        return None
    eff = statistics.median(e.gemm_efficiency for e in same)
    gpus = ", ".join(sorted({e.gpu for e in same}))
    return eff, f"{FITTED_PARAMETER} {eff:.3f}: {stack}'s calibrated on {gpus} (no calibration row on {gpu})"


def _efficiency(key: tuple[str, str, str], eff: float) -> StackEfficiency:
    stack, cell, gpu = key
    return StackEfficiency(stack=stack, stack_cell=cell, gpu=gpu, family=stack_family(stack, cell), gemm_efficiency=eff)


def _calibrate_group(key, members, steps, terms, out: dict[int, ValidationRow], *, record: bool) -> float | None:
    """Fit the group's efficiency on its calibration row (of its rows on the fewest GPUs, whose steps hold the least
    communication: none on one GPU; the most FLOPs per optimizer step; first in file order on a tie) and, with `record`,
    predict the other rows with it. Where no efficiency reproduces the calibration row, every row of the group,
    that one too, is predicted at the end of the range it lies beyond, the reason says why, and no efficiency is
    returned (a bound is not a fit)."""
    cal = min(members, key=lambda t: (t[2].num_gpus, -t[4].total_flops, t[0]))
    i, row, mapped, measured, counts = cal
    measured_step_s = tp.to_step_seconds(row.get("quantity"), measured, tp.shape_of(mapped))
    fitted = tp.gemm_efficiency_from(steps[i], measured_step_s)
    eff = tp.efficiency_bound(steps[i], measured_step_s) if fitted is None else fitted
    if record:
        at_bound = fitted is None and (
            f"{tp.AT_BOUND_REASON} {eff:g}, none fitted: no efficiency reproduces {row.id}, the calibration row of "
            f"{key[0]} ({key[1]}) on {key[2]}: "
            + tp.calibration_failure(steps[i], counts, terms, measured_step_s, one_gpu=mapped.num_gpus == 1)
        )
        for j, r, m, measured_j, _ in members:
            predicted = tp.from_step_seconds(r.get("quantity"), steps[j](eff), tp.shape_of(m))
            fit_reason = tp.CALIBRATION_REASON if (j, r) == cal[:2] else f"{FITTED_PARAMETER} {eff:.3f} from {row.id}"
            out[j] = _throughput_ok(r, m, measured_j, predicted, at_bound or fit_reason)
    return fitted


def validate_rows(
    rows: Iterable[CorpusRow],
    *,
    simulate: Callable[[MappedRow], object] = _simulate,
    counts_fn: tp.CountsFn = tp.micro_batch_counts,
    on_progress: Callable[[int, int, str], None] | None = None,
    held_out: Sequence[HeldOutError] | None = None,
    prior_only: bool = False,
    calibrated: list[StackEfficiency] | None = None,
) -> list[ValidationRow]:
    """Every row's outcome, in file order, each prediction with its interval (`validate.intervals`) from
    `held_out` errors (default: the shipped corpus's)."""
    rows = list(rows)
    is_tp = [r.get("quantity") in THROUGHPUT_QUANTITIES for r in rows]
    tp_idx = [i for i, t in enumerate(is_tp) if t]
    tp_rows = validate_throughput_rows(
        [rows[i] for i in tp_idx], counts_fn, prior_only=prior_only, calibrated=calibrated
    )
    by_index = {tp_idx[j]: v for j, v in tp_rows.items()}
    out = []
    for i, row in enumerate(rows):
        if on_progress:
            on_progress(i, len(rows), row.id)
        out.append(by_index[i] if i in by_index else validate_row(row, simulate))
    return with_intervals(out, held_out)
