"""The report in a real browser: headless Chromium (Debian's `chromium`, `make browser-deps`) opens it without
console messages and takes a screenshot that shows the page.

Console criterion: the report has no scripts, so a clean page logs nothing to its console. Chromium writes every
console message of the page to stderr (`--enable-logging=stderr`) as `...:CONSOLE:<line>] "message", source: ...`
(older versions `CONSOLE(<line>)]`), and Chromium 156 logs console.error at the same INFO level as console.log, so
the level cannot be told apart: ANY console line, or an `Uncaught` exception, fails the test. With `--v=1` it also
logs each file:// load; the only file the page may load is itself (a figure must be embedded, not referenced).
A control page with a script error and a missing image proves both checks see what they look for on this
Chromium, so a change of its log format cannot make the test pass vacuously.

Without chromium: skipped with the reason locally; a failure when the environment variable CI is set.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks" / "screenshot_report.py"


def _load_screenshot_module():
    spec = importlib.util.spec_from_file_location("tunecost_screenshot_report", BENCHMARKS)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


shot_mod = _load_screenshot_module()


def chromium_or_skip() -> str:
    """The chromium path; without one, fail in CI (never a silent skip there) and skip with the reason locally."""
    path = shot_mod.find_chromium()
    if path is None:
        reason = "chromium is not installed: run `make browser-deps` (Debian package `chromium`)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; the browser test must run in CI")
        pytest.skip(reason)
    return path


@pytest.fixture(scope="module")
def chromium() -> str:
    return chromium_or_skip()


def test_without_chromium_ci_fails_and_local_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shot_mod, "find_chromium", lambda: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="make browser-deps"):
        chromium_or_skip()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="make browser-deps"):
        chromium_or_skip()


def _assert_not_blank(png_path: Path, width: int, height: int) -> None:
    from PIL import Image

    assert png_path.is_file(), "chromium wrote no screenshot"
    assert png_path.stat().st_size > 20_000, f"screenshot is only {png_path.stat().st_size} bytes"
    with Image.open(png_path) as img:
        assert img.size == (width, height)
        rgb = img.convert("RGB")
        colours = rgb.getcolors(maxcolors=1_000_000) or []
        assert len(colours) > 200, f"screenshot has {len(colours)} colours: a blank or single-colour page"
        white = sum(n for n, c in colours if min(c) >= 250)
        assert white < 0.97 * width * height, "screenshot is almost all white: nothing rendered"


def test_report_opens_without_console_messages(chromium: str, full_report, tmp_path: Path) -> None:
    html_path = full_report.html_path
    width, height = 1280, 4000
    shot = shot_mod.screenshot(html_path, tmp_path / "report.png", chromium=chromium, width=width, height=height)
    assert shot.returncode == 0, shot.stderr[-3000:]
    assert shot.console_lines == (), "\n".join(shot.console_lines)
    assert shot.file_loads == (html_path.resolve().as_uri(),), shot.file_loads
    _assert_not_blank(shot.png_path, width, height)


def test_control_page_errors_are_detected(chromium: str, tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><body><p>control</p><img src='missing.png'>"
        "<script>console.error('control error'); not_defined();</script></body></html>",
        encoding="utf-8",
    )
    shot = shot_mod.screenshot(page, tmp_path / "bad.png", chromium=chromium, width=400, height=300)
    joined = "\n".join(shot.console_lines)
    assert "control error" in joined
    assert "Uncaught ReferenceError: not_defined is not defined" in joined
    assert (tmp_path / "missing.png").as_uri() in shot.file_loads
