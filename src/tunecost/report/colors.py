"""One fixed colour per kernel class, so a class has the same colour in every figure and no two classes share one."""

from __future__ import annotations

from collections.abc import Iterable

from tunecost.profile.kernels import KERNEL_CLASSES

# tab20's 20 colours, dark and light of each hue; the first 12 picks keep neighbouring classes apart in hue.
_PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78",
    "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
)  # fmt: skip
KERNEL_CLASS_COLORS: dict[str, str] = dict(zip(KERNEL_CLASSES, _PALETTE, strict=False))


def kernel_colors(names: Iterable[str]) -> dict[str, str]:
    """Colours for `names`: the fixed colour of each known class; names not in the catalog (older records) take
    the palette's unused colours in sorted order, so no colour is used twice while any remains."""
    wanted = sorted(set(names))
    colors = {n: KERNEL_CLASS_COLORS[n] for n in wanted if n in KERNEL_CLASS_COLORS}
    spare = [c for c in _PALETTE if c not in KERNEL_CLASS_COLORS.values()]
    for i, name in enumerate(n for n in wanted if n not in colors):
        colors[name] = spare[i % len(spare)] if spare else _PALETTE[i % len(_PALETTE)]
    return colors
