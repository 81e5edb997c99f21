"""One module per command group. Each module defines `register(app: typer.Typer) -> None`;
`tunecost.cli.main` discovers and registers every module here, so adding a command never
edits a shared file."""
