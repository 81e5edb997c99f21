"""BlackMamba (Zyphra's Mamba + mixture-of-experts model) in pure PyTorch: config, scan, model, checkpoints.

Heavy imports (torch) happen when this package is imported; import it inside functions from CLI code.
"""

from __future__ import annotations

from tunecost.models.blackmamba.checkpoint import load_blackmamba, resolve_blackmamba_dir, save_blackmamba
from tunecost.models.blackmamba.config import BlackMambaConfig, config_from_spec, tiny_blackmamba_config
from tunecost.models.blackmamba.layers import (
    BlackMambaBlock,
    BlackMambaExpert,
    BlackMambaRMSNorm,
    MambaMixer,
    MoEMixer,
)
from tunecost.models.blackmamba.model import (
    BlackMambaForCausalLM,
    BlackMambaOutput,
    build_blackmamba,
    init_blackmamba_weights,
)
from tunecost.models.blackmamba.params import ParameterCounts, count_parameters
from tunecost.models.blackmamba.scan import (
    causal_conv1d,
    fused_kernels_available,
    selective_scan,
    selective_scan_chunked,
    selective_scan_reference,
)

__all__ = [
    "BlackMambaBlock",
    "BlackMambaConfig",
    "BlackMambaExpert",
    "BlackMambaForCausalLM",
    "BlackMambaOutput",
    "BlackMambaRMSNorm",
    "MambaMixer",
    "MoEMixer",
    "ParameterCounts",
    "build_blackmamba",
    "causal_conv1d",
    "config_from_spec",
    "count_parameters",
    "fused_kernels_available",
    "init_blackmamba_weights",
    "load_blackmamba",
    "resolve_blackmamba_dir",
    "save_blackmamba",
    "selective_scan",
    "selective_scan_chunked",
    "selective_scan_reference",
    "tiny_blackmamba_config",
]
