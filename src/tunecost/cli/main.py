"""The `tunecost` command: discovers every module in `tunecost.cli.commands` and registers it."""

from __future__ import annotations

import importlib
import pkgutil

import typer

from tunecost import __version__
from tunecost.cli import commands

app = typer.Typer(
    name="tunecost",
    help="What will fine-tuning an LLM cost, on which GPU, and where does the time go? "
    "(Xia et al., IISWC 2024, as a tool.)",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"tunecost {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Show the version."
    ),
) -> None:
    """tunecost: fine-tuning cost estimates and MoE fine-tuning profiles."""


def _register_all() -> None:
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_all()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
