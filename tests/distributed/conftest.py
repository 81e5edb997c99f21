"""Fixtures for the multi-GPU tests: tiny configs of real architectures."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFIGS = Path(__file__).parents[1] / "fixtures" / "distributed"


@pytest.fixture
def config_path():
    def path(name: str) -> str:
        return str(CONFIGS / f"{name}.json")

    return path
