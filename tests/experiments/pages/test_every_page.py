"""Every page of `python -m experiments` (the registry, so a new page is covered by adding it): its
--quick sweep through the CLI makes every planned row and a page that --render-only draws again
byte for byte, and its committed page (experiments/results) is what its committed rows
(experiments/results/PAGE.jsonl) render to, byte for byte, for every text file it writes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from experiments.engine import RowFile, checked_plan, render
from experiments.engine.cli import main
from experiments.pages import pages

RESULTS = Path(__file__).resolve().parents[3] / "experiments" / "results"
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


@pytest.mark.parametrize("name", QUICK)
def test_quick_sweep_makes_every_row_and_renders_again_identically(tmp_path, name):
    assert main([name, "--quick", "--out", str(tmp_path)], pages) == 0
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
