"""Total and active parameter counts of a BlackMamba, counted from the model built on the meta device.

Active = what one token's forward pass touches: everything except the experts a token is not routed to, so
(num_experts - k) experts per MoE layer drop out. The tied output layer counts once. Zyphra names the released
models by these two numbers: "BlackMamba 630M/2.8B" = 630 M active (top-1) / 2.8 B total (Zyphra README).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from tunecost.errors import TunecostError
from tunecost.models.blackmamba.config import BlackMambaConfig
from tunecost.models.blackmamba.model import build_blackmamba


class ParameterCounts(NamedTuple):
    total: int
    active: int


def count_parameters(config: BlackMambaConfig, experts_per_token: int | None = None) -> ParameterCounts:
    """(total, active at top-k) parameters; k defaults to the config's `experts_per_token`."""
    k = config.experts_per_token if experts_per_token is None else experts_per_token
    if config.num_experts and not 1 <= k <= config.num_experts:
        raise TunecostError(f"experts_per_token must be in 1..{config.num_experts}, got {k}")
    model = build_blackmamba(config, device=torch.device("meta"))
    total = sum(p.numel() for p in model.parameters())
    idle = 0
    for mixer in model.moe_mixers():
        per_expert = sum(p.numel() for p in mixer.local_experts[0].parameters())
        idle += (mixer.num_experts - k) * per_expert
    return ParameterCounts(total=total, active=total - idle)
