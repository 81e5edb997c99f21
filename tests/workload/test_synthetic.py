from __future__ import annotations

import pytest

from tunecost.errors import TunecostError
from tunecost.evaluate.parsers import extract_answer_number, parse_reference_number
from tunecost.workload.datasets import synthetic_arith_dataset
from tunecost.workload.synthetic import SyntheticArithConfig, synthetic_arith_rows


def test_rows_are_math14k_format_and_deterministic():
    train, test = synthetic_arith_rows(200, 50, seed=7)
    assert (len(train), len(test)) == (200, 50)
    assert train == synthetic_arith_rows(200, 50, seed=7)[0]
    assert train != synthetic_arith_rows(200, 50, seed=8)[0]
    for row in train + test:
        assert set(row) == {"instruction", "input", "output", "answer"}
        # the reference answer is what LLM-Adapters' last-number rule reads from the ground-truth output
        assert extract_answer_number(row["output"]) == parse_reference_number(row["answer"])
        assert parse_reference_number(row["answer"]) >= 0


def test_held_out_split_shares_no_question_and_is_stable():
    train, test = synthetic_arith_rows(300, 60)
    assert not {r["instruction"] for r in train} & {r["instruction"] for r in test}
    assert len({r["instruction"] for r in train}) == 300
    # growing the train split leaves the test split unchanged
    assert synthetic_arith_rows(500, 60)[1] == test


def test_dataset_and_bad_sizes():
    ds = synthetic_arith_dataset("test")
    assert ds.name == "synthetic-arith-test" and ds.format == "llm-adapters" and len(ds) == 100
    with pytest.raises(TunecostError):
        synthetic_arith_rows(0, 10)
    with pytest.raises(TunecostError):
        synthetic_arith_dataset("validation")
    with pytest.raises(TunecostError):
        SyntheticArithConfig(max_operand=0)
    with pytest.raises(TunecostError, match="distinct"):
        synthetic_arith_rows(100000, 10, config=SyntheticArithConfig(max_operand=1, subtraction=False))
