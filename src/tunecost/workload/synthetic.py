"""The embedded default task: small arithmetic word problems in math_14k's format, generated from a seed.

Sources and derivations: docs/datasets.md, section `tunecost.workload.synthetic`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tunecost.errors import TunecostError

NAMES = ("Mia", "Tom", "Ava", "Leo", "Zoe", "Sam", "Ivy", "Max", "Amy", "Ben", "Eva", "Dan")
PRONOUN = {
    "Mia": "She",
    "Ava": "She",
    "Zoe": "She",
    "Ivy": "She",
    "Amy": "She",
    "Eva": "She",
    "Tom": "He",
    "Leo": "He",
    "Sam": "He",
    "Max": "He",
    "Ben": "He",
    "Dan": "He",
}
ITEMS = ("apples", "books", "coins", "pens", "cards", "shells", "stamps", "balls", "cups", "eggs")

ADD_TEMPLATES = (
    "{name} has {a} {items}. {pron} gets {b} more {items}. How many {items} does {name} have now?",
    "There are {a} {items} in a box and {b} {items} on the table. How many {items} are there in total?",
    "{name} bought {a} {items} on Monday and {b} {items} on Tuesday. How many {items} did {name} buy?",
    "{name} found {a} {items} and then found {b} more. How many {items} did {name} find?",
)
SUB_TEMPLATES = (
    "{name} has {a} {items}. {pron} gives away {b} {items}. How many {items} does {name} have left?",
    "There were {a} {items} on a shelf. {name} took {b} of them. How many {items} are still on the shelf?",
)

SYNTHETIC_SEED = 1234
DEFAULT_NUM_TRAIN = 1200
DEFAULT_NUM_TEST = 100


@dataclass(frozen=True, kw_only=True)
class SyntheticArithConfig:
    """What the generator draws from."""

    max_operand: int = 9  # operands are 0..max_operand
    subtraction: bool = True  # also "gives away" problems, result >= 0

    def __post_init__(self) -> None:
        if not 1 <= self.max_operand <= 999:
            raise TunecostError(f"max_operand must be within 1..999, got {self.max_operand}")


def _problem(rng: random.Random, config: SyntheticArithConfig) -> dict[str, str]:
    a, b = rng.randint(0, config.max_operand), rng.randint(0, config.max_operand)
    subtract = config.subtraction and rng.random() < 0.5
    if subtract and b > a:
        a, b = b, a
    template = rng.choice(SUB_TEMPLATES if subtract else ADD_TEMPLATES)
    name = rng.choice(NAMES)
    question = template.format(name=name, pron=PRONOUN[name], a=a, b=b, items=rng.choice(ITEMS))
    result = a - b if subtract else a + b
    op = "-" if subtract else "+"
    return {
        "instruction": question,
        "input": "",
        "output": f"\nA: {a} {op} {b} = {result}. The answer is {result}.",
        "answer": f"{float(result)}",
    }


def synthetic_arith_rows(
    num_train: int = DEFAULT_NUM_TRAIN,
    num_test: int = DEFAULT_NUM_TEST,
    *,
    seed: int = SYNTHETIC_SEED,
    config: SyntheticArithConfig = SyntheticArithConfig(),
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Deterministic (train, test) rows; no test question appears in train, and each split has unique questions
    as far as the question space allows."""
    if num_train <= 0 or num_test <= 0:
        raise TunecostError(f"synthetic split sizes must be positive, got train={num_train}, test={num_test}")
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: list[list[dict[str, str]]] = []
    for wanted in (num_test, num_train):  # test first, so growing the train split never changes the test split
        rows: list[dict[str, str]] = []
        repeats = 0  # draws in a row that gave an already-seen question: the space is (nearly) exhausted
        while len(rows) < wanted:
            row = _problem(rng, config)
            if row["instruction"] in seen:
                repeats += 1
                if repeats > 2000:
                    raise TunecostError(f"cannot draw {wanted} distinct synthetic problems; lower the split sizes")
                continue
            repeats = 0
            seen.add(row["instruction"])
            rows.append(row)
        splits.append(rows)
    test, train = splits
    return train, test
