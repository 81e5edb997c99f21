"""Reading a user's CSV file: '#' comment lines skipped, a header, then rows (a row that repeats the header, as
`cat a.csv b.csv` leaves, is skipped); every failure is a `TunecostError`
that names the file (and the row where there is one): a folder, a missing file, bytes that are not UTF-8, a field
longer than `MAX_FIELD_CHARS`, a broken quote."""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path

from tunecost.errors import TunecostError

MAX_FIELD_CHARS = 131072  # csv's own default limit: no value in these files comes near it


def check_input_file(path: str | os.PathLike[str], what: str = "file") -> Path:
    """`path` as a Path when it is an existing file; else an error that says what is wrong with it."""
    target = Path(path)
    if target.is_dir():
        raise TunecostError(f"{what} {str(target)!r} is a folder, not a file")
    if not target.is_file():
        raise TunecostError(f"{what} not found: {str(target)!r}")
    return target


def read_csv_rows(
    path: str | os.PathLike[str], what: str = "CSV file", *, required: Sequence[str] = ()
) -> tuple[list[str], list[dict[str, str]]]:
    """(header, rows) of a CSV file; a row is a dict of the header's columns (missing cells are ""). A header
    without every `required` column is an error naming the missing ones."""
    target = check_input_file(path, what)
    try:
        with open(target, newline="", encoding="utf-8-sig") as fh:  # utf-8-sig: an Excel BOM is no column name
            reader = csv.DictReader(line for line in fh if not line.lstrip().startswith("#"))
            rows: list[dict[str, str]] = []
            header: list[str] | None = None
            try:
                header = [h for h in (reader.fieldnames or []) if h is not None]
                for row in reader:
                    cells = {k: v if isinstance(v, str) else "" for k, v in row.items() if isinstance(k, str)}
                    if header and all(cells.get(h, "").strip() == h.strip() for h in header):
                        continue  # the header again: files concatenated with their headers
                    rows.append(cells)
            except csv.Error as exc:
                where = "header" if header is None else f"row {len(rows) + 1}"
                raise TunecostError(f"{str(target)!r}: {where}: not readable as CSV ({exc})") from None
    except UnicodeDecodeError as exc:
        raise TunecostError(f"{str(target)!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if "\0" in "".join(header):
        raise TunecostError(f"{str(target)!r}: header holds a NUL byte: {header!r}")
    missing = [c for c in required if c not in header]
    if missing:
        found = ", ".join(map(repr, header)) or "none"
        raise TunecostError(
            f"{target}: missing column(s) {', '.join(missing)}; found {found}; required: {', '.join(required)}"
        )
    return header, rows
