"""Chat datasets as queries: one conversation is one query, the turns before its last assistant turn the prompt
and the rest the response. The two common forms: `messages` of role/content turns (TRL, Hugging Face chat data)
and ShareGPT's `conversations` of from/value turns. Texts only: a chat template's own tokens are not counted."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

CHAT_FORMATS = {  # column -> (role key, text key, description)
    "messages": ("role", "content", "chat messages (role, content turns)"),
    "conversations": ("from", "value", "ShareGPT conversations (from, value turns)"),
}
ASSISTANT_ROLES = frozenset({"assistant", "gpt", "model", "bot"})


def chat_prompt_response(row: Mapping[str, Any], column: str) -> tuple[str, str]:
    """The prompt and response texts of one conversation in `row[column]` (ValueError: not a conversation)."""
    role_key, text_key, _ = CHAT_FORMATS[column]
    turns = row.get(column)
    if isinstance(turns, (str, bytes, Mapping)) or not isinstance(turns, Iterable):  # a list, or parquet's array
        raise ValueError(f"{column!r} should be a list of turns")
    texts, last = [], None
    for i, turn in enumerate(turns):
        role = turn.get(role_key) if isinstance(turn, Mapping) else None
        text = turn.get(text_key) if isinstance(turn, Mapping) else None
        if not isinstance(role, str) or not isinstance(text, str):
            raise ValueError(f"turn {i} of {column!r} needs {role_key!r} and {text_key!r} texts")
        last = i if role.lower() in ASSISTANT_ROLES else last
        texts.append(text)
    if last is None:
        raise ValueError(f"{column!r} has no assistant turn")
    return "\n".join(texts[:last]), "\n".join(texts[last:])
