"""The names of tunecost's profiler ranges: the one list that NVTX labels (`tunecost.profile.nvtx`), the experts'
own labels (`tunecost.moe.core`), the kernel classifier (`tunecost.profile.kernels`) and the ncu filters read.

Range names use dots and none of ncu's NVTX-filter quantifiers `@ , [ ] / * +` (Nsight Compute CLI guide, "NVTX
Filtering": "/" separates nested push/pop ranges, "[" / "]" pin a range to the bottom / top of the stack, "@" names
a domain) nor ":", which separates the fields of ncu's CSV NVTX column. A name like "tunecost/moe/w1" would be read
by `--nvtx-include` as three nested ranges.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tunecost.errors import TunecostError

RANGE_PREFIX = "tunecost."
MOE_BLOCK = "tunecost.moe"  # a whole MoE block (router + experts); the ncu filter keys on it
ROUTER = "tunecost.moe.router"  # router / gate: logits matmul, softmax, top-k, renormalisation
EXPERTS = "tunecost.moe.experts"  # all experts of the block
W1 = "tunecost.moe.w1"  # gate projection (Mixtral w1)
W3 = "tunecost.moe.w3"  # up projection (Mixtral w3)
W2 = "tunecost.moe.w2"  # down projection (Mixtral w2)
W1W3 = "tunecost.moe.w1w3"  # fused gate+up projection (transformers 5 `gate_up_proj`: W1 and W3 in one matmul)
DEQUANT = "tunecost.moe.dequant"  # de-quantization of 4-bit expert weights
LORA = "tunecost.moe.lora"  # LoRA adapter matmuls (x @ A @ B) on an expert weight or the router
ACTIVATION = "tunecost.moe.act"  # act(gate) * up between the projections (element-wise)
# A decoder layer's forward re-run inside the backward (activation checkpointing). It runs while a MoE backward
# range is open, so its non-MoE kernels (attention, norms) would otherwise look like MoE work; a kernel whose
# innermost range is this one is not MoE work (`is_moe_work`).
RECOMPUTE = "tunecost.recompute"

MOE_RANGES: tuple[str, ...] = (MOE_BLOCK, ROUTER, EXPERTS, W1, W3, W2, W1W3, DEQUANT, LORA, ACTIVATION)
ALL_RANGES: tuple[str, ...] = (*MOE_RANGES, RECOMPUTE)

# ncu NVTX filters (Nsight Compute CLI guide, "NVTX Filtering"): include kernels inside a MoE-block push/pop range
# ("A/": inside push/pop range A of the default domain, at any depth), exclude those whose innermost range is a
# checkpoint recomputation ("B]": B at the top of the stack), i.e. attention/norm work re-run in a MoE backward.
NCU_NVTX_INCLUDE = f"{MOE_BLOCK}/"
NCU_NVTX_EXCLUDE = f"{RECOMPUTE}]"

_BAD_NAME = re.compile(r"[@,\[\]/*+:\\]")


def check_range_name(name: str) -> str:
    """Return `name` if ncu can filter on it (see module docstring), else raise `TunecostError`."""
    if not name or _BAD_NAME.search(name):
        raise TunecostError(f"bad range name {name!r}: must be non-empty, without any of @ , [ ] / * + : \\")
    return name


def innermost_range(nvtx_ranges: Sequence[str]) -> str | None:
    """The innermost tunecost range of a stack given outer to inner; other tools' ranges are ignored."""
    for name in reversed(tuple(nvtx_ranges)):
        if name in ALL_RANGES:
            return name
    return None


def is_moe_work(nvtx_ranges: Sequence[str]) -> bool:
    """Whether work under this range stack (outer to inner) belongs to a labelled MoE block."""
    return innermost_range(nvtx_ranges) in MOE_RANGES
