"""Assemble the report: one self-contained HTML page (figures embedded as PNG data URIs, no scripts, no external
resources) plus each figure as PNG and SVG files."""

from __future__ import annotations

import base64
import html
import io
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tunecost import __version__
from tunecost.errors import TunecostError
from tunecost.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from tunecost.outputs import check_output_path
from tunecost.report.figures import SECTIONS, FigureResult
from tunecost.report.run_dir import RunRecords, load_run
from tunecost.report.summary import summary_html

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}
h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.caption{color:#444;font-size:.92em}.omitted{color:#777;font-style:italic}
img{max-width:100%;height:auto;border:1px solid #eee}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0;display:block;overflow-x:auto}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right;white-space:nowrap}th{background:#f4f4f4}
details{margin:.6em 0}summary{cursor:pointer;color:#335}
.meta{font-size:.85em;color:#555}code{background:#f4f4f4;padding:0 3px}
"""


@dataclass(frozen=True, kw_only=True)
class ReportResult:
    html_path: Path
    figure_paths: tuple[Path, ...]
    sections_shown: tuple[str, ...]
    sections_omitted: dict[str, str]
    records_skipped: tuple[str, ...] = ()  # files or rows not read, with the reason (`RunRecords.skipped`)


def _figure_bytes(fig: object, fmt: str) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, bbox_inches="tight")  # type: ignore[attr-defined]
    return buf.getvalue()


def _meta_html(records: RunRecords) -> str:
    items = []
    for name, meta in records.meta.items():
        if not isinstance(meta, dict):
            continue
        device = meta.get("device")
        versions = meta.get("versions")
        parts = []
        if isinstance(device, dict):  # e.g. {"kind": "cpu", "name": ...}: "kind cpu, name ..." not a dict repr
            device = ", ".join(f"{k} {v}" for k, v in device.items() if v is not None)
        if device:
            parts.append(f"device: {html.escape(str(device))}")
        if isinstance(versions, dict) and versions:
            parts.append("versions: " + html.escape(", ".join(f"{k} {v}" for k, v in versions.items())))
        if meta.get("git_revision"):
            parts.append(f"git {html.escape(str(meta['git_revision'])[:12])}")
        if meta.get("created"):
            parts.append(f"created {html.escape(str(meta['created']))}")
        if parts:
            items.append(f"<li><b>{html.escape(name)}</b>: {'; '.join(parts)}</li>")
    return "<ul class='meta'>" + "".join(items) + "</ul>" if items else ""


GENERATOR = "<meta name='generator' content='tunecost report'>"
MANIFEST = ".tunecost-report.json"


def build_report(run_dir: str | Path, out: str | Path | None = None, *, force: bool = False) -> ReportResult:
    """Write `report.html` (default: in the run directory) and `figures/*.png|svg` beside it.

    The page and its figures are built in memory first, so a failure writes nothing. The report owns its
    `figures/` folder: a folder holding files it did not write is refused (without `force`; with it, those named
    as a figure it writes are replaced and the others kept), its own figures of sections no longer shown are
    removed, and an existing HTML file that no tunecost report wrote is replaced only with `force`.
    """
    import matplotlib.pyplot as plt

    records = load_run(run_dir)
    html_path = Path(out) if out is not None else records.run_dir / "report.html"
    fig_dir = html_path.parent / "figures"
    _check_report_target(records, html_path, fig_dir, force=force)
    body: list[str] = []
    shown: list[str] = []
    omitted: dict[str, str] = {}
    figures: dict[str, bytes] = {}
    for section in SECTIONS:
        try:
            result = section.build(records)
        except (KeyError, ValueError, TypeError, AttributeError, IndexError, ArithmeticError, RecursionError) as exc:
            # a record set we cannot read: omit, never crash
            result = f"records could not be read ({type(exc).__name__}: {exc})"
        if isinstance(result, str):
            omitted[section.key] = result
            body.append(f"<h2>{html.escape(section.title)}</h2><p class='omitted'>Omitted: {html.escape(result)}</p>")
            continue
        shown.append(section.key)
        body.append(f"<h2 id='{section.key}'>{html.escape(section.title)}</h2>")
        body.append(_figure_html(section.key, result, figures))
        if result.figure is not None:
            plt.close(result.figure)  # type: ignore[arg-type]
    skipped = "".join(f"<li>{html.escape(s)}</li>" for s in records.skipped)
    page = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"{GENERATOR}<title>tunecost report: {html.escape(str(records.run_dir))}</title><style>{_CSS}</style>"
        f"</head><body><h1>tunecost report</h1>{summary_html(records)}"
        f"<p class='meta'>Run directory <code>{html.escape(str(records.run_dir))}</code>; "
        f"tunecost {__version__}. Figures follow Xia et al., IISWC 2024.</p>{_meta_html(records)}"
        + (f"<p class='omitted'>Records not read:</p><ul class='meta'>{skipped}</ul>" if skipped else "")
        + "".join(body)
        + "</body></html>"
    )
    figure_paths = _write_figures(fig_dir, figures)
    atomic_write_text(html_path, page)
    return ReportResult(
        html_path=html_path,
        figure_paths=tuple(figure_paths),
        sections_shown=tuple(shown),
        sections_omitted=omitted,
        records_skipped=tuple(records.skipped),
    )


def _own_figures(fig_dir: Path) -> set[str]:
    """The file names a previous report wrote into `fig_dir` (from its manifest)."""
    try:
        names = json.loads((fig_dir / MANIFEST).read_text(encoding="utf-8")).get("files", [])
    except (OSError, ValueError, AttributeError, RecursionError):
        return set()
    return {n for n in names if isinstance(n, str) and "/" not in n and n not in ("", ".", "..")}


def _check_report_target(records: RunRecords, html_path: Path, fig_dir: Path, *, force: bool) -> None:
    run = records.run_dir
    inputs = [*run.glob("*.jsonl"), *run.glob("*.json"), *run.glob("*/*.jsonl"), *run.glob("*/meta.json")]
    check_output_path(html_path, force=True, inputs=inputs)
    if html_path.exists() and not force:
        try:
            with open(html_path, "rb") as fh:
                head = fh.read(4096)
        except OSError:
            head = b""
        if GENERATOR.encode() not in head:
            raise TunecostError(
                f"--out {str(html_path)!r} exists and is not a tunecost report; pass --force to replace it"
            )
    if fig_dir.exists() and not fig_dir.is_dir():
        raise TunecostError(f"{str(fig_dir)!r} is a file; the report writes its figures into that folder")
    if fig_dir.is_dir() and not force:
        own = _own_figures(fig_dir) | {MANIFEST}
        foreign = sorted(p.name for p in fig_dir.iterdir() if p.name not in own)
        if foreign:
            raise TunecostError(
                f"{str(fig_dir)!r} holds files this report did not write ({', '.join(map(repr, foreign[:3]))}"
                f"{', ...' if len(foreign) > 3 else ''}); write the report elsewhere with --out, or pass --force "
                "(it then replaces those named as a figure it writes, e.g. throughput.png, and keeps the others)"
            )


def _write_figures(fig_dir: Path, figures: dict[str, bytes]) -> list[Path]:
    """Write the figures, remove this report's own stale ones, and record what it wrote."""
    stale = _own_figures(fig_dir) - set(figures) if fig_dir.is_dir() else set()
    paths = [atomic_write_bytes(fig_dir / name, data) for name, data in figures.items()]
    for name in stale:
        (fig_dir / name).unlink(missing_ok=True)
    if figures or fig_dir.is_dir():
        atomic_write_json(fig_dir / MANIFEST, {"files": sorted(figures)})
    return paths


def _format_number(x: float) -> str:
    """4 significant digits, without scientific notation from 1000 up (a variance of 24519 reads 24519)."""
    return f"{x:.4g}" if abs(x) < 1000 else f"{x:.0f}"


def _figure_html(key: str, result: FigureResult, figures: dict[str, bytes]) -> str:
    parts = []
    if result.figure is not None:
        png = _figure_bytes(result.figure, "png")
        figures[f"{key}.png"] = png
        figures[f"{key}.svg"] = _figure_bytes(result.figure, "svg")
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<img alt='{html.escape(key)}' src='data:image/png;base64,{data}'>")
    parts.append(f"<p class='caption'>{html.escape(result.caption)}</p>")
    if result.table is not None and not result.table.empty:
        # rename_axis: a pivot's column name would otherwise add a spurious header cell and an empty column
        table = _without_empty_columns(result.table.rename_axis(columns=None))
        text = table.to_html(index=False, border=0, na_rep="-", float_format=_format_number)
        if len(table) > LONG_TABLE_ROWS:  # a long raw table: collapsed, the figure and caption say the gist
            text = f"<details><summary>Table: {len(table)} rows</summary>{text}</details>"
        parts.append(text)
    return "".join(parts)


LONG_TABLE_ROWS = 8


def _without_empty_columns(table: pd.DataFrame) -> pd.DataFrame:
    """`table` without columns that hold nothing but missing values or the word none."""
    empty = [c for c in table.columns if table[c].map(_is_empty).all()]
    return table.drop(columns=empty)


def _is_empty(value: object) -> bool:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "")):
        return True
    return isinstance(value, float) and value != value
