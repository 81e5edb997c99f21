"""`tunecost --help` lists the commands in panels, in the order a newcomer meets them."""

from __future__ import annotations

import importlib
import pkgutil
import re

import typer

from tunecost.cli import commands
from tunecost.cli.main import COMMANDS, app


def _panels(help_text: str) -> dict[str, list[str]]:
    """Each panel's title and its commands, in the order `--help` prints them (Options excluded)."""
    panels: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in help_text.splitlines():
        if title := re.match(r"╭─ (.+?) ─", line):
            current = None if title[1] == "Options" else panels.setdefault(title[1], [])
        elif current is not None and (name := re.match(r"│ (\S+)", line)):
            current.append(name[1])
    return panels


def test_help_lists_the_commands_in_a_newcomers_order(cli_runner) -> None:
    result = cli_runner.invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    panels = _panels(result.stdout)
    assert list(panels) == ["Estimate", "Measure", "Catalogs", "More"]
    assert panels["Estimate"] == ["estimate", "plan", "memory", "validate"]
    assert panels["Measure"][:2] == ["profile", "calibrate-gpu"]
    assert panels["Catalogs"][:3] == ["gpus", "models", "prices"]
    listed = [name for names in panels.values() for name in names]
    assert sorted(listed) == sorted(COMMANDS)  # each command once


def test_the_table_names_every_command_the_modules_register() -> None:
    """`COMMANDS` (what `--help` lists and how a command finds its module) is what the modules define."""
    registered: dict[str, str] = {}
    for info in pkgutil.iter_modules(commands.__path__):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        if hasattr(module, "register"):
            sub = typer.Typer()
            module.register(sub)
            group = typer.main.get_group(sub)
            registered |= dict.fromkeys(group.commands, info.name)
    assert registered == {name: module for name, (module, _) in COMMANDS.items()}
