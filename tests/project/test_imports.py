"""Import structure: no import circles among the modules of gossip_powersgd, topologies and
experiments, counting function-level imports too (a circle hidden in a function is still a
circle) and ``if TYPE_CHECKING:`` ones (a type-only circle is still two modules that cannot be
read apart: `training/config` <-> `training/validation` and `privacy/per_sample` <->
`per_sample_layers` were two); and no module under gossip_powersgd/training imports
gossip_powersgd.privacy (the layers run topologies -> comm -> algorithms -> training -> privacy /
cli / experiments)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gossip_powersgd", "topologies", "experiments")


def _modules() -> Dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: Set[str]) -> Set[str]:
    """The known modules `name` imports, anywhere in its body. `from package import name` counts
    as importing the submodule package.name when it is one, else the package; importing a.b.c
    also imports the packages a.b and a (their __init__ runs first), except those above `name`
    itself (being imported already)."""
    is_package = path.name == "__init__.py"
    found = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):  # `if TYPE_CHECKING:` imports count: types are dependencies
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:  # import a.b.c imports a.b.c's nearest module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
            package = target.rpartition(".")[0]
            while package and not (name == package or name.startswith(package + ".")):
                found.add(package)
                package = package.rpartition(".")[0]
    return found


def import_graph() -> Dict[str, Set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    circles = _cycles(import_graph())
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_the_analysis_finds_a_circle(tmp_path):
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    # A function-level import counts, and so does a TYPE_CHECKING one; importing p.q.r runs p.q.
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import p.x\n"
        "def f():\n    from p.q import r\n"
    )
    known = {"m", "p", "p.q", "p.q.r", "p.x"}
    assert _imports("m", source, known) == {"p.q.r", "p.q", "p", "p.x"}
    # a type-only circle, the kind training/config <-> training/validation was, is one
    config, validation = tmp_path / "config.py", tmp_path / "validation.py"
    config.write_text("from .validation import validate\n")
    validation.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .config import Config\n"
    )
    names = {"pkg.config", "pkg.validation"}
    graph = {
        "pkg.config": _imports("pkg.config", config, names),
        "pkg.validation": _imports("pkg.validation", validation, names),
    }
    assert _cycles(graph) == [["pkg.config", "pkg.validation"]]


def test_training_imports_nothing_from_privacy():
    graph = import_graph()
    offenders = sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        if a.startswith("gossip_powersgd.training")
        for b in targets
        if b.startswith("gossip_powersgd.privacy")
    )
    assert not offenders, offenders
