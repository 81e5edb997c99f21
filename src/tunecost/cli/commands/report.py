"""`tunecost report RUN_DIR`: the paper's figures from a run's records, as one self-contained HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tunecost.cli.common import cli_errors, console, dim, print_json
from tunecost.cli.options import JsonOut, opt

FORCE_HELP = (
    "Replace an existing HTML file tunecost did not write; write into a figures/ folder that holds other files "
    "(those named as a figure the report writes are replaced, the others kept)."
)


@cli_errors
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by tunecost (demo, profile, ...).")],
    out: Annotated[Path | None, opt("--out", "HTML file to write (default: RUN_DIR/report.html).")] = None,
    force: Annotated[bool, opt("--force", FORCE_HELP)] = False,
    json_out: JsonOut = False,
) -> None:
    """Write report.html (figures embedded; works offline) and figures/*.png|svg."""
    from tunecost.report.html import build_report

    result = build_report(run_dir, out, force=force)
    if json_out:
        print_json(result)
        return
    for key, why in result.sections_omitted.items():
        console.print(dim(f"section {key} omitted: {why}"))
    console.print(
        f"report: [bold]{result.html_path.resolve()}[/bold] ({len(result.sections_shown)} sections, "
        f"{len(result.figure_paths)} figure files in {result.html_path.parent / 'figures'})"
    )


def register(app: typer.Typer) -> None:
    app.command("report")(report)
