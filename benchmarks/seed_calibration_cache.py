"""The calibration of the bundled measurements, shipped so that a first `estimate` does not refit it.

    PYTHONPATH=src .venv/bin/python benchmarks/seed_calibration_cache.py [--write | --check]

Calibrates the bundled measurements (the A40 and A100-40GB points) in an empty cache folder, with the shipped copy
turned off, and compares the fitted parameters and held-out errors it wrote with those in
src/tunecost/estimate/throughput/data/. --write replaces that folder's files with them; --check exits 1 when they
differ beyond the optimizer's tolerance (on another CPU the same fit lands within about 1e-5 of it, and the held-out
errors' file names hash the parameters). Prints the seconds the calibration took.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tunecost.estimate.throughput import disk_cache

FOLDERS = ("calibration-fits", "interval-evidence")


def computed(cache: Path) -> dict[str, str]:
    """folder/name -> text of every file the bundled calibration writes to an empty `cache`."""
    os.environ["TUNECOST_CACHE_DIR"] = str(cache)
    disk_cache.SHIPPED_CACHE = cache / "no-shipped-copy"
    from tunecost.estimate.calibrated import calibrated_model

    start = time.perf_counter()
    calibrated_model()
    print(f"calibrated the bundled measurements in {time.perf_counter() - start:.1f} s")
    return files_in(cache)


def files_in(root: Path) -> dict[str, str]:
    """folder/name -> text of the calibration files under `root` (a cache folder or the shipped copy)."""
    return {f"{d}/{p.name}": p.read_text() for d in FOLDERS for p in sorted((root / d).glob("*.json"))}


def _leaves(value: object) -> list:
    """The JSON value's numbers and strings in order (numbers as floats)."""
    if isinstance(value, dict):
        return [x for k in sorted(value) for x in [k, *_leaves(value[k])]]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value]


def _close(a: str, b: str, rel: float = 1e-4) -> bool:
    x, y = _leaves(json.loads(a)), _leaves(json.loads(b))
    return len(x) == len(y) and all(
        math.isclose(u, v, rel_tol=rel, abs_tol=1e-12) if isinstance(u, float) and isinstance(v, float) else u == v
        for u, v in zip(x, y, strict=True)
    )


def same_calibration(computed: dict[str, str], shipped: dict[str, str]) -> bool:
    """The fits under the same names with the same parameters, and the same held-out errors (under any names)."""
    fits = [n for n in computed if n.startswith("calibration-fits/")]
    if sorted(fits) != sorted(n for n in shipped if n.startswith("calibration-fits/")):
        return False
    if not all(_close(computed[n], shipped[n]) for n in fits):
        return False
    left = [t for n, t in shipped.items() if n.startswith("interval-evidence/")]
    for name, text in computed.items():
        if name.startswith("interval-evidence/"):
            match = next((i for i, t in enumerate(left) if _close(text, t)), None)
            if match is None:
                return False
            left.pop(match)
    return not left


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="replace the shipped files")
    mode.add_argument("--check", action="store_true", help="exit 1 when the shipped files differ")
    options = parser.parse_args()
    root = disk_cache.SHIPPED_CACHE
    before = files_in(root)
    with tempfile.TemporaryDirectory() as work:
        files = computed(Path(work))
    same = same_calibration(files, before)
    print(f"{len(files)} files; the shipped copy ({root}) is {'current' if same else 'stale'}")
    if options.write and not same:
        for d in FOLDERS:
            shutil.rmtree(root / d, ignore_errors=True)
            (root / d).mkdir(parents=True)
        for name, text in files.items():
            (root / name).write_text(text)
        print(f"wrote {len(files)} files under {root}")
    return 1 if options.check and not same else 0


if __name__ == "__main__":
    sys.exit(main())
