"""The tests mirror the code: every module that defines a function (or a method) has its own test
file, named after it, where its tests live. A module `pkg/sub/mod.py` of the library is tested in
tests/sub/test_mod.py (the package's name left out), `topologies/mod.py` in
tests/topologies/test_mod.py, `experiments/pages/page/mod.py` in
tests/experiments/pages/page/test_mod.py; a package's own `__init__.py` in test_<package>.py beside
its modules' files, `__main__.py` in test_main.py, a private `_mod.py` in test_mod.py. Modules of
classes without methods (errors.py) or of names only (re-exports) need none."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gossip_powersgd", "topologies", "experiments")


def expected_test_file(module: Path) -> Optional[Path]:
    """Where `module` (relative to the repository) is tested; None for the library's top module."""
    parts = list(module.with_suffix("").parts)
    if parts[0] == "gossip_powersgd":
        parts = parts[1:]
    *folders, stem = parts
    if stem == "__init__":
        if not folders:
            return None  # gossip_powersgd/__init__.py: `run` and the re-exports (test_runner.py)
        stem = folders[-1]
    stem = "main" if stem == "__main__" else stem.lstrip("_")
    return Path("tests", *folders, f"test_{stem}.py")


def defines_a_function(path: Path) -> bool:
    tree = ast.parse(path.read_text(), str(path))
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(tree))


def untested_modules() -> List[str]:
    missing = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = path.relative_to(ROOT)
            expected = expected_test_file(module)
            if defines_a_function(path) and expected and not (ROOT / expected).is_file():
                missing.append(f"{module}: no {expected}")
    return missing


def test_the_rule_names_each_kind_of_module_its_file():
    cases = {
        "gossip_powersgd/comm/base.py": "tests/comm/test_base.py",
        "gossip_powersgd/utils.py": "tests/test_utils.py",
        "gossip_powersgd/faults/__init__.py": "tests/faults/test_faults.py",
        "topologies/__main__.py": "tests/topologies/test_main.py",
        "experiments/pages/_markdown.py": "tests/experiments/pages/test_markdown.py",
        "experiments/pages/churn/__init__.py": "tests/experiments/pages/churn/test_churn.py",
        "experiments/engine/rows.py": "tests/experiments/engine/test_rows.py",
    }
    for module, expected in cases.items():
        assert expected_test_file(Path(module)) == Path(expected), module
    assert expected_test_file(Path("gossip_powersgd/__init__.py")) is None


def test_every_module_with_a_function_has_its_test_file():
    missing = untested_modules()
    assert not missing, "modules without their test file:\n" + "\n".join(missing)
