"""The 95 % interval of each validated row, from held-out errors of the shipped corpus's rows.

A row's interval comes from ln(predicted / measured) of other rows of its quantity class
(`estimate.conformal.error_interval`): of its own stack where the corpus has `MIN_STACK_ERRORS` of them (the row
itself left out), else of every other source (a stack the corpus has not validated); a row predicted from its
family's prior takes the prior's errors of its kind of model (`stack_priors.prior_errors`). docs/validation.md
shows the coverage this reaches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from tunecost.catalog.held_out_errors import PRIOR_KIND, HeldOutError, held_out_errors, quantity_class
from tunecost.estimate.conformal import INTERVAL_LEVEL, MIN_STACK_ERRORS, error_interval
from tunecost.estimate.throughput.stack_priors import prior_errors

if TYPE_CHECKING:
    from tunecost.validate.run import ValidationRow


def has_interval(row: ValidationRow) -> bool:
    return row.status == "ok" and row.error is not None and row.quantity != "oom" and bool(row.predicted)


def with_intervals(
    rows: Sequence[ValidationRow], errors: Sequence[HeldOutError] | None = None, level: float = INTERVAL_LEVEL
) -> list[ValidationRow]:
    """`rows` with `low`/`high` set where a prediction can carry an interval (at `level`)."""
    evidence = held_out_errors() if errors is None else errors
    out = []
    for row in rows:
        if not has_interval(row):
            out.append(row)
            continue
        kind = quantity_class(row.quantity)
        same = [
            e
            for e in evidence
            if quantity_class(e.quantity) == kind and e.kind == (PRIOR_KIND if row.prior else "calibrated")
        ]
        own = [e.log_error for e in same if e.stack == row.stack and (e.source, e.id) != (row.source, row.id)]
        if row.prior:
            pool, what = prior_errors(evidence, row.model_kind, leave_out=(row.source, row.id))
        elif len(own) >= MIN_STACK_ERRORS:
            pool, what = own, f"{len(own)} other {kind} rows of stack {row.stack}"
        else:
            pool = [e.log_error for e in same if e.source != row.source]
            what = f"{len(pool)} {kind} rows of other sources (stack {row.stack or '?'} not validated)"
        if not pool:
            out.append(replace(row, interval=f"no held-out {kind} errors"))
            continue
        e = error_interval(pool, what, level)
        assert row.predicted is not None
        low, high = e.measured_range(row.predicted)
        out.append(replace(row, low=round(low, 4), high=round(high, 4), interval=e.basis))
    return out
