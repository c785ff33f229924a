"""The experiment programs stay readable: no file under experiments/ over 450 lines and no function
over 80 (a page is a plan, a measurement and a renderer; anything longer is split, or lives in the
library where users can call it)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, List

ROOT = Path(__file__).resolve().parents[2] / "experiments"
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 80


def long_functions(path: Path, limit: int, base: Path) -> Iterator[str]:
    """Each function of `path` longer than `limit` lines, from its `def` to its last line."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                yield f"{path.relative_to(base)}:{node.lineno} {node.name} ({length} lines)"


def long_files(root: Path, limit: int) -> List[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > limit:
            out.append(f"{path.relative_to(root.parent)} ({lines} lines)")
    return out


def test_no_experiment_file_over_450_lines():
    assert not long_files(ROOT, MAX_FILE_LINES)


def test_no_experiment_function_over_80_lines():
    paths = sorted(ROOT.rglob("*.py"))
    assert not [f for p in paths for f in long_functions(p, MAX_FUNCTION_LINES, ROOT.parent)]


def test_the_measures_find_what_is_over_and_only_that(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    source = package / "m.py"
    # f: its def line and 80 statements (81 lines); g: 2 lines; a nested function counts on its own
    source.write_text(
        "def f():\n" + "    x = 1\n" * 80 + "\n\ndef g():\n    def h():\n        pass\n"
    )
    assert list(long_functions(source, 80, tmp_path)) == ["pkg/m.py:1 f (81 lines)"]
    assert list(long_functions(source, 81, tmp_path)) == []
    assert long_files(package, 85) == ["pkg/m.py (86 lines)"]
    assert long_files(package, 86) == []
