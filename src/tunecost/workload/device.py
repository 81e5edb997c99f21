"""The device a run asks for: `cpu` or `cuda[:i]`, checked before anything is built on it."""

from __future__ import annotations

from tunecost.errors import TunecostError


def check_device(device: str) -> None:
    """Raise a `TunecostError` for a device name tunecost does not run on, or CUDA asked for where there is none."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise TunecostError(f"device {device!r} requested but CUDA is not available here (torch {torch.__version__})")
    if not (device == "cpu" or device.startswith("cuda")):
        raise TunecostError(f"unsupported device {device!r}; use cpu or cuda[:i]")
