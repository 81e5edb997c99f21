"""How a dataset is scored, decided from its format and its reference answers, and scoring of generations.

- ``number``: GSM8K-style exact match of the final number (LLM-Adapters' last-number rule, tolerance 0.001);
- ``letter``: AQuA's A-E;
- ``choice``: the commonsense sets' option words (true/false, solution1/2, answer1..5, ending1..4, option1/2);
- ``loglik``: HellaSwag-format rows, the ending with the highest log-likelihood wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tunecost.errors import TunecostError
from tunecost.evaluate import parsers
from tunecost.workload.datasets import Dataset
from tunecost.workload.formats import Example

# LLM-Adapters' generation budgets: 256 new tokens for math reasoning, 32 for commonsense option words.
DEFAULT_MAX_NEW_TOKENS = {"number": 256, "letter": 256, "choice": 32, "loglik": 0}


@dataclass(frozen=True, kw_only=True)
class Scorer:
    kind: str  # "number" | "letter" | "choice" | "loglik"
    style: str | None = None  # the option style for kind "choice"

    @property
    def name(self) -> str:
        return f"choice:{self.style}" if self.kind == "choice" else self.kind

    def parse(self, generation: str) -> str:
        """The answer a generation gives, as text ("" or "inf" when it gives none)."""
        if self.kind == "number":
            value = parsers.extract_answer_number(generation)
            return "inf" if math.isinf(value) else repr(value)
        if self.kind == "letter":
            return parsers.extract_answer_letter(generation)
        if self.kind == "choice":
            return parsers.extract_choice(generation, self.style or "answer")
        raise TunecostError(f"scorer {self.name} does not parse generations")

    def is_correct(self, generation: str, example: Example) -> bool:
        if self.kind == "number":
            return parsers.number_is_correct(
                parsers.extract_answer_number(generation), parsers.parse_reference_number(example.answer)
            )
        return self.parse(generation) == example.answer.strip()


def scorer_for(dataset: Dataset) -> Scorer:
    """Pick the scorer from the dataset's format, else from what its reference answers look like."""
    if dataset.format == "hellaswag":
        return Scorer(kind="loglik")
    if dataset.format == "gsm8k":
        return Scorer(kind="number")
    answers = [e.answer.strip() for e in dataset.examples]
    missing = [i for i, a in enumerate(answers) if not a]
    if missing:
        raise TunecostError(
            f"dataset {dataset.name!r} has no reference answer in row {missing[0]} "
            f"({len(missing)} rows without one); cannot score it"
        )
    style = parsers.choice_style_for(answers)
    if style is not None:
        return Scorer(kind="choice", style=style)
    if all(len(a) == 1 and a in "ABCDE" for a in answers):
        return Scorer(kind="letter")
    if all(not math.isnan(parsers.parse_reference_number(a)) for a in answers):
        return Scorer(kind="number")
    sample = sorted(set(answers))[:5]
    raise TunecostError(
        f"cannot tell how to score dataset {dataset.name!r}: its answers (e.g. {sample}) are not "
        "numbers, A-E letters or LLM-Adapters option words"
    )
