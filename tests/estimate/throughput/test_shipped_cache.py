"""The bundled calibration ships with tunecost (estimate/throughput/data/): a first run reads it instead of
refitting, and it is what a fresh calibration computes (benchmarks/seed_calibration_cache.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tunecost.estimate import calibrated

ROOT = Path(__file__).resolve().parents[3]


def test_an_empty_cache_reads_the_shipped_calibration(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TUNECOST_CACHE_DIR", str(tmp_path))
    calibrated._calibrated.cache_clear()
    try:
        model = calibrated.calibrated_model()
    finally:
        calibrated._calibrated.cache_clear()
    assert model.num_points > 0 and model.evidence is not None
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.json"))
    assert written == [], f"not shipped (run benchmarks/seed_calibration_cache.py --write): {written}"


@pytest.mark.long
def test_the_shipped_calibration_is_what_a_fresh_one_computes() -> None:
    script = ROOT / "benchmarks" / "seed_calibration_cache.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
