"""Start ranks on this machine the way `torchrun` does: torch's elastic launcher (`elastic_launch`, the library
behind `torchrun`) with a c10d rendezvous on 127.0.0.1. Each rank runs `fn(*args)` in a spawned process with
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set, so `torch.distributed.init_process_group(backend)`
needs no further arguments; `fn` must be a module-level function and return something picklable."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from tunecost.errors import TunecostError


def launch_local_ranks(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    nproc: int,
    log_dir: str | os.PathLike[str] | None = None,
) -> list[Any]:
    """Run `fn(*args)` on `nproc` local ranks; their return values by rank. Each rank's stdout and stderr go to
    files under `log_dir` (kept), or to this process's when None. A failed rank raises one TunecostError."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        run_id=f"tunecost-{os.getpid()}",
        max_restarts=0,
        start_method="spawn",
        monitor_interval=0.1,
        logs_specs=DefaultLogsSpecs() if log_dir is None else DefaultLogsSpecs(os.fspath(log_dir), Std.ALL),
    )
    handlers = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    try:
        results = elastic_launch(config, fn)(*args)
    except ChildFailedError as exc:
        raise TunecostError(f"a rank failed: {_failure_line(exc)}") from None
    finally:  # the launcher's handlers (a SIGTERM raised as its SignalException) outlive it otherwise
        for sig, handler in handlers.items():
            if handler is not None:  # None: a handler not installed from Python, left as it is
                signal.signal(sig, handler)
    return [results[r] for r in sorted(results)]


_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)  # the ones torch's launcher takes over


def _failure_line(exc: Any) -> str:
    """The first failed rank's error in one line (the launcher keeps it as text, or as the error file's dict)."""
    failures = getattr(exc, "failures", None) or {}
    message: Any = next(iter(failures.values())).message if failures else str(exc)
    if isinstance(message, dict):
        message = message.get("message", message)
    lines = str(message).strip().splitlines()
    line = lines[-1] if lines else type(exc).__name__
    return line.removeprefix("TunecostError: ")
