"""Shared plumbing for CLI commands: error handling, JSON output, rich tables, list parsing.

Library code never imports this module; commands call the Python API and render its results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import typer

from tunecost.cli.options import blame_config
from tunecost.errors import TunecostError, TunecostWarning
from tunecost.limits import MAX_INT_OPTION
from tunecost.workload.stacks import STACK_SPECS

if TYPE_CHECKING:
    from rich.console import Console

F = TypeVar("F", bound=Callable[..., Any])

# Piped or redirected output is never cut to a terminal's width (`tunecost models | grep NAME` finds the row).
PIPE_WIDTH = 10_000


def _stdout_console() -> Console:
    from rich.console import Console

    if sys.stdout.isatty():
        return Console(highlight=False)
    return Console(width=PIPE_WIDTH, soft_wrap=True, highlight=False)


def _stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


class LazyConsole:
    """A rich `Console` made on first use, so that a command that prints nothing through rich never imports it.
    Off a terminal, `print` writes a line of plain text (style tags aside) itself: what rich would write."""

    def __init__(self, make: Callable[[], Console], *, stdout: bool) -> None:
        self._make = make
        self._stdout = stdout
        self._console: Console | None = None

    @property
    def console(self) -> Console:
        if self._console is None:
            self._console = self._make()
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console, name)

    def print(self, *objects: Any, **options: Any) -> None:
        line = plain_line(objects, options) if self._stdout and _plain_stdout() else None
        if line is None:
            self.console.print(*objects, **options)
        else:
            sys.stdout.write(line + "\n")


def dim(text: str) -> str:
    """`text` dimmed, its own brackets escaped (a note may quote a chat template's "[/INST]")."""
    from rich.markup import escape

    return f"[dim]{escape(text)}[/dim]"


console = cast("Console", LazyConsole(_stdout_console, stdout=True))
err_console = cast("Console", LazyConsole(_stderr_console, stdout=False))


def real_console(console_: Any) -> Console:
    """The rich `Console` behind `console_` (a `LazyConsole` or a `Console`), for rich code that checks its type."""
    return console_.console if isinstance(console_, LazyConsole) else console_


def progress_bar(*columns: Any, **options: Any) -> Any:
    """A rich `Progress` on stderr, cleared when done; off a terminal nothing (a live bar leaves a blank line)."""
    from rich.progress import Progress

    console_ = real_console(options.pop("console", err_console))
    options.setdefault("transient", True)
    return Progress(*columns, console=console_, disable=not console_.is_terminal, **options)


ProgressCallback = Callable[[int, int, str], None]


@contextlib.contextmanager
def progress_callback(
    description: str, *, enabled: bool = True, counted: bool = False, label_as_description: bool = True
) -> Iterator[ProgressCallback | None]:
    """A transient progress bar on stderr and the `on_progress(done, total, label)` callback that moves it (None when
    not `enabled`); `counted`: done/total and time; the label replaces `description` if `label_as_description`."""
    if not enabled:
        yield None
        return
    with progress_bar(*counted_columns() if counted else ()) as bar:
        task = bar.add_task(description, total=None)

        def on_progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, **({"description": label} if label_as_description else {}))

        yield on_progress


def counted_columns() -> tuple[Any, ...]:
    """Progress columns: description, bar, done/total, time elapsed."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    return TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()


def visible(text: object) -> str:
    """`text` on one line, every control character shown as its Python escape (`\\x00`, `\\x1b`, `\\n`): nothing
    it holds is printed invisibly, moves the cursor or starts a blank line. Surrounding whitespace is dropped."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in str(text).strip())


def echo_error(message: object) -> None:
    """Print `message` as one `error: ...` line on stderr (control characters made visible; `blame_config`)."""
    typer.echo(f"error: {visible(blame_config(str(message)))}", err=True)


def _show_tunecost_warnings(previous: Callable[..., Any]) -> Callable[..., Any]:
    """A `warnings.showwarning` that prints a `TunecostWarning` as one `warning:` line on stderr and leaves every
    other warning to `previous`."""

    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if issubclass(category, TunecostWarning):
            typer.echo(f"warning: {visible(message)}", err=True)
        else:
            previous(message, category, filename, lineno, file, line)

    return show


def cli_errors(func: F) -> F:
    """Turn a `TunecostError` (and a missing file) into one line on stderr and exit code 2, and a
    `TunecostWarning` into one `warning:` line."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            check_numbers(kwargs)
            with warnings.catch_warnings():
                warnings.simplefilter("always", TunecostWarning)
                warnings.showwarning = _show_tunecost_warnings(warnings.showwarning)
                return func(*args, **kwargs)
        except TunecostError as exc:
            echo_error(exc)
            raise typer.Exit(code=2) from None
        except FileNotFoundError as exc:
            echo_error(f"file not found: {exc.filename or exc}")
            raise typer.Exit(code=2) from None
        except UnicodeDecodeError as exc:  # a binary or non-UTF-8 file where text was expected
            echo_error(_not_utf8(exc, kwargs))
            raise typer.Exit(code=2) from None
        except RecursionError:  # json nested deeper than Python's stack, in a reader without its own check
            typer.echo("error: an input file is nested too deeply to read (JSON arrays or objects)", err=True)
            raise typer.Exit(code=2) from None
        except OSError as exc:  # a folder where a file belongs, an existing file where a folder belongs, ...
            where = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p)
            echo_error(f"{exc.strerror or exc}{': ' + where if where else ''}")
            raise typer.Exit(code=2) from None
        except KeyboardInterrupt:
            typer.echo("interrupted: finished results are kept; rerun the same command to resume", err=True)
            raise typer.Exit(code=130) from None

    return wrapper  # type: ignore[return-value]


def check_numbers(kwargs: dict[str, Any]) -> None:
    """Every number a command receives from the command line is finite, and every whole number is below
    `MAX_INT_OPTION`; else a `TunecostError` naming the option."""
    for name, value in kwargs.items():
        option = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise TunecostError(f"{option} must be a finite number, got {value!r}")
        if isinstance(value, int) and abs(value) > MAX_INT_OPTION:
            raise TunecostError(f"{option} is too large: {value} (at most {MAX_INT_OPTION})")


def _not_utf8(exc: UnicodeDecodeError, kwargs: dict[str, Any]) -> str:
    """The message for a file that is not UTF-8; names the file when one path argument is a file."""
    files = [str(v) for v in kwargs.values() if isinstance(v, Path) and v.is_file()]
    which = f"{files[0]!r}" if len(files) == 1 else "an input file"
    return f"{which} is not UTF-8 text ({exc.reason} at byte {exc.start}); check the file given"


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return obj.item()
    return obj


def print_json(obj: Any) -> None:
    """Print `obj` (dataclasses, lists, dicts) as JSON on stdout, nothing else."""
    sys.stdout.write(json.dumps(_jsonable(obj), indent=2) + "\n")


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], caption: str | None = None) -> None:
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    plain = plain_table(title, columns, cells, caption) if _plain_stdout() else None
    if plain is not None:
        sys.stdout.write(plain)
        return
    from rich.table import Table

    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    for i, col in enumerate(columns):  # the first column (a name) is never cut inside a word
        table.add_column(col, overflow="fold", no_wrap=i == 0)
    for row in cells:
        table.add_row(*row)
    console.print(table)


def _plain_stdout() -> bool:
    """Whether `console` writes to stdout with no styles, at `PIPE_WIDTH`, in UTF-8: not a terminal, and none of
    the variables that make rich treat it as one."""
    encoding = (getattr(sys.stdout, "encoding", None) or "utf-8").lower()
    forced = os.environ.get("FORCE_COLOR") or os.environ.get("TTY_COMPATIBLE") == "1"
    return not sys.stdout.isatty() and not forced and encoding.startswith("utf")


_RICH_SYNTAX = re.compile(r"\[|:\S*?:")  # markup, or an emoji code


def _is_plain(text: str) -> bool:
    return text.isascii() and text.isprintable() and text == text.strip() and not _RICH_SYNTAX.search(text)


_STYLE_TAG = re.compile(r"\[/?(?:bold|dim)\]")


def plain_line(objects: Sequence[Any], options: Mapping[str, Any]) -> str | None:
    """What `console.print(*objects, **options)` writes off a terminal, less its newline, where that is one line of
    plain text once `[bold]` and `[dim]` tags are dropped; else None."""
    if len(objects) != 1 or not isinstance(objects[0], str) or options.keys() - {"highlight"}:
        return None
    opened: list[str] = []
    for tag in _STYLE_TAG.findall(objects[0]):
        if not tag.startswith("[/"):
            opened.append(tag[1:])
        elif tag[2:] in opened:  # a closing tag closes the latest of its name
            del opened[len(opened) - 1 - opened[::-1].index(tag[2:])]
        else:  # rich refuses a tag closed before it opened
            return None
    line = _STYLE_TAG.sub("", objects[0])
    return line if _is_plain(line) else None


def plain_table(
    title: str | None, columns: Sequence[str], rows: Sequence[Sequence[str]], caption: str | None
) -> str | None:
    """`print_table`'s output as rich draws it off a terminal (box HEAVY_HEAD, no styles, nothing wrapped), in a
    fraction of rich's time; None where rich would draw more than plain text (markup, emoji codes, non-ASCII or
    padded text, a row of another length, a table wider than `PIPE_WIDTH`)."""
    texts = [title or "", caption or "", *columns, *(cell for row in rows for cell in row)]
    if not columns or any(len(row) != len(columns) for row in rows) or not all(map(_is_plain, texts)):
        return None
    widths = [max([len(col), *(len(row[i]) for row in rows)]) for i, col in enumerate(columns)]
    if sum(widths) + 3 * len(widths) + 1 > PIPE_WIDTH:
        return None

    def rule(left: str, line: str, middle: str, right: str) -> str:
        return left + middle.join(line * (w + 2) for w in widths) + right

    def cells(row: Sequence[str], bar: str) -> str:
        return bar + bar.join(f" {cell.ljust(w)} " for cell, w in zip(row, widths, strict=True)) + bar

    lines = [title] if title else []
    lines += [rule("┏", "━", "┳", "┓"), cells(columns, "┃"), rule("┡", "━", "╇", "┩")]
    lines += [cells(row, "│") for row in rows]
    lines += [rule("└", "─", "┴", "┘")]
    lines += [caption] if caption else []
    return "\n".join(lines) + "\n"


def split_list(value: str | None, cast: Callable[[str], Any] = str, what: str = "value") -> list[Any]:
    """Parse a comma-separated option ("1,2,4") into a list, with a clear error on a bad item; a value with no
    item at all (",") is an error too (None, an option not given, is the empty list)."""
    if value is None:
        return []
    out = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            out.append(cast(item))
        except ValueError:
            raise TunecostError(f"bad {what} {item!r} in {value!r}") from None
    if not out:
        raise TunecostError(f"no {what} in {value!r}")
    return out


def checked_host_cpu(value: str | None) -> str | None:
    """A --host-cpu value as the host CPU catalog names it; an unknown CPU is one error line naming the option."""
    if value is None:
        return None
    from tunecost.catalog.host_cpus import resolve_host_cpu

    try:
        return resolve_host_cpu(value).name
    except TunecostError as exc:
        raise TunecostError(f"--host-cpu: {exc}") from None


def stack_behaviour(
    stack: str | None,
    *,
    chunked_loss: bool = False,
    offload_activations: bool = False,
    optimizer_in_backward: bool = False,
    reentrant: bool | None = None,
    fused_adamw: bool | None = None,
) -> Any:
    """The `StackBehaviour` of the stack options: --chunked-loss and --offload-activations (torchtune's, or under
    --stack hf-peft TRL's), --optimizer-in-backward (torchtune's), --reentrant/--non-reentrant (use_reentrant of
    torch.utils.checkpoint) and --fused-adamw/--no-fused-adamw (None: the stack's own AdamW)."""
    import dataclasses

    from tunecost.simulate.behaviour import ADAMW_FOREACH, ADAMW_FUSED

    behaviour = _stack_behaviour(stack, chunked_loss, offload_activations, optimizer_in_backward, reentrant)
    impl = {True: ADAMW_FUSED, False: ADAMW_FOREACH, None: behaviour.adamw_impl}[fused_adamw]
    return dataclasses.replace(behaviour, adamw_impl=impl)


def _stack_behaviour(
    stack: str | None,
    chunked_loss: bool,
    offload_activations: bool,
    optimizer_in_backward: bool,
    reentrant: bool | None,
) -> Any:
    from tunecost.simulate.behaviour import LOSS_TRANSFORMERS_5, LOSS_TRL_CHUNKED, StackBehaviour, torchtune_behaviour

    own = STACK_SPECS.get(stack or "")
    if own and own.hf_trainer and (chunked_loss or offload_activations) and not optimizer_in_backward:  # TRL's
        code = LOSS_TRL_CHUNKED if chunked_loss else LOSS_TRANSFORMERS_5
        return StackBehaviour(loss_code=code, activation_offload=offload_activations, reentrant_checkpointing=reentrant)
    flags = (
        ("--chunked-loss", chunked_loss),
        ("--offload-activations", offload_activations),
        ("--optimizer-in-backward", optimizer_in_backward),
    )
    named = [flag for flag, on in flags if on]
    if named and not (own and own.torchtune_recipes):
        verb = "need" if len(named) > 1 else "needs"
        given = f"not {stack!r}" if stack else "none given"
        if optimizer_in_backward:
            raise TunecostError(f"{' and '.join(named)} {verb} --stack torchtune (torchtune recipe options; {given})")
        raise TunecostError(f"{' and '.join(named)} {verb} --stack torchtune or hf-peft (torchtune's, TRL's; {given})")
    if named:
        return torchtune_behaviour(
            chunked_loss=chunked_loss,
            activation_offload=offload_activations,
            optimizer_in_backward=optimizer_in_backward,
            reentrant_checkpointing=reentrant,
        )
    return StackBehaviour(reentrant_checkpointing=reentrant)


def format_hours(hours: float | None) -> str:
    """Hours with two significant figures below 10 h (0.14, 2.5), one decimal above."""
    if hours is None:
        return "-"
    return f"{hours:.2g}" if hours < 10 else f"{hours:.1f}"
