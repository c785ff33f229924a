"""Every parameter named `comm` is annotated with the `Comm` protocol and every one named
`topology` with a topologies type (`Topology`, or `AnyTopology` where a schedule or a directed
graph may come) or with `str` where it is a spec, in gossip_powersgd, topologies and experiments
(the mpi4py communicators that comm/mpi.py wraps are `MPIComm`).

The walk reads the source (ast) rather than importing the modules: it sees nested functions too,
and modules whose optional dependencies (mpi4py, wandb, ...) are not installed."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gossip_powersgd", "topologies", "experiments")

#: The parameter names checked, and the words one of which their annotation must hold.
EXPECTED = {"comm": ("Comm",), "topology": ("Topology", "str")}


def _parameters():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    args = node.args
                    for arg in args.posonlyargs + args.args + args.kwonlyargs:
                        if arg.arg in EXPECTED:
                            where = f"{path.relative_to(ROOT)}:{node.lineno} {node.name}({arg.arg})"
                            yield where, arg


def test_the_walk_finds_the_parameters():
    # A walk that finds nothing would pass vacuously: the package has dozens of each.
    names = [arg.arg for _, arg in _parameters()]
    assert names.count("comm") > 50 and names.count("topology") > 20


def test_comm_and_topology_parameters_are_typed():
    problems = []
    for where, arg in _parameters():
        if arg.annotation is None:
            problems.append(f"{where}: no annotation")
        elif not any(word in ast.unparse(arg.annotation) for word in EXPECTED[arg.arg]):
            problems.append(f"{where}: annotated {ast.unparse(arg.annotation)!r}")
    assert not problems, "\n".join(problems)
