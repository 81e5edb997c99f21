"""Assemble the report: one self-contained HTML page (figures embedded as PNG data URIs, no scripts, no external
resources) plus each figure as PNG and SVG files."""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass
from pathlib import Path

from tunecost import __version__
from tunecost.io import atomic_write_bytes, atomic_write_text
from tunecost.report.figures import SECTIONS, FigureResult
from tunecost.report.records import RunRecords, load_run

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}
h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.caption{color:#444;font-size:.92em}.omitted{color:#777;font-style:italic}
img{max-width:100%;height:auto;border:1px solid #eee}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0;display:block;overflow-x:auto}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right;white-space:nowrap}th{background:#f4f4f4}
.meta{font-size:.85em;color:#555}code{background:#f4f4f4;padding:0 3px}
"""


@dataclass(frozen=True, kw_only=True)
class ReportResult:
    html_path: Path
    figure_paths: tuple[Path, ...]
    sections_shown: tuple[str, ...]
    sections_omitted: dict[str, str]


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
        if versions:
            parts.append("versions: " + html.escape(", ".join(f"{k} {v}" for k, v in versions.items())))
        if meta.get("git_revision"):
            parts.append(f"git {html.escape(str(meta['git_revision'])[:12])}")
        if meta.get("created"):
            parts.append(f"created {html.escape(str(meta['created']))}")
        if parts:
            items.append(f"<li><b>{html.escape(name)}</b>: {'; '.join(parts)}</li>")
    return "<ul class='meta'>" + "".join(items) + "</ul>" if items else ""


def build_report(run_dir: str | Path, out: str | Path | None = None) -> ReportResult:
    """Write `report.html` (default: in the run directory) and `figures/*.png|svg` beside it."""
    import matplotlib.pyplot as plt

    records = load_run(run_dir)
    html_path = Path(out) if out is not None else records.run_dir / "report.html"
    fig_dir = html_path.parent / "figures"
    body: list[str] = []
    shown: list[str] = []
    omitted: dict[str, str] = {}
    figure_paths: list[Path] = []
    for section in SECTIONS:
        try:
            result = section.build(records)
        except (KeyError, ValueError, TypeError, AttributeError, IndexError, ArithmeticError) as exc:
            # a record set we cannot read: omit, never crash
            result = f"records could not be read ({type(exc).__name__}: {exc})"
        if isinstance(result, str):
            omitted[section.key] = result
            body.append(f"<h2>{html.escape(section.title)}</h2><p class='omitted'>Omitted: {html.escape(result)}</p>")
            continue
        shown.append(section.key)
        body.append(f"<h2 id='{section.key}'>{html.escape(section.title)}</h2>")
        body.append(_figure_html(section.key, result, fig_dir, figure_paths))
        if result.figure is not None:
            plt.close(result.figure)  # type: ignore[arg-type]
    skipped = "".join(f"<li>{html.escape(s)}</li>" for s in records.skipped)
    page = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>tunecost report: {html.escape(str(records.run_dir))}</title><style>{_CSS}</style></head><body>"
        f"<h1>tunecost report</h1><p class='meta'>Run directory <code>{html.escape(str(records.run_dir))}</code>; "
        f"tunecost {__version__}. Figures follow Xia et al., IISWC 2024.</p>{_meta_html(records)}"
        + (f"<p class='omitted'>Records not read:</p><ul class='meta'>{skipped}</ul>" if skipped else "")
        + "".join(body)
        + "</body></html>"
    )
    atomic_write_text(html_path, page)
    return ReportResult(
        html_path=html_path, figure_paths=tuple(figure_paths), sections_shown=tuple(shown), sections_omitted=omitted
    )


def _format_number(x: float) -> str:
    """4 significant digits, without scientific notation from 1000 up (a variance of 24519 reads 24519)."""
    return f"{x:.4g}" if abs(x) < 1000 else f"{x:.0f}"


def _figure_html(key: str, result: FigureResult, fig_dir: Path, figure_paths: list[Path]) -> str:
    parts = []
    if result.figure is not None:
        png = _figure_bytes(result.figure, "png")
        svg = _figure_bytes(result.figure, "svg")
        figure_paths.append(atomic_write_bytes(fig_dir / f"{key}.png", png))
        figure_paths.append(atomic_write_bytes(fig_dir / f"{key}.svg", svg))
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<img alt='{html.escape(key)}' src='data:image/png;base64,{data}'>")
    parts.append(f"<p class='caption'>{html.escape(result.caption)}</p>")
    if result.table is not None and not result.table.empty:
        # rename_axis: a pivot's column name would otherwise add a spurious header cell and an empty column
        parts.append(
            result.table.rename_axis(columns=None).to_html(
                index=False, border=0, na_rep="-", float_format=_format_number
            )
        )
    return "".join(parts)
