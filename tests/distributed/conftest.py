"""Fixtures for the multi-GPU tests: tiny configs of real architectures."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_jobs import CONFIGS


@pytest.fixture
def config_dir() -> Path:
    """`config_path` (tests/conftest.py) reads the configs in tests/fixtures/distributed."""
    return CONFIGS
