"""README.md: its accuracy table is what benchmarks/accuracy_doc.py renders; its setup commands exist."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"


def _accuracy_doc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("accuracy_doc", ROOT / "benchmarks" / "accuracy_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def _readme_block(text: str, start: str, end: str) -> str:
    assert text.count(start) == 1 and text.count(end) == 1
    return text[text.index(start) : text.index(end) + len(end)]


def test_block_is_replaced_between_the_markers_only() -> None:
    doc = _accuracy_doc()
    text = f"intro\n{doc.README_START}\nold table\n{doc.README_END}\nend\n"
    assert doc.replace_readme_block(text, "NEW") == "intro\nNEW\nend\n"
    with pytest.raises(ValueError, match="accuracy:start"):
        doc.replace_readme_block("no markers here", "NEW")


def test_readme_names_the_two_make_targets_and_keeps_the_startup_slot() -> None:
    text, makefile = README.read_text(encoding="utf-8"), (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("demo", "test"):
        assert f"make {target}" in text
        assert re.search(rf"^{target}:", makefile, re.MULTILINE)
    assert "<!-- startup -->" in text


@pytest.mark.long
def test_readme_accuracy_table_is_what_the_benchmark_renders_from_the_shipped_corpus() -> None:
    doc = _accuracy_doc()
    block = _readme_block(README.read_text(encoding="utf-8"), doc.README_START, doc.README_END)
    assert block == doc.readme_block(doc.validated(None))


def _console_examples(text: str) -> list[tuple[list[str], list[str]]]:
    """(the command's arguments, the output lines shown) of each ```console block: `$ tunecost ...` with its `\\`
    continuations, then the lines until the fence, less `...` and the table rules (their widths follow the rows)."""
    examples = []
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        lines = block.splitlines()
        command = lines.pop(0).removeprefix("$ ")
        while command.endswith("\\"):
            command = command[:-1] + " " + lines.pop(0).strip()
        shown = [ln for ln in lines if ln.strip() != "..." and not set(ln.strip()) <= set("┏┓┗┛┡┩└┘━─┳┻╇┴ ")]
        examples.append((shlex.split(command)[1:], shown))
    return examples


@pytest.mark.long
@pytest.mark.parametrize("index", range(3))
def test_each_readme_console_example_prints_what_the_readme_shows(cli_runner, index: int) -> None:
    """The README's first-screen examples are today's output: each line shown is printed (whitespace aside)."""
    from tunecost.cli.main import app

    examples = _console_examples(README.read_text(encoding="utf-8"))
    assert len(examples) == 3
    args, shown = examples[index]
    result = cli_runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    printed = " ".join((result.stdout + result.stderr).split())
    for line in shown:
        assert " ".join(line.split()) in printed, line
