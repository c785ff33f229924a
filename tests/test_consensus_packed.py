"""The consensus experiment's packed run curves (one curves.jsonl.gz per instance): a run's curve
reads back as the very floats it recorded, and `--report --render-only` rebuilds the committed page
from the committed packed files alone."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from experiments import consensus

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"


def test_packed_curves_read_back_bit_for_bit(tmp_path):
    out = tmp_path / "consensus" / "ring4_matrix20"
    record = consensus.run_experiment(
        "ring:4",
        "matrix:20",
        ["exact", "powergossip:rank=1,iters=1"],
        steps=12,
        out=out,
        plots=False,
        seeds=(0, 1),
        log=lambda *a: None,
    )
    assert not list(out.rglob("*.jsonl"))  # only the packed file
    back = consensus.load_record(out)
    assert [r["file"] for r in back["results"]] == [r["file"] for r in record["results"]]
    for mine, theirs in zip(record["results"], back["results"]):
        # JSON writes a float's shortest repr, which parses back to the same double: equality.
        assert theirs["history"] == [
            {k: row[k] for k in ("step", "bits_per_peer", "error")} for row in mine["history"]
        ]
    assert back["table"] == record["table"]
    # Same runs, same bytes (no time stamp in the gzip header): a re-run leaves git status clean.
    first = (out / consensus.CURVES).read_bytes()
    consensus.write_outputs(back, out, plots=False)
    assert (out / consensus.CURVES).read_bytes() == first


def test_render_only_rebuilds_the_committed_page(tmp_path):
    shutil.copytree(RESULTS / "consensus", tmp_path / "consensus")
    assert not list((RESULTS / "consensus").rglob("*.jsonl"))  # the curves are committed packed
    assert consensus.main(["--report", "--render-only", "--out", str(tmp_path)]) == 0
    committed = (RESULTS / "consensus.md").read_text().splitlines()
    rendered = (tmp_path / "consensus.md").read_text().splitlines()
    # Lines 3-4 name the command that re-rendered it (here with --out tmp) and the commit the page
    # was rendered at; everything after them (every table, number and link) comes from the data.
    assert rendered[:2] == committed[:2] and rendered[4:] == committed[4:]
    assert "commits 5fb8d64 (17 instances), 6ea6890 (8 instances)" in rendered[3]


def test_suite_consensus_quick_writes_only_into_out(tmp_path):
    from experiments import suite

    page = (RESULTS / "consensus.md").read_bytes()
    assert suite.main(["consensus", "--quick", "--out", str(tmp_path)]) == 0
    record = consensus.load_record(tmp_path / "consensus")
    assert record["topology"] == "ring:4" and record["problem"] == "matrix:20"
    assert all(r["steps"] <= 40 for r in record["results"])  # the quick instance, not the report
    assert (RESULTS / "consensus.md").read_bytes() == page  # the committed page untouched
