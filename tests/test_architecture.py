"""The import contract of docs/architecture.md: layers, no cycles between packages, no private names across them.

Every import counts, at module top or inside a function (those import torch-heavy code late, but still depend on it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tunecost"

# Lowest first. A unit is a subpackage of tunecost or a top-level module (`tunecost` is the package's __init__).
# A unit imports units of its own layer or of lower ones, never a higher one, and the units never form a cycle.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("tunecost", "errors", "limits", "units", "io", "csvfile", "outputs"),
    ("catalog", "models", "results"),
    ("workload",),
    ("simulate", "moe", "evaluate"),
    ("distributed",),
    ("profile", "train"),
    ("estimate",),
    ("validate",),
    ("report",),
    ("demo",),
    ("cli",),
)
LAYER_OF = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    line: int
    target: str  # the imported tunecost module (or the module a name is taken from)
    name: str | None  # the imported name, for `from target import name`

    def __str__(self) -> str:
        what = f"from {self.target} import {self.name}" if self.name else f"import {self.target}"
        return f"{self.module}:{self.line}: {what}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts).removesuffix(".__init__")


MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")[: len(module.split(".")) - (node.level - (1 if is_package else 0))]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str) -> Iterator[Import]:
    """Every tunecost import of `module`, wherever it stands in the file."""
    path = MODULES[module]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tunecost":
                    yield Import(module, node.lineno, alias.name, None)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(node, module, path.name == "__init__.py")
            if target.split(".")[0] != "tunecost":
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                if submodule in MODULES:
                    yield Import(module, node.lineno, submodule, None)
                else:
                    yield Import(module, node.lineno, target, alias.name)


ALL_IMPORTS = [imp for module in MODULES for imp in imports(module)]
CROSS = [imp for imp in ALL_IMPORTS if unit(imp.module) != unit(imp.target)]


def test_every_unit_has_a_layer() -> None:
    missing = sorted({unit(m) for m in MODULES} - set(LAYER_OF))
    assert not missing, f"units with no layer in LAYERS (tests/test_architecture.py, docs/architecture.md): {missing}"


def test_no_import_from_a_lower_layer_to_a_higher_one() -> None:
    upward = [
        f"{imp} ({unit(imp.module)} is below {unit(imp.target)})"
        for imp in CROSS
        if LAYER_OF.get(unit(imp.module), -1) < LAYER_OF.get(unit(imp.target), -1)
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_cycle_between_packages() -> None:
    graph: dict[str, set[str]] = {}
    for imp in CROSS:
        graph.setdefault(unit(imp.module), set()).add(unit(imp.target))
    messages = []
    for component in _cycles(graph):
        closing = [str(imp) for imp in CROSS if {unit(imp.module), unit(imp.target)} <= set(component)]
        messages.append(f"cycle between {', '.join(component)}:\n  " + "\n  ".join(closing))
    assert not messages, "\n".join(messages)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_private_name_imported_across_packages() -> None:
    private = [
        str(imp)
        for imp in CROSS
        if (imp.name is not None and _is_private(imp.name)) or any(_is_private(p) for p in imp.target.split("."))
    ]
    assert not private, "private names imported across packages:\n" + "\n".join(private)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from tunecost.estimate import setups\n", ("tunecost.estimate.setups", None)),
        ("from ..catalog.gpus import GPU\n", ("tunecost.catalog.gpus", "GPU")),
        ("def f():\n    import tunecost.simulate.step\n", ("tunecost.simulate.step", None)),
    ],
)
def test_the_contract_sees_every_import_form(tmp_path: Path, monkeypatch, source: str, expected) -> None:
    """Absolute, relative and in-function imports are all found and resolved to the module they load."""
    path = SRC / "workload" / "job.py"
    fake = tmp_path / "job.py"
    fake.write_text(source)
    monkeypatch.setitem(MODULES, "tunecost.workload.job", fake)
    assert path.exists()
    found = [(imp.target, imp.name) for imp in imports("tunecost.workload.job")]
    assert found == [expected]


def test_the_contract_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


MAX_FUNCTION_LINES, MAX_MODULE_LINES, MAX_MODULE_DOCSTRING_LINES = 80, 400, 8


def test_functions_modules_and_module_docstrings_stay_short() -> None:
    too_long = []
    for name, path in MODULES.items():
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{name}: {lines} lines (at most {MAX_MODULE_LINES})")
        tree = ast.parse(text, str(path))
        docstring = ast.get_docstring(tree, clean=False) or ""
        if len(docstring.splitlines()) > MAX_MODULE_DOCSTRING_LINES:
            too_long.append(f"{name}: module docstring of {len(docstring.splitlines())} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {length} lines (at most {MAX_FUNCTION_LINES})")
    assert not too_long, "\n".join(too_long)


def test_no_options_passed_by_name_through_locals() -> None:
    """Options reach the library as explicit arguments: no `locals()` (nor `vars()` of the frame) in the package."""
    calls = [
        f"{name}:{node.lineno}"
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("locals", "vars")
        and not node.args
    ]
    assert not calls, "locals()/vars() in:\n" + "\n".join(calls)
