from __future__ import annotations

import math
from pathlib import Path

import pytest

from tunecost.evaluate import parsers

# The first examples of each reference test set (tests/fixtures/data/reference/README.md).
REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "reference"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 72.", 72.0),
        ("48/2 = 24 clips in May, so 48 + 24 = 72 in all. The answer is 72", 72.0),  # several numbers: the last
        ("She earned $1,234.50 in total.", 1234.5),  # thousands commas are dropped
        ("It dropped to -3 degrees.", -3.0),
        ("The answer is 18.", 18.0),  # "18." matches as 18.0 (LLM-Adapters' -?\d+\.?\d*)
        ("Step 1: add. Step 2: 5 + 5 = 10", 10.0),
        ("x = 3.75", 3.75),
    ],
)
def test_last_number(text, expected):
    assert parsers.extract_answer_number(text) == expected


@pytest.mark.parametrize("text", ["", "I do not know.", "twelve", "-", "...."])
def test_no_number_is_never_correct(text):
    value = parsers.extract_answer_number(text)
    assert math.isinf(value)
    assert not parsers.number_is_correct(value, 12.0)


def test_number_tolerance_and_references():
    assert parsers.number_is_correct(576.0, parsers.parse_reference_number("576.0"))
    assert parsers.number_is_correct(2.5004, 2.5) and not parsers.number_is_correct(2.502, 2.5)
    assert parsers.parse_reference_number("1,000") == 1000.0
    assert math.isnan(parsers.parse_reference_number("answer1"))
    assert not parsers.number_is_correct(3.0, parsers.parse_reference_number("n/a"))
    # a generation that states a wrong final number after the right one is wrong (last number wins)
    assert not parsers.number_is_correct(parsers.extract_answer_number("The answer is 8. Check: 9"), 8.0)


def test_letters():
    assert parsers.extract_answer_letter("The answer is (B).") == "B"
    assert parsers.extract_answer_letter("  D") == "D"
    assert parsers.extract_answer_letter("the answer is b") == ""  # only capitals A-E count
    assert parsers.extract_answer_letter("A or C?") == "A"  # the first one, as LLM-Adapters does


@pytest.mark.parametrize(
    ("text", "style", "expected"),
    [
        ("the correct answer is true", "boolean", "true"),
        ("false, definitely not true", "boolean", "false"),  # first match wins
        ("the correct answer is solution2", "solution", "solution2"),
        ("the correct answer is answer5", "answer", "answer5"),
        ("the correct answer is ending3", "ending", "ending3"),
        ("the correct answer is option1", "option", "option1"),
        ("The correct answer is Answer2", "answer", ""),  # wrong case: LLM-Adapters is case-sensitive
        ("the correct answer is 2", "answer", ""),  # wrong option format
        ("the correct answer is solution 1", "solution", ""),
        ("", "boolean", ""),
        ("answer6", "answer", ""),  # outside answer1..5
    ],
)
def test_choices(text, style, expected):
    assert parsers.extract_choice(text, style) == expected


def test_choice_style_from_answers():
    assert parsers.choice_style_for(["true", "false"]) == "boolean"
    assert parsers.choice_style_for(["answer1", "answer4"]) == "answer"
    assert parsers.choice_style_for(["option2"]) == "option"
    assert parsers.choice_style_for(["answer1", "7"]) is None
    assert parsers.choice_style_for([]) is None


REFERENCE_FILES = sorted(REFERENCE.glob("llm-adapters/*_test.json")) + sorted(REFERENCE.glob("gsm8k/*.jsonl"))


def test_every_reference_test_set_is_present():
    assert len(REFERENCE_FILES) == 11


@pytest.mark.parametrize("path", REFERENCE_FILES, ids=lambda p: p.name)
def test_reference_answers_of_the_test_sets_score_100_percent(path):
    from tunecost.evaluate.harness import score_generations
    from tunecost.workload.datasets import load_dataset

    ds = load_dataset(str(path))
    references = [e.response if ds.format == "gsm8k" else e.answer for e in ds.examples]
    predictions = score_generations(ds, references)
    assert len(predictions) == len(ds) > 0
    assert all(p.correct for p in predictions), [p for p in predictions if not p.correct][:3]
