"""The `tunecost` command: every command, its help panel, and the module that defines it, imported when it runs."""

from __future__ import annotations

import functools
import importlib
import logging
import sys
from collections.abc import Iterator, MutableMapping
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup
from typer.main import get_command_from_info, get_command_name, get_group_from_info, solve_typer_info_defaults

try:  # typer >= 0.22 carries its own copy of click
    from typer._click import exceptions as click_exceptions
    from typer._click.core import Command, Parameter
except ImportError:  # pragma: no cover - older typer on the real click
    from click import exceptions as click_exceptions  # type: ignore[no-redef]
    from click.core import Command, Parameter  # type: ignore[assignment]

from tunecost import __version__
from tunecost.cli import commands
from tunecost.cli.common import echo_error
from tunecost.cli.jobconfig import print_config_notes
from tunecost.cli.options import blame_config, refuse_blank_values

ESTIMATE, MEASURE, CATALOGS, MORE = "Estimate", "Measure", "Catalogs", "More"

# Command -> (module in tunecost.cli.commands that registers it, help panel), in the order a newcomer meets them.
COMMANDS: dict[str, tuple[str, str]] = {
    "estimate": ("estimate", ESTIMATE),
    "plan": ("plan", ESTIMATE),
    "memory": ("memory", ESTIMATE),
    "validate": ("validate", ESTIMATE),
    "profile": ("profile", MEASURE),
    "calibrate-gpu": ("calibrate_gpu", MEASURE),
    "max-batch": ("max_batch", MEASURE),
    "gpu-counters": ("gpu_counters", MEASURE),
    "trainability": ("trainability", MEASURE),
    "eval": ("evaluate", MEASURE),
    "bench": ("bench", MEASURE),
    "gpus": ("catalog", CATALOGS),
    "models": ("catalog", CATALOGS),
    "prices": ("catalog", CATALOGS),
    "data": ("data", CATALOGS),
    "cost": ("cost", MORE),
    "fit": ("cost", MORE),
    "predict": ("predict", MORE),
    "report": ("report", MORE),
    "demo": ("demo", MORE),
}


@functools.cache
def registered(module: str) -> typer.Typer:
    """The commands that `tunecost.cli.commands.<module>` registers, on a Typer of their own."""
    sub = typer.Typer()
    importlib.import_module(f"{commands.__name__}.{module}").register(sub)
    return sub


def build_command(name: str) -> Command:
    """The click command `name`, converted from its module's registration, in its help panel."""
    module, panel = COMMANDS[name]
    sub = registered(module)
    short, markup = app.pretty_exceptions_short, app.rich_markup_mode
    command: Command | None = None
    for info in sub.registered_commands:
        info.cls = _Command if info.cls in (None, TyperCommand) else info.cls
        if (info.name or get_command_name(info.callback.__name__ if info.callback else "")) == name:
            command = get_command_from_info(info, pretty_exceptions_short=short, rich_markup_mode=markup)
    for group in sub.registered_groups:
        for info in group.typer_instance.registered_commands if group.typer_instance else ():
            info.cls = _Command if info.cls in (None, TyperCommand) else info.cls
        if solve_typer_info_defaults(group).name == name:
            command = get_group_from_info(
                group, pretty_exceptions_short=short, rich_markup_mode=markup, suggest_commands=app.suggest_commands
            )
    if command is None:
        raise KeyError(f"{commands.__name__}.{module} registers no command {name!r}")
    command.rich_help_panel = panel  # type: ignore[attr-defined]
    refuse_blank_values(command)
    for param in command.params:
        _read_absent_as_none(param)
    return command


def _read_absent_as_none(param: Parameter) -> None:
    """An optional single value that was not given reads None, as typer reads it, without typer building the
    pydantic validator it would not use (~0.1 s)."""
    process_value = param.process_value

    def process(ctx: Any, value: Any) -> Any:
        if value is None and param.nargs == 1 and not (param.multiple or param.required or param.callback):
            return None
        return process_value(ctx, value)

    param.process_value = process  # type: ignore[method-assign]


class _FalseHelp:
    """`--help` reads False when not given: typer leaves it None, and reading None imports pydantic (~0.1 s)."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.default = False
        return option


class _Command(_FalseHelp, TyperCommand):
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        _refuse_repeats(self, args, ctx)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        print_config_notes(ctx)  # --config's lines, once the flags that replace its values are known
        return super().invoke(ctx)


def _refuse_repeats(command: Command, args: list[str], ctx: Any) -> None:
    """An option that takes one value, given twice, is a usage error naming both (click would keep the last)."""
    takes_one = {
        name: param
        for param in command.params
        if param.param_type_name == "option" and not (param.multiple or getattr(param, "is_flag", False))
        for name in param.opts
    }
    seen: dict[str, list[str]] = {}
    words = iter(args[: args.index("--")] if "--" in args else args)
    for word in words:
        name, equals, inline = word.partition("=")
        param = takes_one.get(name) if name.startswith("-") else None
        if param is not None:
            seen.setdefault(param.opts[0], []).append(inline if equals else next(words, ""))
    for name, values in seen.items():
        if len(values) > 1:
            raise click_exceptions.UsageError(
                f"{name} given {len(values)} times ({', '.join(values)}); it takes one", ctx
            )


class _LazyCommands(MutableMapping[str, Command]):
    """The group's commands by name, in `COMMANDS` order; each is built (its module imported) on first use, so a
    command never imports the modules of the others."""

    def __init__(self) -> None:
        self._built: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in self._built:
            if name not in COMMANDS:
                raise KeyError(name)
            self._built[name] = build_command(name)
        return self._built[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        del self._built[name]

    def __contains__(self, name: object) -> bool:
        return name in COMMANDS or name in self._built

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*COMMANDS, *self._built]))

    def __len__(self) -> int:
        return len(COMMANDS.keys() | self._built.keys())


class _OneLineErrors(_FalseHelp, TyperGroup):
    """The command group, with usage errors (unknown option, bad or missing value) as one `error: ...` line and
    exit code 2, the same as every other user error, instead of a boxed panel. Every text option of every command
    refuses an empty value (`tunecost.cli.options.refuse_blank_values`). Commands are built on first use."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        refuse_blank_values(self)
        self.commands = _LazyCommands()

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
            message = blame_config(" ".join(_usage_message(exc).split()), exc.ctx)
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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
