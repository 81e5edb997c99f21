"""Tokenizers for counting and training: the model's own (transformers) or, offline, the real Mixtral one.

Sources and derivations: docs/datasets.md, section `tunecost.workload.tokenizers`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunecost.errors import TunecostError

MISTRAL_ALIASES = ("mistral", "mixtral", "mistral-v1", "tiny-mixtral")
MISTRAL_V1_FILE = "data/tokenizer.model.v1"


def mistral_v1_model_path() -> Path:
    """Path of the Mixtral/Mistral v1 SentencePiece model inside the installed `mistral-common` package."""
    try:
        import mistral_common
    except ImportError:  # pragma: no cover - a declared dependency
        raise TunecostError(
            "the offline Mixtral tokenizer needs the 'mistral-common' package (pip install mistral-common)"
        ) from None
    path = Path(mistral_common.__file__).parent / MISTRAL_V1_FILE
    if not path.is_file():
        raise TunecostError(f"mistral-common is installed but has no {MISTRAL_V1_FILE} (looked at {path})")
    return path


@dataclass(frozen=True, eq=False)
class SentencePieceTokenizer:
    """A SentencePiece model used directly (BOS/EOS ids from the model; pad = EOS, as LLaMA-Factory sets it)."""

    model_file: str
    name: str
    _sp: Any = field(repr=False, default=None)

    def __post_init__(self) -> None:
        import sentencepiece as spm

        try:
            sp = spm.SentencePieceProcessor(model_file=str(self.model_file))
        except (OSError, RuntimeError) as exc:
            raise TunecostError(f"cannot load SentencePiece model {self.model_file}: {exc}") from None
        object.__setattr__(self, "_sp", sp)

    @property
    def vocab_size(self) -> int:
        return int(self._sp.vocab_size())

    @property
    def bos_id(self) -> int | None:
        return _none_if_negative(self._sp.bos_id())

    @property
    def eos_id(self) -> int | None:
        return _none_if_negative(self._sp.eos_id())

    @property
    def pad_id(self) -> int:
        pad = _none_if_negative(self._sp.pad_id())
        return pad if pad is not None else (self.eos_id if self.eos_id is not None else 0)

    @property
    def chat_template(self) -> str | None:
        return None

    def encode(self, text: str) -> list[int]:
        return list(self._sp.encode(text))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # One call over the list is several times faster than a Python loop of encode().
        return [list(ids) for ids in self._sp.encode(list(texts))]

    def decode(self, ids: Sequence[int]) -> str:
        special = {self.bos_id, self.eos_id}
        return self._sp.decode([int(i) for i in ids if int(i) not in special])


@dataclass(frozen=True, eq=False)
class HFTokenizer:
    """A transformers tokenizer (the model's own); `encode` adds no special tokens."""

    tokenizer: Any = field(repr=False)
    name: str

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def bos_id(self) -> int | None:
        return self.tokenizer.bos_token_id

    @property
    def eos_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    @property
    def pad_id(self) -> int:
        for candidate in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id, 0):
            if candidate is not None:
                return int(candidate)
        return 0  # pragma: no cover

    @property
    def chat_template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        return [list(ids) for ids in self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def apply_chat_template(self, messages: list[dict[str, str]], *, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


@dataclass(frozen=True, eq=False)
class SubsetTokenizer:
    """A base tokenizer's exact segmentation, with its ids renumbered into a small vocabulary: the pieces a task
    uses plus UNK/BOS/EOS. Lets a tiny model train with a small output layer while tokenizing exactly as the
    base tokenizer does (a piece outside the subset becomes UNK)."""

    base: Any = field(repr=False)
    base_ids: tuple[int, ...]  # new id -> base id; new id 0 is the base's UNK
    name: str
    _to_new: dict[int, int] = field(repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        if len(set(self.base_ids)) != len(self.base_ids):
            raise TunecostError("subset tokenizer ids must be distinct")
        object.__setattr__(self, "_to_new", {b: i for i, b in enumerate(self.base_ids)})

    @property
    def vocab_size(self) -> int:
        return len(self.base_ids)

    def _new(self, base_id: int | None) -> int | None:
        return None if base_id is None else self._to_new.get(base_id)

    @property
    def bos_id(self) -> int | None:
        return self._new(self.base.bos_id)

    @property
    def eos_id(self) -> int | None:
        return self._new(self.base.eos_id)

    @property
    def pad_id(self) -> int:
        pad = self._new(self.base.pad_id)
        return pad if pad is not None else 0

    @property
    def chat_template(self) -> str | None:
        return None

    def encode(self, text: str) -> list[int]:
        return [self._to_new.get(i, 0) for i in self.base.encode(text)]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [[self._to_new.get(i, 0) for i in ids] for ids in self.base.encode_batch(texts)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.base.decode([self.base_ids[int(i)] for i in ids if 0 <= int(i) < len(self.base_ids)])


def subset_tokenizer(base: Any, texts: Sequence[str], *, unk_id: int = 0) -> SubsetTokenizer:
    """The `SubsetTokenizer` of every piece `base` produces on `texts` (plus UNK, BOS, EOS and the digits)."""
    used: set[int] = set()
    for ids in base.encode_batch([*texts, " 0 1 2 3 4 5 6 7 8 9 -"]):
        used.update(ids)
    specials = [unk_id] + [i for i in (base.bos_id, base.eos_id) if i is not None and i != unk_id]
    base_ids = tuple(specials + sorted(used - set(specials)))
    return SubsetTokenizer(base, base_ids, name=f"{base.name} subset ({len(base_ids)} pieces)")


Tokenizer = SentencePieceTokenizer | HFTokenizer | SubsetTokenizer


def _none_if_negative(value: int) -> int | None:
    return None if value is None or value < 0 else int(value)


@functools.lru_cache(maxsize=8)
def _mistral_v1() -> SentencePieceTokenizer:
    path = mistral_v1_model_path()
    return SentencePieceTokenizer(str(path), name="mistral-v1 (Mixtral-8x7B SentencePiece, 32000, mistral-common)")


@functools.lru_cache(maxsize=8)
def _hf_tokenizer(name_or_path: str, allow_download: bool) -> HFTokenizer:
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(name_or_path, local_files_only=not allow_download, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as exc:
        where = "local path" if Path(name_or_path).exists() else "hub id"
        hint = (
            "" if allow_download else " (downloads are off: pass allow_download / --allow-download, or use 'mistral')"
        )
        raise TunecostError(
            f"cannot load tokenizer from {where} {name_or_path!r}{hint}: {str(exc).splitlines()[0]}"
        ) from None
    return HFTokenizer(tok, name=f"hf:{name_or_path}")


def tokenizer_by_name(name: str, *, allow_download: bool = False) -> Tokenizer:
    """The tokenizer for ``"mistral"`` (offline Mixtral), a SentencePiece ``.model`` file, a local directory
    or a hub id (cache only unless `allow_download`). Raises `TunecostError` when none can be loaded."""
    key = name.strip()
    if not key:
        raise TunecostError("empty tokenizer name; use 'mistral', a local path or a hub id")
    if key.lower() in MISTRAL_ALIASES:
        return _mistral_v1()
    path = Path(os.path.expanduser(key))
    if path.is_file():
        if path.suffix == ".model" or path.name.startswith("tokenizer.model"):
            return SentencePieceTokenizer(str(path), name=f"sentencepiece:{path.name}")
        raise TunecostError(f"tokenizer file {key!r} is not a SentencePiece .model file; pass its folder instead")
    return _hf_tokenizer(str(path) if path.is_dir() else key, allow_download)
