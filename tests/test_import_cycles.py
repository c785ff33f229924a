"""No import circle among the package's modules: a static parse of every module's imports at module
level (inside ``if``/``try`` too, so ``if TYPE_CHECKING:`` imports count: a type-only circle is
still two modules that cannot be understood apart), resolved to the package's own modules, and
the graph's strongly connected components. Imports inside a function run when it is called, after
both modules are loaded, and are the way one layer reaches up lazily; they are not edges here.

`training/config` <-> `training/validation` and `privacy/per_sample` <-> `per_sample_layers` were
the two circles this test was written to keep out."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

PACKAGE = Path(__file__).resolve().parents[1] / "gossip_powersgd"


def module_files(root: Path) -> Dict[str, Path]:
    """{dotted module name: file} of every module under the package directory `root`."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _module_level_imports(body: List[ast.stmt]) -> List[ast.stmt]:
    out: List[ast.stmt] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, ast.If):
            out += _module_level_imports(node.body) + _module_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            out += _module_level_imports(node.body) + _module_level_imports(node.orelse)
            out += _module_level_imports(node.finalbody)
            for handler in node.handlers:
                out += _module_level_imports(handler.body)
    return out


def import_graph(root: Path) -> Dict[str, Set[str]]:
    """{module: the package's modules it imports at module level}."""
    modules = module_files(root)
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in _module_level_imports(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"  # `from pkg import module` imports the module
                if target in modules:
                    edges.add(target)
                elif base in modules:
                    edges.add(base)
        graph[name] = edges - {name}
    return graph


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_the_package_has_no_import_circle():
    graph = import_graph(PACKAGE)
    assert len(graph) > 80  # every module was parsed
    assert graph["gossip_powersgd.training.config"] >= {"gossip_powersgd.training.validation"}
    assert circles(graph) == [], "import circles (module-level or TYPE_CHECKING imports)"


def test_the_parse_finds_a_type_only_circle_and_ignores_a_lazy_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from . import b\n")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub.b import B\n"
    )
    (package / "sub" / "b.py").write_text("from ..a import thing\n")
    (package / "c.py").write_text("import pkg.a\n")
    (package / "d.py").write_text("def f():\n    from .c import x\n")
    (package / "e.py").write_text("from .d import f\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub"] == {"pkg.sub.b"}
    assert graph["pkg.c"] == {"pkg.a"} and graph["pkg.d"] == set()
    assert circles(graph) == [["pkg.a", "pkg.sub.b"]]
    (package / "d.py").write_text("from .e import g\n")  # a module-level circle d <-> e
    assert circles(import_graph(package)) == [["pkg.a", "pkg.sub.b"], ["pkg.d", "pkg.e"]]
