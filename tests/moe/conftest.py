"""Makes `moe_helpers` (shared builders and the PEFT reference for these tests) importable by the test modules:
the suite runs with --import-mode=importlib, which puts no test folder on sys.path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if "moe_helpers" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("moe_helpers", Path(__file__).with_name("moe_helpers.py"))
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["moe_helpers"] = _module
    _spec.loader.exec_module(_module)


import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """These tests run tiny ops: one torch thread (tests/conftest.py)."""


@pytest.fixture(scope="session")
def moe_model(small_mixtral):
    """`moe_model(num_hidden_layers=2)`: a whole tiny Mixtral (vocabulary 128, width 64, two heads, 8 experts of
    width 64), small enough to install experts into, train and save adapters of in a CPU test."""

    def build(num_hidden_layers: int = 2):
        return small_mixtral(64, 2, num_hidden_layers=num_hidden_layers, intermediate_size=64, vocab_size=128)

    return build
