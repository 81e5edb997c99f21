"""Every catalog model is found offline by its hub id and by each alias, in any case, each name belongs to one
model only, and each entry says where its config came from and when (an ISO date)."""

from __future__ import annotations

from collections import Counter
from datetime import date

import pytest

from tunecost.catalog.models import model_catalog, resolve_model

CATALOG = model_catalog()
NAMES = [(n, s.name) for s in CATALOG.values() for n in (s.hub_id, *s.aliases) if n]


@pytest.mark.parametrize(("hub_id", "name"), NAMES, ids=[n for n, _ in NAMES])
def test_hub_ids_and_aliases_resolve_offline(hub_id: str, name: str) -> None:
    assert resolve_model(hub_id).name == name
    assert resolve_model(hub_id.upper()).name == name


def test_each_hub_name_names_one_model() -> None:
    counts = Counter(n.lower() for n, _ in NAMES)
    assert [n for n, c in counts.items() if c > 1] == []


@pytest.mark.parametrize("spec", list(CATALOG.values()), ids=lambda s: s.name)
def test_source_says_where_and_when(spec) -> None:
    assert spec.source.strip()
    assert date.fromisoformat(spec.as_of) <= date.today()
