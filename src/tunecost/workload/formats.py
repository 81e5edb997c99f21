"""The row formats a dataset file may hold, each turned into `Example`s: alpaca-style instruction/output rows,
GSM8K, HellaSwag, chat conversations (`tunecost.workload.chat`), or any two columns a mapping names."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tunecost.errors import TunecostError
from tunecost.workload.chat import CHAT_FORMATS, chat_prompt_response


@dataclass(frozen=True, kw_only=True)
class Example:
    """One query: a prompt and its ground-truth response, plus what evaluation compares against."""

    prompt: str
    response: str
    answer: str = ""  # reference answer for scoring: "576.0", "answer3", "true", "A"; may be empty
    choices: tuple[str, ...] = ()  # continuations scored by log-likelihood (HellaSwag)
    label: int | None = None  # index of the right choice


@dataclass(frozen=True, kw_only=True)
class DatasetFormat:
    name: str
    required: tuple[str, ...]
    description: str
    to_example: Callable[[Mapping[str, Any]], Example] = field(repr=False)


def _text(row: Mapping[str, Any], key: str, *, required: bool = True) -> str:
    value = row.get(key)
    if isinstance(value, float) and value != value:  # NaN: a missing cell in a parquet/csv file
        value = None
    if value is None:
        if required:
            raise ValueError(f"missing {key!r}")
        return ""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ValueError(f"{key!r} should be text, got {type(value).__name__}")
    return str(value)


def _llm_adapters_example(row: Mapping[str, Any]) -> Example:
    instruction = _text(row, "instruction")
    extra = _text(row, "input", required=False)
    prompt = f"{instruction}\n{extra}" if extra.strip() else instruction
    if not prompt.strip():
        raise ValueError("empty 'instruction'")
    return Example(prompt=prompt, response=_text(row, "output"), answer=_text(row, "answer", required=False).strip())


GSM8K_ANSWER = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


def gsm8k_reference_answer(answer_text: str) -> str:
    """The number after ``####`` in a GSM8K answer, thousands separators removed ("1,000" -> "1000")."""
    match = GSM8K_ANSWER.search(answer_text)
    if match is None:
        raise ValueError("'answer' has no '#### N' final answer")
    return match.group(1).replace(",", "").strip()


def _gsm8k_example(row: Mapping[str, Any]) -> Example:
    question, answer_text = _text(row, "question"), _text(row, "answer")
    return Example(prompt=question, response=answer_text, answer=gsm8k_reference_answer(answer_text))


def _hellaswag_clean(text: str) -> str:
    # HellaSwag's WikiHow contexts carry "[title]"/"[header]" markers and double spaces.
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _hellaswag_example(row: Mapping[str, Any]) -> Example:
    ctx = _hellaswag_clean(_text(row, "ctx"))
    endings = row.get("endings")
    if not isinstance(endings, (list, tuple)) or len(endings) < 2 or not all(isinstance(e, str) for e in endings):
        raise ValueError("'endings' should be a list of at least two strings")
    raw_label = row.get("label")
    try:
        if not isinstance(raw_label, (int, float, str)):
            raise TypeError
        label = int(raw_label)  # the hub's label is a string "0".."3"
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"'label' should be an ending index, got {raw_label!r}") from None
    if not 0 <= label < len(endings):
        raise ValueError(f"'label' {label} is out of range for {len(endings)} endings")
    choices = tuple(" " + _hellaswag_clean(e) for e in endings)
    return Example(prompt=ctx, response=choices[label], answer=str(label), choices=choices, label=label)


def _chat_format(column: str, description: str) -> DatasetFormat:
    def to_example(row: Mapping[str, Any]) -> Example:
        prompt, response = chat_prompt_response(row, column)
        return Example(prompt=prompt, response=response)

    return DatasetFormat(name=column, required=(column,), description=description, to_example=to_example)


FORMATS: dict[str, DatasetFormat] = {
    f.name: f
    for f in (
        DatasetFormat(
            name="llm-adapters",
            required=("instruction", "output"),
            description="llm-adapters/alpaca (instruction, output[, input, answer])",
            to_example=_llm_adapters_example,
        ),
        DatasetFormat(
            name="gsm8k",
            required=("question", "answer"),
            description="gsm8k (question, answer with '#### N')",
            to_example=_gsm8k_example,
        ),
        DatasetFormat(
            name="hellaswag",
            required=("ctx", "endings", "label"),
            description="hellaswag (ctx, endings, label)",
            to_example=_hellaswag_example,
        ),
        DatasetFormat(  # NeMo's SFT JSONL and torchtune's instruct_dataset columns
            name="input-output",
            required=("input", "output"),
            description="input-output (input, output: NeMo's SFT JSONL, torchtune's instruct_dataset)",
            to_example=lambda row: Example(prompt=_text(row, "input"), response=_text(row, "output")),
        ),
    )
}
FORMATS |= {column: _chat_format(column, description) for column, (_, _, description) in CHAT_FORMATS.items()}
FORMAT_ALIASES = {"alpaca": "llm-adapters", "sharegpt": "conversations"}


def columns_format(columns: Mapping[str, str]) -> DatasetFormat:
    """A format from a column mapping: keys ``prompt`` and ``response`` (required) and ``answer`` (optional)."""
    unknown = set(columns) - {"prompt", "response", "answer"}
    if unknown or not {"prompt", "response"} <= set(columns):
        raise TunecostError(
            f"a column mapping needs prompt=COL and response=COL (optionally answer=COL); got {dict(columns)}"
        )

    def to_example(row: Mapping[str, Any]) -> Example:
        answer = _text(row, columns["answer"]) if "answer" in columns else ""
        return Example(
            prompt=_text(row, columns["prompt"]), response=_text(row, columns["response"]), answer=answer.strip()
        )

    return DatasetFormat(
        name="columns", required=tuple(columns.values()), description=f"columns {dict(columns)}", to_example=to_example
    )


def accepted_formats_text() -> str:
    kinds = "; ".join(f.description for f in FORMATS.values())
    return f"{kinds}; or any JSON/JSONL with a column mapping (`tunecost data stats --columns prompt=COL,response=COL`)"


def detect_format(columns: Iterable[str], source: str) -> DatasetFormat:
    found = set(columns)
    for fmt in FORMATS.values():
        if set(fmt.required) <= found:
            return fmt
    raise TunecostError(
        f"{source}: unknown dataset format; found columns {sorted(found)}. Accepted formats: {accepted_formats_text()}"
    )
