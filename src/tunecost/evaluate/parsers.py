"""Answer parsers, matching LLM-Adapters' evaluation scripts (the paper's evaluation sets come from there).

Sources and derivations: docs/trainability.md, section `tunecost.evaluate.parsers`.
"""

from __future__ import annotations

import math
import re

NUMBER_PATTERN = re.compile(r"-?\d+\.?\d*")
LETTER_PATTERN = re.compile(r"A|B|C|D|E")
NUMBER_TOLERANCE = 0.001

# The option words of each commonsense style, as in LLM-Adapters' extract_answer.
CHOICE_PATTERNS: dict[str, re.Pattern[str]] = {
    "boolean": re.compile(r"true|false"),
    "solution": re.compile(r"solution1|solution2"),
    "answer": re.compile(r"answer1|answer2|answer3|answer4|answer5"),
    "ending": re.compile(r"ending1|ending2|ending3|ending4"),
    "option": re.compile(r"option1|option2"),
}


def extract_answer_number(text: str) -> float:
    """The last number in `text` (commas removed); +inf when there is none."""
    matches = NUMBER_PATTERN.findall(text.replace(",", ""))
    if not matches:
        return math.inf
    try:
        return float(matches[-1])
    except ValueError:  # pragma: no cover - the pattern only matches floats
        return math.inf


def parse_reference_number(answer: str) -> float:
    """A dataset's numeric reference answer ("576.0", "1,000", "-3") as a float; NaN when it is not a number."""
    try:
        return float(answer.replace(",", "").strip())
    except ValueError:
        return math.nan


def number_is_correct(prediction: float, reference: float, tolerance: float = NUMBER_TOLERANCE) -> bool:
    if math.isnan(reference) or math.isinf(prediction) or math.isnan(prediction):
        return False
    return abs(reference - prediction) <= tolerance


def extract_answer_letter(text: str) -> str:
    """The first capital A-E in `text` (AQuA); "" when none."""
    match = LETTER_PATTERN.search(text.strip())
    return match.group(0) if match else ""


def extract_choice(text: str, style: str) -> str:
    """The first option word of `style` (see `CHOICE_PATTERNS`) in `text`; "" when none."""
    match = CHOICE_PATTERNS[style].search(text.strip())
    return match.group(0) if match else ""


def choice_style_for(answers: list[str]) -> str | None:
    """The commonsense option style that every reference answer belongs to, or None."""
    for style, pattern in CHOICE_PATTERNS.items():
        if answers and all(pattern.fullmatch(a.strip()) for a in answers):
            return style
    return None
