"""A page's --quick sweep, run once per test session and read by every test that checks it:
test_every_page.py's check of each page, and a page's own tests (churn/, bench_scale/).

Under pytest-xdist the workers share it through the session's common temporary folder, under a
file lock (pytest-xdist's own recipe for a session fixture run once): the first to ask runs the
sweep there, the others wait for it. Each reader gets its own copy of the folder the sweep left."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Dict

import pytest
from filelock import FileLock

from experiments.engine.cli import main
from experiments.pages import pages


ROOT = Path(__file__).resolve().parents[3]


def checkout_state() -> dict:
    """What `git status` shows of the checkout (untracked files one by one, ignored ones not), with
    each listed file's digest: a file that was changed already and is written again shows too."""
    listed = subprocess.run(
        ["git", "--no-optional-locks", "status", "--porcelain", "-z", "--untracked-files=all"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    state, entries = {}, iter(filter(None, listed))
    for entry in entries:
        code, path = entry[:2].decode(), ROOT / os.fsdecode(entry[3:])
        source = os.fsdecode(next(entries)) if code[0] in "RC" else None  # a rename's, a copy's
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        state[path] = (code, source, digest)
    return state


def _stored(state: dict) -> list:
    return [[str(path), *entry] for path, entry in state.items()]


def _loaded(stored: list) -> dict:
    return {Path(path): tuple(entry) for path, *entry in stored}


@dataclasses.dataclass(frozen=True)
class QuickSweep:
    out: Path  #: this reader's copy of the sweep's --out folder
    code: int  #: the CLI's exit status
    before: dict  #: checkout_state() just before the sweep
    after: dict  #: and just after it
    written: Dict[Path, bytes]  #: every file under `out` as the sweep left it


@pytest.fixture(scope="session")
def quick_sweep(tmp_path_factory) -> Callable[[str], QuickSweep]:
    """`python -m experiments NAME --quick --out DIR` through the CLI's main, once per page in the
    session (the same call every reader made on its own before); a QuickSweep per call."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's

    def sweep(name: str) -> QuickSweep:
        swept, record = shared / f"quick-sweep-{name}", shared / f"quick-sweep-{name}.json"
        with FileLock(str(shared / f"quick-sweep-{name}.lock")):
            if not record.exists():
                before = checkout_state()
                code = main([name, "--quick", "--out", str(swept)], pages)
                after = checkout_state()
                stored = {"code": code, "before": _stored(before), "after": _stored(after)}
                record.write_text(json.dumps(stored))
        stored = json.loads(record.read_text())
        out = tmp_path_factory.mktemp(f"quick-{name}")
        shutil.copytree(swept, out, dirs_exist_ok=True)
        written = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
        before, after = _loaded(stored["before"]), _loaded(stored["after"])
        return QuickSweep(out, stored["code"], before, after, written)

    return sweep
