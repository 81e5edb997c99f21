"""Count the allocator replays a command asks for (`distributed.rank_reserve`), how many it runs (one per distinct
allocations: repeats are answered from memory), and the seconds spent replaying.

    TUNECOST_CACHE_DIR=$(mktemp -d) .venv/bin/python benchmarks/count_replays.py plan --model llama-3.1-8b \\
        --dataset alpaca --epochs 1
"""

from __future__ import annotations

import atexit
import sys
import time

from tunecost.distributed import rank_reserve

counts = {"asked": 0, "run": 0}
seconds = [0.0]


def main() -> None:
    from tunecost.cli.main import main as cli

    ask, run = rank_reserve._replay, rank_reserve.steady_state_replay

    def asked(*args, **kwargs):
        counts["asked"] += 1
        return ask(*args, **kwargs)

    def ran(*args, **kwargs):
        counts["run"] += 1
        start = time.perf_counter()
        out = run(*args, **kwargs)
        seconds[0] += time.perf_counter() - start
        return out

    rank_reserve._replay, rank_reserve.steady_state_replay = asked, ran
    atexit.register(
        lambda: print(f"replays asked {counts['asked']}, run {counts['run']}, {seconds[0]:.1f} s", file=sys.stderr)
    )
    sys.argv = ["tunecost", *sys.argv[1:]]
    cli()


if __name__ == "__main__":
    main()
