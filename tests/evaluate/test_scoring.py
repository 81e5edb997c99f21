from __future__ import annotations

from pathlib import Path

import pytest

from tunecost.errors import TunecostError
from tunecost.evaluate.harness import score_generations
from tunecost.evaluate.scoring import Scorer, scorer_for
from tunecost.workload.datasets import load_dataset, rows_to_dataset

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"


@pytest.mark.parametrize(
    ("fixture", "name"),
    [
        ("llm_adapters_math.json", "number"),
        ("gsm8k_original.jsonl", "number"),
        ("llm_adapters_commonsense.json", "choice:answer"),
        ("llm_adapters_boolq.json", "choice:boolean"),
        ("llm_adapters_winogrande.json", "choice:option"),
        ("llm_adapters_piqa.json", "choice:solution"),
        ("llm_adapters_aqua.json", "letter"),
        ("hellaswag.jsonl", "loglik"),
    ],
)
def test_scorer_is_picked_from_format_and_answers(fixture, name):
    assert scorer_for(load_dataset(str(FIXTURES / fixture))).name == name


@pytest.mark.parametrize(
    "fixture",
    [
        "llm_adapters_math.json",
        "llm_adapters_commonsense.json",
        "llm_adapters_boolq.json",
        "llm_adapters_winogrande.json",
        "llm_adapters_piqa.json",
        "llm_adapters_aqua.json",
    ],
)
def test_reference_answers_and_outputs_of_fixtures_score_100_percent(fixture):
    ds = load_dataset(str(FIXTURES / fixture))
    assert all(p.correct for p in score_generations(ds, [e.answer for e in ds.examples]))
    assert all(p.correct for p in score_generations(ds, [e.response for e in ds.examples]))


def test_gsm8k_original_reference_solutions_score_100_percent():
    ds = load_dataset(str(FIXTURES / "gsm8k_original.jsonl"))
    assert all(p.correct for p in score_generations(ds, [e.response for e in ds.examples]))


def test_malformed_generations_score_zero():
    math_ds = load_dataset(str(FIXTURES / "llm_adapters_math.json"))
    bad = ["no idea", "The answer is seven.", "7 or 8? I think 8", ""]
    predictions = score_generations(math_ds, bad)
    assert [p.correct for p in predictions] == [False, False, False, False]
    assert predictions[0].prediction == "inf"
    cs = load_dataset(str(FIXTURES / "llm_adapters_commonsense.json"))
    predictions = score_generations(cs, ["Answer1", "the answer is 2", "answer3 or answer1"])
    assert [p.correct for p in predictions] == [False, False, True]


def test_unscorable_datasets():
    no_answers = rows_to_dataset([{"instruction": "hi", "output": "there"}], name="x", source="t")
    with pytest.raises(TunecostError, match="no reference answer"):
        scorer_for(no_answers)
    words = rows_to_dataset([{"instruction": "hi", "output": "there", "answer": "blue"}], name="x", source="t")
    with pytest.raises(TunecostError, match="cannot tell how to score"):
        scorer_for(words)
    with pytest.raises(TunecostError):
        score_generations(load_dataset(str(FIXTURES / "hellaswag.jsonl")), ["a"])
    with pytest.raises(TunecostError):
        Scorer(kind="loglik").parse("x")
