"""An earlier commit's PowerGossip imported beside this tree's (bench_sim's `before` and `previous`,
bench_gossip's `before`): its `powergossip.py` and the modules split from it (`PARTS`), with
``helpers=True`` every `algorithms/` module they import, read with `git show` and imported under
private names (`gossip_powersgd.algorithms._powergossip_<commit>`, ...) pointing at one another."""

from __future__ import annotations

import functools
import graphlib
import importlib.util
import linecache
import re
import subprocess
import sys
import threading
from typing import Dict, Optional

from experiments.engine import ROOT

PACKAGE = "gossip_powersgd.algorithms"
FOLDER = "gossip_powersgd/algorithms"
#: The modules split from powergossip.py, loaded from the commit where it has them.
PARTS = "layout buffers schedule state plan".split()
PARTS = tuple(f"powergossip_{part}" for part in PARTS)

# `from .name import ...` and `from . import name [as alias]` (one name), anywhere in a line.
_FROM_MODULE = re.compile(r"from \.(\w+) import")
_FROM_PACKAGE = re.compile(r"from \. import (\w+)(?: as (\w+))?")
_LOCK = threading.Lock()


def git_show(commit: str, path: str) -> Optional[str]:
    """The file `path` at `commit` (None when git or the file is missing)."""
    command = ["git", "show", f"{commit}:{path}"]
    try:
        return subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def _relative_imports(text: str) -> set:
    return set(_FROM_MODULE.findall(text)) | {m[0] for m in _FROM_PACKAGE.findall(text)}


def _rewire(text: str, loaded: set, suffix: str) -> str:
    """`text` with its relative imports of the `loaded` modules pointed at their private names."""

    def module(match):
        name = match.group(1)
        return f"from ._{name}_{suffix} import" if name in loaded else match.group(0)

    def package(match):
        name, alias = match.group(1), match.group(2)
        if name not in loaded:
            return match.group(0)
        return f"from . import _{name}_{suffix} as {alias or name}"

    return _FROM_PACKAGE.sub(package, _FROM_MODULE.sub(module, text))


def _suffix(commit: str, helpers: bool) -> str:
    """The private names' suffix: the commit, and `_tree` where the helpers are this tree's, so
    that one process can hold both versions of a commit (neither replaces the other's modules)."""
    return re.sub(r"\W", "_", commit) + ("" if helpers else "_tree")


@functools.lru_cache(maxsize=None)
def _load(commit: str, helpers: bool) -> Optional[type]:
    source = git_show(commit, f"{FOLDER}/powergossip.py")
    if source is None:
        return None
    sources: Dict[str, str] = {"powergossip": source}
    pending = list(PARTS) + (sorted(_relative_imports(source)) if helpers else [])
    while pending:  # a name that is no module of the commit (a subpackage) stays this tree's
        name = pending.pop()
        text = None if name in sources else git_show(commit, f"{FOLDER}/{name}.py")
        if text is not None:
            sources[name] = text
            pending += sorted(_relative_imports(text)) if helpers else []
    # Each module after the loaded ones it imports (no circles: tests/project/test_imports.py).
    graph = {
        name: sorted(_relative_imports(sources[name]) & set(sources)) for name in sorted(sources)
    }
    order = graphlib.TopologicalSorter(graph).static_order()
    suffix = _suffix(commit, helpers)
    for name in order:  # from memory: no file is written; tracebacks read the lines from linecache
        text = _rewire(sources[name], set(sources), suffix)
        origin = f"<{commit}:{FOLDER}/{name}.py>"
        linecache.cache[origin] = (len(text), None, text.splitlines(True), origin)
        qualified = f"{PACKAGE}._{name}_{suffix}"
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader(qualified, None))
        module.__file__ = origin
        sys.modules[qualified] = module
        exec(compile(text, origin, "exec"), module.__dict__)
    return sys.modules[f"{PACKAGE}._powergossip_{suffix}"].PowerGossip


def previous_powergossip(commit: str, helpers: bool = False) -> Optional[type]:
    """`PowerGossip` as it was at `commit`, imported beside this tree's (once per process and
    commit, thread-safe); None without git or when the commit has no `powergossip.py`."""
    with _LOCK:
        return _load(commit, helpers)


def loaded_modules(commit: str, helpers: bool = True) -> list:
    """The `algorithms/` modules loaded from `commit` (with its own helper modules, or with this
    tree's for ``helpers=False``) in this process (their names there)."""
    prefix, suffix = f"{PACKAGE}._", "_" + _suffix(commit, helpers)
    return sorted(
        name[len(prefix) : -len(suffix)]
        for name in list(sys.modules)
        if name.startswith(prefix) and name.endswith(suffix)
    )
