"""Output-path guard shared by every command that writes a file the user names.

A command never replaces a file the user already had without `force`, and never (even with `force`) writes onto
one of its own inputs. The checks run before any work, so a long computation never ends in a refused write.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from tunecost.errors import TunecostError


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _check_parent_is_a_folder(target: Path, option: str) -> None:
    """Refuse `target` when its nearest existing parent is a file (nothing could be created below it)."""
    for parent in target.parents:
        if parent.exists():
            if not parent.is_dir():
                raise TunecostError(f"{option} {str(target)!r}: {str(parent)!r} is a file, not a folder")
            break


def check_output_path(
    path: str | os.PathLike[str],
    *,
    force: bool,
    inputs: Iterable[str | os.PathLike[str] | None] = (),
    option: str = "--out",
) -> Path:
    """`path` as a Path when it may be written; else a `TunecostError` naming `option` and the path.

    Refused always: `path` is one of `inputs`, `path` is a folder, or a
    parent of `path` is an existing file. Refused without `force`: `path` already exists.
    """
    target = Path(path)
    for given in inputs:
        if given is None:
            continue
        source = Path(given)
        if _same_file(target, source) or target.resolve() == source.resolve():
            raise TunecostError(f"{option} {str(target)!r} is one of this command's inputs; choose another file")
    if target.is_dir():
        raise TunecostError(f"{option} {str(target)!r} is a folder; give a file name")
    _check_parent_is_a_folder(target, option)
    if target.exists() and not force:
        raise TunecostError(f"{option} {str(target)!r} already exists; pass --force to replace it")
    return target


def check_output_folder(
    path: str | os.PathLike[str], *, option: str = "--out", own: Iterable[tuple[str, str]] = ()
) -> Path:
    """`path` as a Path when it is, or can become, a tunecost run folder; else a `TunecostError` naming `option`.
    Refused: a file, a folder whose meta.json is not a tunecost run's, and a folder holding a file the command
    writes beside its records (`own`: (file, records file) pairs) where those records are not there (the file is
    the user's, not an earlier run's)."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise TunecostError(f"{option} {str(target)!r} is a file; give a folder")
    _check_parent_is_a_folder(target, option)
    meta = target / "meta.json"
    if meta.exists() and read_run_metadata(meta) is None:
        raise TunecostError(f"{option} {str(target)!r}: its meta.json is not a tunecost run's; give another folder")
    for name, records in own:
        if (target / name).exists() and not (target / records).exists():
            raise TunecostError(
                f"{option} {str(target)!r} holds {name} but no {records}: not a tunecost run's; give another folder"
            )
    return target


def read_run_metadata(path: Path) -> dict | None:
    """A run folder's meta.json that tunecost wrote (a JSON object with "tool": "tunecost"); None where `path` is
    not one (missing, unreadable, or another program's)."""
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) and data.get("tool") == "tunecost" else None
