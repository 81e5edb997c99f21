"""Peak memory of a window of training steps.

CUDA: `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats` (tensor bytes, what decides an OOM),
with the reserved peak alongside. CPU: the process's resident-set high-water mark (VmHWM), reset at the start of
the window by writing 5 to /proc/self/clear_refs (Linux); it counts everything the process holds (Python, libraries,
the model), so it is an upper bound of what training needs. Where neither works, the peak is None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_KIB = 1024


@dataclass(frozen=True, kw_only=True)
class PeakMemory:
    peak_bytes: int | None
    source: str  # "measured-cuda" | "measured-cpu"
    detail: dict[str, Any]


def _proc_status_bytes(field: str) -> int | None:
    """A kB field of /proc/self/status (Linux) in bytes, or None where it cannot be read."""
    try:
        text = Path("/proc/self/status").read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(rf"{field}:\s+(\d+)\s+kB", text)
    return int(match.group(1)) * _KIB if match else None


class PeakMemoryMeter:
    """`start()` before the window, `stop()` after it."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._cuda = device.startswith("cuda")
        self._baseline: int | None = None
        self._resettable = True

    def start(self) -> None:
        if self._cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._baseline = int(torch.cuda.memory_allocated())
            return
        self._baseline = _proc_status_bytes("VmRSS")
        try:
            Path("/proc/self/clear_refs").write_text("5", encoding="utf-8")
        except OSError:
            self._resettable = False  # the high-water mark then covers the whole process lifetime

    def stop(self) -> PeakMemory:
        if self._cuda:
            import torch

            torch.cuda.synchronize()
            return PeakMemory(
                peak_bytes=int(torch.cuda.max_memory_allocated()),
                source="measured-cuda",
                detail={"before_bytes": self._baseline, "reserved_peak_bytes": int(torch.cuda.max_memory_reserved())},
            )
        return PeakMemory(
            peak_bytes=_proc_status_bytes("VmHWM"),  # the resident-set high-water mark
            source="measured-cpu",
            detail={"before_bytes": self._baseline, "what": "process peak RSS", "window_reset": self._resettable},
        )
