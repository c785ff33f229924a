"""experiments/pages/consensus/files.py: the winner map's cells and text, the packed curves and the
table's CSV, read back bit for bit."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from experiments.pages.consensus import files, measure

from tests.experiments.pages.consensus._support import TINY, _instance

torch.set_num_threads(1)


def _result(label, spec, seed, relative, reach=None, gamma=None, swept=False):
    row = {
        "bits_per_peer": 1e5,
        "error": relative * 10,
        "relative": relative,
        "bound": False,
        "at_floor": False,
    }
    cells = {1e5: {"status": "ok", "row": row}}
    return {
        "label": label,
        "spec": spec,
        "seed": seed,
        "gamma": gamma,
        "swept": swept,
        "budgets": cells,
        "reach": {1e-2: reach, 1e-4: None},
    }


def test_winner_map_takes_means_over_seeds_and_flags_disagreeing_seeds():
    results = [
        _result("PowerGossip r1", "pg", s, e, reach=b)
        for s, e, b in ((0, 1.0, 10.0), (1, 1.0, 30.0), (2, 1.0, 20.0))
    ]
    results += [
        _result("Choco sign", f"choco,gamma={g}", 0, e, gamma=g, swept=True, reach=5.0)
        for g, e in ((0.1, 5.0), (1.0, 0.5))
    ]
    results += [
        _result("Choco sign", "choco,gamma=1.0", s, e, gamma=1.0, swept=True, reach=5.0)
        for s, e in ((1, 1.9), (2, 0.5))
    ]
    summary = measure.summarize([r for r in results if r["seed"] == 0], (1e5,))
    record = {"summary": summary, "results": results, "budgets": [1e5]}
    cell = files.winner_cell(record, "budget", 1e5)
    assert cell["winner"] == "Choco sign" and cell["runner_up"] == "PowerGossip r1"
    assert cell["margin"] == pytest.approx(
        1.0 / ((0.5 + 1.9 + 0.5) / 3)
    )  # Choco at gamma=1 on seed 0 too
    assert cell["spread"] == (pytest.approx(1 / 1.9), pytest.approx(2.0)) and cell["disagree"] == [
        1
    ]
    reach = files.winner_cell(record, "reach", 1e-2)
    assert reach["winner"] == "Choco sign" and reach["margin"] == pytest.approx(20.0 / 5.0)
    assert "seed 1" in files.winner_text(cell)
    assert files.powergossip_ratio(record, "reach", 1e-2) == pytest.approx(4.0)


def test_packed_curves_read_back_bit_for_bit(tmp_path):
    row, inst = _instance(
        tmp_path, TINY, ["exact", "powergossip:rank=1,iters=1"], None, (0, 1), (1e4, 3e4)
    )
    assert [r["file"] for r in inst["results"]] == [
        "exact.jsonl",
        "powergossip_rank=1_iters=1.jsonl",
        "seed1/exact.jsonl",
        "seed1/powergossip_rank=1_iters=1.jsonl",
    ]
    packed = files.curves_bytes(inst)
    assert packed == files.curves_bytes(inst)  # no time stamp: the same runs, the same bytes
    lines = [json.loads(x) for x in gzip.decompress(packed).decode().splitlines()]
    # JSON writes a float's shortest repr, which parses back to the same double: equality.
    assert [{k: v for k, v in x.items() if k != "run"} for x in lines] == [
        r["curve"] for r in row["runs"]
    ]
    csv_rows = files.table_csv(inst).splitlines()
    assert len(csv_rows) == 1 + 4 * 2  # every run and seed at every budget
