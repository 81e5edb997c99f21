"""Atomic, resumable result files.

Every finished measurement is written so that an interrupted run loses nothing: whole files are written to a
temporary file in the same folder and renamed over the target (atomic on POSIX); row logs are appended one
JSON line at a time and fsync'd, and a torn last line (a kill mid-write) is ignored on read and ended with a
newline before the next row is appended (so the resumed row is not glued onto it).
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunecost.errors import TunecostError, TunecostWarning

CACHE_ENV = "TUNECOST_CACHE_DIR"


def cache_root() -> Path:
    """Where tunecost keeps what it computed once (simulations, parameter counts): `$TUNECOST_CACHE_DIR`, else
    ~/.cache/tunecost."""
    root = os.environ.get(CACHE_ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "tunecost"


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `path` atomically (temp file + fsync + rename)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` atomically. A failure (a read-only folder, a full disk, a parent that is a file)
    is a `TunecostError` naming `path`, never the temporary file the user did not give."""
    target = Path(path)
    try:
        return _atomic_write_bytes(target, data)
    except OSError as exc:
        raise TunecostError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from None


def _atomic_write_bytes(target: Path, data: bytes) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, _new_file_mode())  # mkstemp makes 0600; results are ordinary files (0644 under umask 022)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _new_file_mode() -> int:
    """The mode `open()` would give a new file: 0666 minus the process umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def append_jsonl(path: str | os.PathLike[str], row: dict[str, Any]) -> None:
    """Append one JSON row and fsync, so a finished row survives a kill."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(row, default=str) + "\n"
    if _ends_torn(target):  # a kill mid-write left a line without its newline: end it, or this row joins it
        line = "\n" + line
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def _ends_torn(path: Path) -> bool:
    """Whether a non-empty file's last byte is not a newline."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() == 0:
                return False
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) != b"\n"
    except FileNotFoundError:
        return False


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All complete rows of a JSON-lines file. A torn last line (an interrupted write) is skipped silently; other
    lines that are not JSON objects are skipped with one `TunecostWarning` naming the file and the lines."""
    return list(iter_jsonl(path))


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    target = Path(path)
    if not target.exists():
        return
    with open(target, encoding="utf-8", errors="replace") as fh:
        lines = fh.readlines()
    bad: list[int] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError):  # RecursionError: nested deeper than Python's stack
            row = None
        if isinstance(row, dict):
            yield row
        elif number < len(lines) or raw.endswith("\n"):  # not the torn tail of an interrupted write
            bad.append(number)
    if bad:
        warnings.warn(_skipped_lines_message(target, bad), TunecostWarning, stacklevel=2)


MAX_LINES_NAMED = 5  # a garbage file is one warning naming its first few bad lines, not one warning per line


def _skipped_lines_message(target: Path, bad: list[int]) -> str:
    if len(bad) == 1:
        return (
            f"{target}:{bad[0]}: skipped a line that is not a JSON record (an interrupted write or an edit); "
            "results on the other lines are used"
        )
    named = ", ".join(map(str, bad[:MAX_LINES_NAMED])) + (", ..." if len(bad) > MAX_LINES_NAMED else "")
    return (
        f"{target}: skipped {len(bad)} lines that are not JSON records (lines {named}); "
        "results on the other lines are used"
    )
