"""Every page of `python -m experiments` (the registry, so a new page is covered by adding it): its
--quick sweep through the CLI makes every planned row and a page that --render-only draws again
byte for byte, and writes nothing into the checkout but where --out sends it (the default --out
is git-ignored and used from a fresh clone: tests/project/test_clean_tree.py); its committed page
(experiments/results) is what its committed rows (experiments/results/PAGE.jsonl) render to, byte
for byte, for every text file it writes."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from experiments.engine import RowFile, checked_plan, render
from experiments.engine.cli import main
from experiments.pages import pages

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "experiments" / "results"
PAGES = sorted(pages())
TEXT = (".md", ".csv", ".json")
#: The pages whose --quick plan starts mpiexec or torchrun, and the markers that says (the conftest
#: fails a test that launches one unmarked; `pytest -m "not mpi"` skips them).
LAUNCHES = {
    "bench_backends": ("mpi", "torchrun"),
    "bench_gossip": ("mpi",),
    "bench_startup": ("mpi", "torchrun"),
    "bandwidth": ("torchrun",),  # on its emulated cluster, where namespaces can be made (root)
}
QUICK = [
    pytest.param(n, marks=[getattr(pytest.mark, m) for m in LAUNCHES.get(n, ())]) for n in PAGES
]


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


@pytest.mark.parametrize("name", QUICK)
def test_quick_sweep_makes_every_row_and_renders_again_identically(tmp_path, name):
    before = checkout_state()
    assert main([name, "--quick", "--out", str(tmp_path)], pages) == 0
    # every output under --out: nothing written into the checkout beside it
    assert checkout_state() == before
    page = pages()[name]
    records = RowFile(tmp_path / f"{name}.jsonl").read()
    planned = checked_plan(page, True, {k: r.row for k, r in records.items()})
    assert list(records) == [run.key for run in planned]
    assert all(r.quick for r in records.values())
    written = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.suffix in TEXT}
    assert any(p.suffix == ".md" for p in written)
    assert all("FAILED" not in data.decode() for p, data in written.items() if p.suffix == ".md")
    assert main([name, "--render-only", "--out", str(tmp_path)], pages) == 0
    assert {p: p.read_bytes() for p in written} == written
    assert checkout_state() == before


@pytest.mark.parametrize("name", PAGES)
def test_committed_rows_render_the_committed_page_byte_for_byte(tmp_path, name):
    rows = RESULTS / f"{name}.jsonl"
    assert rows.is_file(), f"page {name} has no committed rows ({rows})"
    shutil.copy(rows, tmp_path / rows.name)
    written = render(pages()[name], tmp_path)
    texts = [p for p in written if p.suffix in TEXT]
    assert texts, f"page {name} wrote no text file"
    for path in texts:
        committed = RESULTS / path.relative_to(tmp_path)
        assert path.read_bytes() == committed.read_bytes(), f"{committed} differs from its rows"
