"""The `tunecost` command: discovers every module in `tunecost.cli.commands` and registers it."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys
from typing import Any

import typer
from typer.core import TyperGroup

try:  # typer >= 0.22 carries its own copy of click
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer on the real click
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

from tunecost import __version__
from tunecost.cli import commands
from tunecost.cli.common import echo_error
from tunecost.cli.options import refuse_blank_values


class _OneLineErrors(TyperGroup):
    """The command group, with usage errors (unknown option, bad or missing value) as one `error: ...` line and
    exit code 2, the same as every other user error, instead of a boxed panel. Every text option of every command
    refuses an empty value (`tunecost.cli.options.refuse_blank_values`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        refuse_blank_values(self)

    def main(  # type: ignore[override]
        self, args: Any = None, prog_name: Any = None, complete_var: Any = None, standalone_mode: bool = True, **kw: Any
    ) -> Any:
        forward = {"args": args, "prog_name": prog_name, "complete_var": complete_var, **kw}
        if not standalone_mode:
            return super().main(standalone_mode=False, **forward)
        try:
            result = super().main(standalone_mode=False, **forward)
        except click_exceptions.NoArgsIsHelpError as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click_exceptions.UsageError as exc:
            message = " ".join(_usage_message(exc).split())
            where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            echo_error(f"{message}{where}")
            sys.exit(2)
        except click_exceptions.ClickException as exc:
            echo_error(" ".join(exc.format_message().split()))
            sys.exit(exc.exit_code)
        except typer.Abort:
            typer.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)


def _usage_message(exc: click_exceptions.UsageError) -> str:
    """A bad value as `--OPTION: what is wrong`; every other usage error in click's words."""
    is_bad_value = isinstance(exc, click_exceptions.BadParameter) and not isinstance(
        exc, click_exceptions.MissingParameter
    )
    param = getattr(exc, "param", None)
    if is_bad_value and param is not None:
        name = "/".join(o for o in param.opts if o.startswith("-")) or (param.name or "").upper()
        return f"{name}: {exc.message}"
    return exc.format_message()


app = typer.Typer(
    cls=_OneLineErrors,
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


class _OptionalKernelNoise(logging.Filter):
    """Drops bitsandbytes' warning that an optional CPU kernel package (`kernels`) is not installed: the 4-bit
    path works without it and the user has nothing to do. Every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "kernels-community" not in str(record.msg)


logging.getLogger("bitsandbytes").addFilter(_OptionalKernelNoise())
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_OptionalKernelNoise())


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
