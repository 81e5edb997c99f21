"""One module per command group. Each module defines `register(app: typer.Typer) -> None`;
`tunecost.cli.main.COMMANDS` names the module of each command, imported only when that command runs."""
