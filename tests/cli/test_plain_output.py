"""Off a terminal, `print_table` and `console.print` write plain text themselves: byte for byte what rich writes,
or they leave it to rich."""

from __future__ import annotations

import io
import random
import string

import pytest
from rich.console import Console
from rich.table import Table

from tunecost.cli.common import PIPE_WIDTH, plain_line, plain_table
from tunecost.cli.main import app

PLAIN = string.ascii_letters + string.digits + " .,-_/()$%'\"!?*#@=+<>|~`;&^{}"
RICH_SYNTAX = "[]:\\é中\t"  # markup, emoji codes, escapes, wide and control characters


def _rich_console() -> Console:
    """`console` as `tunecost.cli.common` makes it off a terminal, writing to a string."""
    return Console(file=io.StringIO(), width=PIPE_WIDTH, soft_wrap=True, highlight=False)


def _rich(title: str | None, columns: list[str], rows: list[list[str]], caption: str | None) -> str:
    """The table exactly as `print_table` draws it with rich on `console` off a terminal."""
    console = _rich_console()
    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    for i, col in enumerate(columns):
        table.add_column(col, overflow="fold", no_wrap=i == 0)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    return console.file.getvalue()  # type: ignore[attr-defined]


def _random_tables(seed: int, count: int):
    rng = random.Random(seed)
    for k in range(count):
        alphabet = PLAIN + (RICH_SYNTAX if k % 4 == 0 else "")

        def text(longest: int) -> str:
            return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, longest)))  # noqa: B023

        num_columns = rng.randint(1, 6)
        columns = [text(8) for _ in range(num_columns)]
        rows = [[text(12) for _ in range(num_columns)] for _ in range(rng.randint(0, 5))]
        yield rng.choice([None, "", text(30)]), columns, rows, rng.choice([None, "", text(60)])


def test_plain_tables_are_rich_tables_byte_for_byte() -> None:
    drawn = 0
    for title, columns, rows, caption in _random_tables(seed=0, count=600):
        plain = plain_table(title, columns, rows, caption)
        if plain is not None:
            drawn += 1
            assert plain == _rich(title, columns, rows, caption), (title, columns, rows, caption)
    assert drawn > 300  # most tables of plain text are drawn without rich


@pytest.mark.parametrize("text", ["[bold]x[/bold]", ":smile:", "é", "中", "a\tb", " padded", "line\nbreak"])
def test_rich_draws_what_plain_text_cannot(text: str) -> None:
    assert plain_table("t", ["a", "b"], [["x", text]], None) is None
    assert plain_table(text, ["a"], [["x"]], None) is None


def test_a_row_of_another_length_or_no_column_is_left_to_rich() -> None:
    assert plain_table("t", ["a", "b"], [["x"]], None) is None
    assert plain_table("t", [], [], None) is None


@pytest.mark.parametrize("command", ["gpus", "prices"])
def test_catalog_tables_print_as_rich_draws_them(cli_runner, command: str, monkeypatch) -> None:
    import tunecost.cli.common as common

    drawn: list[tuple[str | None, str]] = []

    def record(title, columns, rows, caption):
        plain = plain_table(title, columns, rows, caption)
        drawn.append((plain, _rich(title, list(columns), [list(r) for r in rows], caption)))
        return plain

    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(common, "plain_table", record)
    result = cli_runner.invoke(app, [command])
    assert result.exit_code == 0, result.output
    [(plain, rich)] = drawn
    assert plain is not None and result.stdout == plain == rich


def test_plain_lines_are_what_rich_prints() -> None:
    rng = random.Random(1)
    tags = ["[bold]", "[/bold]", "[dim]", "[/dim]"]
    written = 0
    for k in range(600):
        alphabet = PLAIN + (RICH_SYNTAX if k % 4 == 0 else "")
        parts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10))) for _ in range(rng.randint(1, 4))]
        text = "".join(part + (rng.choice(tags) if rng.random() < 0.5 else "") for part in parts)
        line = plain_line([text], {"highlight": False})
        if line is not None:
            written += 1
            console = _rich_console()
            console.print(text, highlight=False)
            assert line + "\n" == console.file.getvalue(), text  # type: ignore[attr-defined]
    assert written > 200


@pytest.mark.parametrize(
    ("objects", "options"), [(["a", "b"], {}), ([1], {}), (["a"], {"style": "bold"}), (["a"], {"end": ""})]
)
def test_rich_prints_what_is_not_one_plain_string(objects: list, options: dict) -> None:
    assert plain_line(objects, options) is None
