"""Dataset facts (data/datasets.csv): the paper's Table II."""

from __future__ import annotations

import pytest

from tunecost.catalog.datasets import dataset_catalog, get_dataset_facts
from tunecost.errors import TunecostError


@pytest.mark.parametrize(
    ("name", "queries", "median"),
    [
        ("commonsense_15k", 15000, 79),  # Table II: CS 15K, median 79
        ("math_14k", 14000, 174),  # Table II: MATH 14K, median 174
        ("hellaswag", 10000, 272),  # Table II: HE 10K
        ("gsm8k", 1319, 148),  # GSM8K test split
    ],
)
def test_table_ii(name: str, queries: int, median: float) -> None:
    facts = dataset_catalog()[name]
    assert (facts.num_queries, facts.median_tokens_paper) == (queries, median)
    assert facts.source and facts.as_of


def test_lookup_any_case_and_unknown() -> None:
    assert get_dataset_facts(" MATH_14K ").name == "math_14k"
    with pytest.raises(TunecostError, match=r"unknown dataset 'math14k'\. Did you mean 'math_14k'\?"):
        get_dataset_facts("math14k")
