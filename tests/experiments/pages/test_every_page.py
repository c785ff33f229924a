"""Every page of `python -m experiments` (the registry, so a new page is covered by adding it): its
--quick sweep through the CLI makes every planned row and a page that --render-only draws again
byte for byte, and writes nothing into the checkout but where --out sends it (the default --out
is git-ignored and used from a fresh clone: tests/project/test_clean_tree.py); its committed page
(experiments/results) is what its committed rows (experiments/results/PAGE.jsonl) render to, byte
for byte, for every text file it writes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from experiments.engine import RowFile, checked_plan, render
from experiments.engine.cli import main
from experiments.pages import pages
from tests.experiments.pages.conftest import checkout_state


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


def _without_drawing(monkeypatch) -> None:
    """Figures are made but not drawn (their files empty): what these tests compare is the text a
    page's rows render to (TEXT), and drawing is most of a render's time (consensus: 51 figures,
    about 17 of its 18 s). The quick sweep itself draws every page's figures."""
    import matplotlib.figure

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *args, **kwargs: None)


@pytest.mark.parametrize("name", QUICK)
def test_quick_sweep_makes_every_row_and_renders_again_identically(quick_sweep, name, monkeypatch):
    sweep = quick_sweep(name)
    out, before = sweep.out, sweep.before
    assert sweep.code == 0
    # every output under --out: nothing written into the checkout beside it
    assert sweep.after == before
    page = pages()[name]
    records = RowFile(out / f"{name}.jsonl").read()
    planned = checked_plan(page, True, {k: r.row for k, r in records.items()})
    assert list(records) == [run.key for run in planned]
    assert all(r.quick for r in records.values())
    written = {p: data for p, data in sweep.written.items() if p.suffix in TEXT}
    assert any(p.suffix == ".md" for p in written)
    assert all("FAILED" not in data.decode() for p, data in written.items() if p.suffix == ".md")
    _without_drawing(monkeypatch)
    assert main([name, "--render-only", "--out", str(out)], pages) == 0
    assert {p: p.read_bytes() for p in written} == written
    assert checkout_state() == before


@pytest.mark.parametrize("name", PAGES)
def test_committed_rows_render_the_committed_page_byte_for_byte(tmp_path, name, monkeypatch):
    _without_drawing(monkeypatch)
    rows = RESULTS / f"{name}.jsonl"
    assert rows.is_file(), f"page {name} has no committed rows ({rows})"
    shutil.copy(rows, tmp_path / rows.name)
    written = render(pages()[name], tmp_path)
    texts = [p for p in written if p.suffix in TEXT]
    assert texts, f"page {name} wrote no text file"
    for path in texts:
        committed = RESULTS / path.relative_to(tmp_path)
        assert path.read_bytes() == committed.read_bytes(), f"{committed} differs from its rows"
