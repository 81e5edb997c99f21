"""CPU thread settings for measuring on a CPU: set before torch is imported."""

from __future__ import annotations

import logging
import os
from pathlib import Path


def runs_on_cpu(device: str) -> bool:
    """Whether `device` ("cpu", "cuda[:N]" or "auto") means the CPU; "auto" means the CPU without an NVIDIA driver."""
    return device == "cpu" or (device == "auto" and not Path("/dev/nvidiactl").exists())


def prepare_cpu_threads(device: str) -> None:
    """On CPU, let idle OpenMP threads sleep instead of spinning (unless OMP_WAIT_POLICY is already set).

    Must run before torch is imported. On a machine shared with other processes, spinning worker threads made the
    tiny-model profile 5-30x slower (measured: 9.5 min vs 75 s for the same command, load average ~4-5 on 2
    cores). Set OMP_WAIT_POLICY=ACTIVE to keep spinning; meta.json records the policy used.
    """
    if runs_on_cpu(device):
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # bitsandbytes warns on import that an optional CPU kernel package is missing; it changes nothing measured
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
