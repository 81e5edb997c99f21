"""Shared set-up of the MoE tests; their builders and the PEFT reference are in moe_helpers.py."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def moe_model(small_mixtral):
    """`moe_model(num_hidden_layers=2)`: a whole tiny Mixtral (vocabulary 128, width 64, two heads, 8 experts of
    width 64), small enough to install experts into, train and save adapters of in a CPU test."""

    def build(num_hidden_layers: int = 2):
        return small_mixtral(64, 2, num_hidden_layers=num_hidden_layers, intermediate_size=64, vocab_size=128)

    return build
