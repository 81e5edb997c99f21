"""`distributed.launch`: torch's elastic launcher on this machine, and the process it leaves behind."""

from __future__ import annotations

import os
import signal

from tunecost.distributed.launch import launch_local_ranks


def test_the_launcher_leaves_the_signal_handlers_as_it_found_them() -> None:
    """torch's launcher takes over SIGTERM (raising its SignalException); a later SIGTERM, after the ranks are
    done, must reach the command's own handling, not a traceback from a launcher that has returned."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    (pid,) = launch_local_ranks(os.getpid, (), nproc=1)
    assert pid != os.getpid()
    assert {sig: signal.getsignal(sig) for sig in before} == before
