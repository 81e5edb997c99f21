"""Source lines of `src/tunecost` at a base revision and in the working tree, per package, split into code,
docstrings, comments and blank lines; `--modules` lists the modules the two have in common side by side (a module
git sees moved, under its new path).

    python benchmarks/source_lines.py --base 277e432 [--modules]
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = "src/tunecost"
KINDS = ("code", "doc", "comment", "blank")


def line_kinds(text: str) -> Counter:
    """How many lines of `text` (Python source) are code, docstring, comment-only or blank."""
    lines = text.splitlines()
    docs: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docs.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    comments = {
        tok.start[0]
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT and lines[tok.start[0] - 1].lstrip().startswith("#")
    }
    out: Counter = Counter()
    for number, line in enumerate(lines, 1):
        kind = "blank" if not line.strip() else "doc" if number in docs else "comment" if number in comments else "code"
        out[kind] += 1
    return out


def sources(rev: str | None) -> dict[str, str]:
    """Module path -> text, at `rev` (git) or in the working tree (None)."""
    if rev is None:
        return {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / SRC).rglob("*.py"))}
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, SRC], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    show = ["git", "show"]
    return {
        n: subprocess.run([*show, f"{rev}:{n}"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
        for n in names
        if n.endswith(".py")
    }


def renames(rev: str) -> dict[str, str]:
    """Module path at `rev` -> its path in the working tree, for the modules git sees moved since `rev`."""
    out = subprocess.run(
        ["git", "diff", "--name-status", "-M", rev, "--", SRC], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    rows = (line.split("\t") for line in out.splitlines())
    return {row[1]: row[2] for row in rows if row[0].startswith("R") and row[1].endswith(".py")}


def package(path: str) -> str:
    parts = Path(path).relative_to(SRC).parts
    return parts[0] if len(parts) > 1 else "(top)"


def totals(texts: dict[str, str], key) -> dict[str, Counter]:
    out: dict[str, Counter] = {}
    for path, text in texts.items():
        out.setdefault(key(path), Counter()).update(line_kinds(text))
    return out


def print_side_by_side(title: str, before: dict[str, Counter], after: dict[str, Counter]) -> None:
    print(f"{title:<52} {'base code':>9} {'now code':>9} {'base all':>9} {'now all':>9} {'code %':>7}")
    for name in sorted(set(before) | set(after)):
        b, a = before.get(name, Counter()), after.get(name, Counter())
        change = f"{100 * (a['code'] - b['code']) / b['code']:+.0f}" if b["code"] else "new"
        print(f"{name:<52} {b['code']:>9} {a['code']:>9} {b.total():>9} {a.total():>9} {change:>7}")
    b_all, a_all = sum(before.values(), Counter()), sum(after.values(), Counter())
    print(f"{'total':<52} {b_all['code']:>9} {a_all['code']:>9} {b_all.total():>9} {a_all.total():>9}", end=" ")
    print(f"{100 * (a_all['code'] - b_all['code']) / max(b_all['code'], 1):+7.0f}")
    print("  " + ", ".join(f"{k}: {b_all[k]} -> {a_all[k]}" for k in KINDS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="277e432", help="git revision to compare with")
    parser.add_argument("--modules", action="store_true", help="also the modules both have, one by one")
    args = parser.parse_args()
    before, after = sources(args.base), sources(None)
    print_side_by_side(f"package (base {args.base})", totals(before, package), totals(after, package))
    if args.modules:  # a module git sees moved is compared under its new path
        moved = renames(args.base)
        before = {moved.get(p, p): t for p, t in before.items()}
        common = set(before) & set(after)
        print()
        name = lambda p: str(Path(p).relative_to(SRC))  # noqa: E731
        print_side_by_side(
            f"module in both ({len(moved)} moved since the base)",
            totals({p: t for p, t in before.items() if p in common}, name),
            totals({p: t for p, t in after.items() if p in common}, name),
        )


if __name__ == "__main__":
    main()
