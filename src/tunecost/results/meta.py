"""Run metadata (`meta.json`): what ran, where, with which versions, from which source revision.

The format is in docs/dev/records.md. Every field is collected defensively: a missing library, no git, or no GPU
gives `None` rather than an error, because metadata must never stop a measurement from being written.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tunecost import __version__
from tunecost.errors import TunecostError
from tunecost.io import atomic_write_json
from tunecost.outputs import read_run_metadata
from tunecost.results.schema import SCHEMA_VERSION

TRACKED_PACKAGES = ("torch", "transformers", "peft", "bitsandbytes")


def package_versions(names: Sequence[str] = TRACKED_PACKAGES) -> dict[str, str | None]:
    """Installed version of each package (None when absent); read from package metadata, nothing is imported."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_revision(cwd: str | os.PathLike[str] | None = None) -> str | None:
    """`git rev-parse HEAD` of the source tree (of this package unless `cwd`); None without git or commits."""
    where = Path(cwd) if cwd is not None else Path(__file__).resolve().parent
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    rev = done.stdout.strip()
    if done.returncode != 0 or not rev:
        return None
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=5,
        check=False,
    )
    return rev + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def device_info(device: str | None = None) -> dict[str, Any]:
    """kind ("cpu" | "cuda"), name, torch, cuda, num_threads, host_cpu (and memory_bytes on CUDA) of the measuring
    device."""
    import torch

    kind = "cuda" if (device or "").startswith("cuda") else "cpu"
    info: dict[str, Any] = {
        "kind": kind,
        "name": None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "num_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "host_cpu": cpu_model_name(),  # the CPU that launches the kernels: it sets the host time of an eager step
    }
    if kind == "cuda" and torch.cuda.is_available():
        index = torch.device(device or "cuda").index or 0
        props = torch.cuda.get_device_properties(index)
        info.update(name=props.name, memory_bytes=int(props.total_memory), capability=f"{props.major}.{props.minor}")
    else:
        info["name"] = cpu_model_name()
    return info


def cpu_model_name() -> str | None:
    """This machine's CPU model name (/proc/cpuinfo), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or None


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as a shell-quoted string (sys.argv by default)."""
    return shlex.join(list(sys.argv if argv is None else argv))


def run_metadata(
    *,
    device: str | None = None,
    command: str | Sequence[str] | None = None,
    workloads: Sequence[dict[str, Any]] = (),
    extra: dict[str, Any] | None = None,
    measured_on_device: bool = True,
) -> dict[str, Any]:
    """The `meta.json` object of docs/dev/records.md for one run directory. A run that measured nothing on a
    device (a fit, an estimate) passes `measured_on_device=False` and records `"device": null`."""
    meta: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "tool": "tunecost",
        "tool_version": __version__,
        "git_revision": git_revision(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device_info(device) if measured_on_device else None,
        "versions": package_versions(),
        "command": command if isinstance(command, str) else command_line(command),
        "workloads": list(workloads),
    }
    if extra:
        meta.update(extra)
    return meta


def merge_metadata(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """`new`, keeping the first `created` and the union of workloads of a resumed run; earlier commands are kept
    under `previous_commands` so a run directory says every invocation that wrote to it."""
    if not old:
        return new
    merged = dict(new)
    merged["created"] = old.get("created", new["created"])
    merged["updated"] = new["created"]
    seen = []
    for w in [*old.get("workloads", []), *new.get("workloads", [])]:
        if w not in seen:
            seen.append(w)
    merged["workloads"] = seen
    previous = list(old.get("previous_commands", []))
    if old.get("command") and old.get("command") != new.get("command"):
        previous.append(old["command"])
    if previous:
        merged["previous_commands"] = previous
    return merged


def update_run_metadata(run_dir: str | os.PathLike[str], new: dict[str, Any]) -> Path:
    """Write `run_dir/meta.json` atomically, merged (`merge_metadata`) with the one already there; one that tunecost
    did not write is never replaced (`TunecostError`)."""
    path = Path(run_dir) / "meta.json"
    old = read_run_metadata(path) if path.exists() else None
    if path.exists() and old is None:
        raise TunecostError(f"{path}: not a tunecost run's meta.json; write to another run directory")
    return atomic_write_json(path, merge_metadata(old, new))
