"""Plan records (`plan.jsonl`, docs/dev/records.md): one `plan_option` row per setup `tunecost plan` weighed.

`tunecost plan --out RUN_DIR` writes them; `tunecost report RUN_DIR` draws them as cost vs hours with the Pareto
front (`report/fig_plan.py`). A run directory holds one plan per model: a new plan of a model replaces the old one
whole, and only with `force`, so the front drawn is never a mix of two searches.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunecost.errors import TunecostError
from tunecost.results.records import _note_run, add_records, record
from tunecost.results.schema import record_path

PLAN_KIND = "plan_option"
PLAN_KEY = ("kind", "model")  # one plan per model in a run directory, replaced whole


@dataclass(frozen=True, kw_only=True)
class PlanOptionRow:
    """One setup the plan weighed, as written to `plan.jsonl` (after `schema_version` and `kind`)."""

    model: str
    goal: str  # what the plan's recommendation optimises: "cheapest", "fastest within the budget", ...
    method: str  # full, lora or qlora
    gpu: str  # catalog name
    num_gpus: int
    strategy: str  # single, ddp, fsdp2, zero3, ...
    layout: str  # the strategy with its TP/PP/CP degrees, e.g. "tp4+sp fsdp1" (`ParallelPlan.layout_name`)
    offload: str  # none, optimizer or params
    owned: bool  # the user's GPUs (--own): priced at $0
    micro_batch: int  # per rank
    accumulation: int  # gradient-accumulation steps (--global-batch)
    fits: bool  # memory per rank within the card with the safety margin
    hours: float | None  # the fine-tune's hours; None where it was not timed (does not fit, no throughput)
    hours_low: float | None  # the ends of the throughput's 95 % interval
    hours_high: float | None
    usd: float | None  # the fine-tune's dollars; None without a time or a price
    usd_low: float | None
    usd_high: float | None
    provider: str | None  # the catalog price's provider ("owned" for --own)
    why_not: str  # why it is ruled out; "" when it qualifies
    on_front: bool  # on the Pareto front of cost vs hours
    recommended: bool  # the plan's answer


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def option_row(plan: Any, option: Any) -> PlanOptionRow:
    """The row of one `estimate.plan.Option` of `plan` (a `Plan`)."""
    setup = option.setup
    hours, usd = _finite(option.hours), _finite(option.usd)
    hours_range = option.interval(hours) if hours is not None else (None, None)
    usd_range = option.interval(usd) if usd is not None else (None, None)
    price = setup.cost.price if setup.cost is not None else None
    return PlanOptionRow(
        model=plan.model,
        goal=plan.goal,
        method=option.method,
        gpu=setup.gpu.name,
        num_gpus=setup.plan.num_gpus,
        strategy=setup.plan.strategy,
        layout=setup.plan.layout_name,
        offload=option.offload,
        owned=option.owned,
        micro_batch=setup.micro_batch,
        accumulation=option.accumulation,
        fits=setup.fits,
        hours=hours,
        hours_low=hours_range[0],
        hours_high=hours_range[1],
        usd=usd,
        usd_low=usd_range[0],
        usd_high=usd_range[1],
        provider=price.provider if price is not None else None,
        why_not=option.why_not,
        on_front=any(option is o for o in plan.front),
        recommended=option is plan.recommended,
    )


def plan_rows(plan: Any) -> list[dict[str, Any]]:
    """The `plan.jsonl` rows of a `Plan`: every option it weighed (`Plan.options`; a plan built without them gives
    its front and closest misses)."""
    options = plan.options or (*plan.front, *plan.ruled_out)
    return [record(PLAN_KIND, **dataclasses.asdict(option_row(plan, o))) for o in options]


def save_plan_records(
    run_dir: str | os.PathLike[str],
    plan: Any,
    *,
    command: str | Sequence[str] | None = None,
    force: bool = False,
) -> Path:
    """Write a plan to `run_dir/plan.jsonl` (and `meta.json`): what `tunecost plan --out RUN_DIR` writes and
    `tunecost report RUN_DIR` draws as cost vs hours with the Pareto front. An earlier plan of the same model is
    replaced only with `force` (`TunecostError` without it; nothing is written)."""
    rows = plan_rows(plan)
    if not rows:
        raise TunecostError(f"--out: the plan of {plan.model} weighed no setup; nothing to write")
    path = add_records(record_path(run_dir, PLAN_KIND), rows, key=PLAN_KEY, force=force)
    _note_run(run_dir, command)
    return path
