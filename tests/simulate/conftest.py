"""Fixtures for the step-simulator tests: an isolated result cache (`config_path` is in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Every test gets its own on-disk cache directory and an empty in-process cache."""
    from tunecost.simulate import cache

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    cache.clear_memory()
    yield tmp_path / "cache"
    cache.clear_memory()
