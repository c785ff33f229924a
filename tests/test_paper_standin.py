"""`experiments.paper_standin --quick`: the page's program runs end to end on a tiny setting, and
the figures it writes obey what they must: measured floats per exchange equal the closed form,
every gossip row's bytes follow its rounds, local steps divide exact gossip's traffic by H."""

from __future__ import annotations

import json

import pytest

from experiments import paper_standin, paper_standin_page


@pytest.mark.slow  # ~1 min on the shared 2-core machine: 8 tiny ring:4 runs plus set-up
def test_quick_mode_writes_a_consistent_page(tmp_path):
    paper_standin.main(["--quick", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "paper_standin.json").read_text())
    page = (tmp_path / "paper_standin.md").read_text()
    assert f"python -m experiments.paper_standin --quick --out {tmp_path}" in page
    assert "not CIFAR-10" in page
    (traffic,) = result["traffic"]  # no VGG-16 in the quick mode
    assert traffic["exact_floats"] == traffic["closed_exact"] == traffic["parameters"]
    assert traffic["powergossip_r1_floats"] == traffic["closed_powergossip_r1"]
    rows = {r["label"]: r for r in result["rows"]}
    assert list(rows) == [label for label, _, _ in paper_standin.ROWS]
    exact = rows["exact gossip"]
    steps = exact["steps"]
    assert steps >= 16  # so that H = 16 gossips at least once
    # exact gossip's measured traffic is the summary's formula (model bytes x degree x rounds)
    assert exact["mb_per_peer"] == pytest.approx(exact["exact_mb_formula"], rel=1e-12)
    for h in (4, 16):
        r = rows[f"exact gossip H={h}"]
        assert r["rounds"] == steps // h
        assert r["mb_per_peer"] * steps == pytest.approx(
            exact["mb_per_peer"] * r["rounds"], rel=1e-12
        )
    # rank 1 alternates a P and a Q round: with an even number of rounds it sends the closed form's
    # mean per round
    r1 = rows["PowerGossip r1"]
    assert steps % 2 == 0
    assert exact["mb_per_peer"] / r1["mb_per_peer"] == pytest.approx(traffic["ratio"], rel=1e-12)
    for r in rows.values():
        assert len(r["evals"]) == result["setting"]["epochs"] // result["setting"]["eval_every"]
        assert 0 <= r["acc_avg"] <= 1 and r["consensus_distance"] >= 0
    # the page again from the JSON alone: the same page, plus the sentence naming the re-render
    paper_standin.main(["--render-only", str(tmp_path / "paper_standin.json")])
    again = (tmp_path / "paper_standin.md").read_text()
    assert "re-rendered from its JSON" in again
    assert again.split("## Floats per exchange")[1] == page.split("## Floats per exchange")[1]
    # another seed of some rows, listed next to the main run's by --extra
    seed1 = tmp_path / "seed1"
    rows_arg = "exact gossip;PowerGossip r1, 2 iterations"
    paper_standin.main(["--quick", "--seed", "1", "--rows", rows_arg, "--out", str(seed1)])
    other = json.loads((seed1 / "paper_standin.json").read_text())
    assert [r["label"] for r in other["rows"]] == rows_arg.split(";")
    assert other["setting"]["seed"] == 1
    assert other["rows"][0]["evals"] != rows["exact gossip"]["evals"]  # drawn anew
    json_path = str(tmp_path / "paper_standin.json")
    paper_standin.main(["--render-only", json_path, "--extra", str(seed1 / "paper_standin.json")])
    with_seeds = (tmp_path / "paper_standin.md").read_text()
    assert "## Other seeds" in with_seeds and "--seed 1" in with_seeds
    with pytest.raises(SystemExit, match="unknown label"):
        paper_standin.main(["--quick", "--rows", "exact", "--out", str(seed1)])
    csv_lines = (tmp_path / "paper_standin.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + sum(len(r["evals"]) for r in rows.values())


def _row(label, curve):
    evals = [{"epoch": e, "mb": mb, "acc_avg": acc} for e, (mb, acc) in enumerate(curve, 1)]
    return {"label": label, "algorithm": label, "mb_per_peer": curve[-1][0], "evals": evals}


def test_accuracy_at_equal_bytes_takes_the_last_evaluation_within_the_budget():
    cheap = _row("cheap", [(1.0, 0.2), (2.0, 0.4)])
    dear = _row("dear", [(1.5, 0.3), (3.0, 0.5), (6.0, 0.7)])
    assert paper_standin_page.accuracy_at(dear, 2.0)["acc_avg"] == 0.3
    assert paper_standin_page.accuracy_at(dear, 6.0)["acc_avg"] == 0.7
    assert paper_standin_page.accuracy_at(dear, 1.0) is None  # first evaluation after the budget
    assert paper_standin_page._budgets([dear, cheap]) == [("cheap", 2.0), ("dear", 6.0)]
