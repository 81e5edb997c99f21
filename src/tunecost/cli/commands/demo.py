"""`tunecost demo`: the README's main command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tunecost.cli.common import cli_errors, console, progress_bar
from tunecost.cli.options import opt


@cli_errors
def demo(
    out: Annotated[Path, opt("--out", "Run directory for records and the report.")] = Path("runs/demo"),
) -> None:
    """Run the whole pipeline on the embedded default (no GPU, no downloads) and write the report."""
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    from tunecost.demo import run_demo

    with progress_bar(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("starting", total=1)

        def on_stage(stage) -> None:
            progress.update(task, description=stage.description, completed=0, total=1)
            if not console.is_terminal:  # no live bar off a terminal: one line per stage shows it is moving
                console.print(f"stage: {stage.description}", highlight=False)

        def on_progress(done: int, total: int, label: str) -> None:
            progress.update(task, description=label, completed=done, total=total)

        seconds = run_demo(out, on_stage=on_stage, on_progress=on_progress)
    console.print(f"demo finished in {sum(seconds.values()):.0f} s; records in {out}/")
    report = out / "report.html"
    if report.exists():
        console.print(f"report: [bold]{report.resolve()}[/bold]")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
