"""The family records: every supported family has one, and its pattern and counts builder are what runs."""

from __future__ import annotations

import dataclasses

import pytest

from tunecost.errors import TunecostError
from tunecost.models.anatomy import layer_pattern
from tunecost.models.catalog import model_catalog, resolve_model
from tunecost.models.families import FAMILIES, HYBRID_FAMILIES, arch_of


@pytest.mark.parametrize(
    ("model", "pattern", "expected"),
    [
        ("blackmamba-1.5b", "alternating", (0, 2, 15)),  # Mamba and MoE blocks alternate: 15 pairs
        ("deepseek-v2-lite", "dense_prefix", (1, 1, 26)),  # first_k_dense_replace 1, then 26 MoE layers
        ("mixtral-8x7b", "uniform", (0, 1, 32)),
    ],
)
def test_layer_pattern_follows_the_family_record(model: str, pattern: str, expected: tuple[int, int, int]) -> None:
    spec = resolve_model(model)
    assert FAMILIES[spec.family].pattern == pattern
    assert layer_pattern(spec) == expected


def test_every_catalog_family_builds_its_counts_with_its_own_name() -> None:
    for spec in {s.family: s for s in model_catalog().values()}.values():
        arch = arch_of(spec)
        assert arch.family == spec.family
        assert arch.num_layers == spec.num_layers
    assert all(FAMILIES[f].pattern == "hybrid" for f in HYBRID_FAMILIES)


def test_a_family_without_a_record_is_refused_by_name() -> None:
    spec = dataclasses.replace(resolve_model("mixtral-8x7b"), family="gpt2")
    with pytest.raises(TunecostError, match="not 'gpt2'"):
        arch_of(spec)
