"""Fixtures for the step-simulator tests: tiny configs of real architectures and an isolated result cache."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFIGS = Path(__file__).parents[1] / "fixtures" / "simulate"


@pytest.fixture
def config_path():
    def path(name: str) -> str:
        return str(CONFIGS / f"{name}.json")

    return path


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Every test gets its own on-disk cache directory and an empty in-process cache."""
    from tunecost.simulate import cache

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    cache.clear_memory()
    yield tmp_path / "cache"
    cache.clear_memory()
