"""A traced segment's bytes at the model's full depth, from traces at two smaller depths (docs/memory-model.md)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any


def depth_scaled(
    segment: str, a: dict[str, int], b: dict[str, int], t: float, fixed: Collection[str] = ("temporaries",)
) -> dict[str, float]:
    """Bytes of `segment` at full depth from two traced depths (`a` shallower, `b` deeper; `t` the interpolation),
    each key linear in the depth, except in a pass the `fixed` keys (its temporaries): one layer's work holds them
    whatever the depth, so they are the deeper trace's (a one-unit model's only layer is first and last at once,
    and its temporaries are not a deeper model's). The optimizer step's temporaries span every parameter and stay
    linear."""
    fixed = () if segment.startswith("optimizer") else fixed
    return {
        k: float(b.get(k, 0)) if k in fixed else a.get(k, 0) + (b.get(k, 0) - a.get(k, 0)) * t
        for k in sorted(set(a) | set(b))
    }


def lerp_bytes(a: float, b: float, t: float) -> int:
    """Bytes a share `t` of the way from `a` to `b`, rounded (the some-layers recomputation steps)."""
    return round(a + (b - a) * t)


def lerp_byte_map(a: dict[str, int], b: dict[str, int], t: float) -> dict[str, int]:
    """Each key's bytes a share `t` of the way from `a` to `b` (a key missing from one side counts 0)."""
    return {k: lerp_bytes(a.get(k, 0), b.get(k, 0), t) for k in a.keys() | b.keys()}


def depth_share(a_units: int, b_units: int, full_units: int) -> float:
    """How far past the shallower trace (`a_units`) the full depth lies, in steps of the deeper one's extra units."""
    return (full_units - a_units) / (b_units - a_units)


def scaled_segments(a: Mapping[str, Any], b: Mapping[str, Any], t: float) -> dict[str, dict[str, float]]:
    """Each segment both traces hold (`TraceResult.segments`), its bytes per category at full depth."""
    return {key: depth_scaled(key, a[key].by_category, b[key].by_category, t) for key in sorted(a.keys() & b.keys())}


def peak_segment(scaled: Mapping[str, Mapping[str, float]]) -> tuple[str, float]:
    """The segment of the largest total and that total; a unit's middle segment is affine in the unit index, never
    above both ends, so it is not a candidate."""
    totals = {key: sum(v.values()) for key, v in scaled.items() if not key.endswith("unit_mid")}
    key = max(totals, key=totals.__getitem__)
    return key, totals[key]
