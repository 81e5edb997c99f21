"""The 95 % interval of a simulated peak, from the held-out errors of published peaks of its stack.

The same evidence as `tunecost validate`'s intervals (catalog/held_out_errors.py, docs/validation.md).
"""

from __future__ import annotations

from tunecost.catalog.held_out_errors import held_out_errors
from tunecost.estimate.conformal import INTERVAL_LEVEL, MIN_STACK_ERRORS, error_interval


def peak_interval_bytes(simulator_stack: str, peak_bytes: int, level: float = INTERVAL_LEVEL) -> tuple[int, int, str]:
    """(low, high, basis) of an allocated peak simulated on `simulator_stack`: the held-out peak-allocated errors
    of the published stacks it reproduces where there are `MIN_STACK_ERRORS`, else of every stack."""
    errors = [e for e in held_out_errors() if e.quantity == "peak_allocated_gib" and e.kind == "calibrated"]
    own = [e.log_error for e in errors if e.simulator_stack == simulator_stack]
    if len(own) >= MIN_STACK_ERRORS:
        pool, what = own, f"{len(own)} published peaks of stacks the {simulator_stack} stack reproduces"
    else:
        pool, what = [e.log_error for e in errors], f"{len(errors)} published peaks of every stack (none of this one)"
    e = error_interval(pool, what, level)
    low, high = e.measured_range(peak_bytes)
    return int(low), int(high), e.basis
