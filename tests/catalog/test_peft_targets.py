"""data/peft_targets.csv: PEFT's LoRA targets per model type, as the installed PEFT has them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tunecost.catalog.peft_targets import peft_default_targets

ROOT = Path(__file__).resolve().parents[2]


def test_llama_types_take_q_and_v_and_unknown_types_none() -> None:
    assert peft_default_targets("llama") == peft_default_targets("qwen2") == ("q_proj", "v_proj")
    assert peft_default_targets("deepseek_v3") is None


@pytest.mark.long  # imports PEFT in a subprocess
def test_the_file_is_what_the_installed_peft_has() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "peft_targets.py"), "--check"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
