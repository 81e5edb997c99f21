"""The one error type the library raises for user errors.

The CLI turns a `TunecostError` into a one-line message and exit code 2; anything else is a bug.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class TunecostError(Exception):
    """A user error: bad input, unknown name, a job that cannot run. The message is shown as is."""


class DoesNotFit(TunecostError):
    """A job that needs more memory than the GPU has even at batch size 1 (a result for estimates, an error for
    a command that asks for a batch size)."""


class TunecostWarning(UserWarning):
    """Something the user should know that does not stop the work (e.g. a skipped corrupt result line); the CLI
    prints it as one `warning:` line."""


def unknown_name_error(kind: str, name: str, choices: Iterable[str]) -> TunecostError:
    """An error for an unknown `kind` (model, GPU, provider, ...) that lists the valid choices
    and, where one is close, suggests it ("did you mean")."""
    valid = sorted(set(choices))
    longer = [c for c in valid if c.lower().startswith(name.strip().lower())]  # "mistral-7b": its versions
    close = difflib.get_close_matches(name.lower(), [c.lower() for c in valid], n=1, cutoff=0.6)
    meant = longer[:4] if name.strip() and longer else [c for c in valid if close and c.lower() == close[0]][:1]
    said = [repr(m) for m in meant]
    hint = f" Did you mean {' or '.join([', '.join(said[:-1]), said[-1]] if len(said) > 1 else said)}?" if said else ""
    return TunecostError(f"unknown {kind} {name!r}.{hint} Valid choices: {', '.join(valid)}")
