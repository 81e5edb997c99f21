"""Screenshot a tunecost report in headless Chromium (Debian's `chromium`; `make browser-deps` installs it).

    python benchmarks/screenshot_report.py RUN_DIR OUT.png [--height 4000]

Builds RUN_DIR/report.html if it is missing, opens it from file:// in headless Chromium, writes OUT.png and
prints any console messages (the report has no scripts, so a clean page logs none). Exit status 1 when the page
logged a console message or loaded a file other than itself. tests/report/test_browser.py uses the same
functions, so what a human sees here is what the test checks.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHROMIUM_CANDIDATES = ("chromium", "/usr/bin/chromium")
TIMEOUT_SECONDS = 90

# Chromium logs every console message of a page (log, warning, error alike in Chromium 156:
# `INFO:CONSOLE:3] "msg", source: URL (3)`; older versions: `INFO:CONSOLE(3)] "msg", source: ...`).
_CONSOLE = re.compile(r":CONSOLE[:(]|Uncaught ")
# With --v=1 every file:// load is logged; a report that references a file (a missing figure) shows up here.
_FILE_LOAD = re.compile(r"FileURLLoader::Start: (file://\S+)")


@dataclass(frozen=True, kw_only=True)
class Screenshot:
    png_path: Path
    returncode: int
    console_lines: tuple[str, ...]  # console messages and uncaught exceptions from the page
    file_loads: tuple[str, ...]  # every file:// URL the browser loaded (the report itself, and nothing else)
    stderr: str


def find_chromium() -> str | None:
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium_command(
    chromium: str, url: str, png_path: Path, user_data_dir: Path, *, width: int = 1280, height: int = 4000
) -> list[str]:
    """Headless, sandbox-free (containers run as root), no GPU, no network chatter, a fresh profile, logging to
    stderr at verbosity 1 (console messages and file loads are logged there)."""
    return [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={user_data_dir}",
        "--enable-logging=stderr",
        "--v=1",
        f"--screenshot={png_path}",
        f"--window-size={width},{height}",
        "--hide-scrollbars",
        url,
    ]


def screenshot(
    html_path: Path,
    png_path: Path,
    *,
    chromium: str | None = None,
    width: int = 1280,
    height: int = 4000,
    timeout_s: float = TIMEOUT_SECONDS,
) -> Screenshot:
    """Open `html_path` in headless Chromium and save a `width` x `height` screenshot to `png_path`."""
    chromium = chromium or find_chromium()
    if chromium is None:
        raise FileNotFoundError("chromium not found; install it with `make browser-deps`")
    png_path = Path(png_path).resolve()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    png_path.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="tunecost-chromium-") as profile:
        cmd = chromium_command(
            chromium, Path(html_path).resolve().as_uri(), png_path, Path(profile), width=width, height=height
        )
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, check=False, env={**os.environ, "LANG": "C.UTF-8"}
        )
    lines = done.stderr.splitlines()
    return Screenshot(
        png_path=png_path,
        returncode=done.returncode,
        console_lines=tuple(line for line in lines if _CONSOLE.search(line)),
        file_loads=tuple(m.group(1) for line in lines if (m := _FILE_LOAD.search(line))),
        stderr=done.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out_png", type=Path)
    parser.add_argument("--height", type=int, default=4000, help="window height in pixels (the shot's height)")
    parser.add_argument("--width", type=int, default=1280)
    args = parser.parse_args(argv)
    html_path = args.run_dir / "report.html"
    if not html_path.is_file():
        from tunecost.errors import TunecostError
        from tunecost.report.html import build_report

        try:
            html_path = build_report(args.run_dir).html_path
        except TunecostError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    try:
        shot = screenshot(html_path, args.out_png, width=args.width, height=args.height)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if shot.returncode != 0 or not shot.png_path.is_file():
        print(
            f"error: chromium exited with {shot.returncode} and no screenshot; its log:\n{shot.stderr[-3000:]}",
            file=sys.stderr,
        )
        return 1
    others = [u for u in shot.file_loads if u != html_path.resolve().as_uri()]
    for line in shot.console_lines:
        print(f"console: {line}")
    for url in others:
        print(f"loaded another file: {url}")
    print(f"screenshot: {shot.png_path} ({shot.png_path.stat().st_size} bytes) of {html_path.resolve()}")
    return 1 if shot.console_lines or others else 0


if __name__ == "__main__":
    sys.exit(main())
