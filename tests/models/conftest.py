"""Shared set-up of the model tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """The tiny models' tensors are small: one torch thread (tests/conftest.py)."""
