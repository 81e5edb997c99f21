"""Atomic, resumable result files.

Every finished measurement is written so that an interrupted run loses nothing: whole files are written to a
temporary file in the same folder and renamed over the target (atomic on POSIX); row logs are appended one
JSON line at a time and fsync'd, and a torn last line (a kill mid-write) is ignored on read.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `path` atomically (temp file + fsync + rename)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def append_jsonl(path: str | os.PathLike[str], row: dict[str, Any]) -> None:
    """Append one JSON row and fsync, so a finished row survives a kill."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(row, default=str) + "\n"
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All complete rows of a JSON-lines file; a torn trailing line from an interrupted write is skipped."""
    return list(iter_jsonl(path))


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    target = Path(path)
    if not target.exists():
        return
    with open(target, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line: the point will be redone
