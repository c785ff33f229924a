"""experiments/pages/paper_standin/__init__.py on its --quick setting: the measured floats per
exchange equal the closed form, every gossip row's bytes follow its rounds, local steps divide exact
gossip's traffic by H, another seed draws everything anew, and the page drawn from these rows lists
the other seed beside seed 0."""

from __future__ import annotations

import dataclasses
import json

import pytest

from experiments.engine import RowFile, Rows, Run
from experiments.pages import paper_standin


LABELS = ("exact gossip", "PowerGossip r1", "exact gossip H=4", "exact gossip H=16")


@pytest.mark.slow  # one tiny ring:4 run (seed 1) and the session's quick sweep
def test_quick_rows_obey_the_closed_forms_and_draw_the_page(quick_sweep):
    """The quick sweep's own rows (`python -m experiments paper_standin --quick`, run once per
    session), and one more: exact gossip with seed 1, for the page's other-seed section."""
    wanted = [f"seed0/{k}" for k in ("traffic/resnet20:width=4", "timing", *LABELS)]
    sweep = quick_sweep("paper_standin")
    assert sweep.code == 0
    stored = RowFile(sweep.out / "paper_standin.jsonl").read()
    records = [stored[key] for key in wanted]
    seed0 = stored["seed0/exact gossip"]
    # seed 1's row as it would be stored (a JSON round trip), in a record like seed 0's
    row = json.loads(json.dumps(paper_standin.row(Run("seed1/exact gossip", seed0.config, seed=1))))
    records.append(dataclasses.replace(seed0, key="seed1/exact gossip", seed=1, row=row))
    by = {r.key: r.row for r in records}
    traffic = by["seed0/traffic/resnet20:width=4"]
    assert traffic["exact_floats"] == traffic["closed_exact"] == traffic["parameters"]
    assert traffic["powergossip_r1_floats"] == traffic["closed_powergossip_r1"]
    exact = by["seed0/exact gossip"]
    steps = exact["steps"]
    assert steps >= 16 and steps % 2 == 0  # H = 16 gossips at least once; r1 ends on a Q round
    # exact gossip's measured traffic is the summary's formula (model bytes x degree x rounds)
    assert exact["mb_per_peer"] == pytest.approx(exact["exact_mb_formula"], rel=1e-12)
    for h in (4, 16):
        r = by[f"seed0/exact gossip H={h}"]
        assert r["rounds"] == steps // h
        assert r["mb_per_peer"] * steps == pytest.approx(
            exact["mb_per_peer"] * r["rounds"], rel=1e-12
        )
    # rank 1 alternates a P and a Q round: over an even number of rounds, the closed form's mean
    r1 = by["seed0/PowerGossip r1"]
    assert exact["mb_per_peer"] / r1["mb_per_peer"] == pytest.approx(traffic["ratio"], rel=1e-12)
    setting = paper_standin.SETTINGS[True]
    for r in (by[f"seed0/{label}"] for label in LABELS):
        assert len(r["evals"]) == setting["epochs"] // setting["eval_every"]
        assert 0 <= r["acc_avg"] <= 1 and r["consensus_distance"] >= 0
    assert by["seed1/exact gossip"]["evals"] != exact["evals"]  # data, models, batches drawn anew
    out = paper_standin.render(Rows("paper_standin", True, records, len(records)))
    assert sorted(out) == [
        f"paper_standin{x}" for x in (".csv", ".json", ".md", ".png", "_seed1.json")
    ]
    assert "not CIFAR-10" in out["paper_standin.md"] and "## Other seeds" in out["paper_standin.md"]
    assert "(its JSON: `paper_standin_seed1.json`)" in out["paper_standin.md"]
    main = json.loads(out["paper_standin.json"])
    assert [r["label"] for r in main["rows"]] == list(LABELS) and main["traffic"] == [traffic]
    assert len(out["paper_standin.csv"].splitlines()) == 1 + sum(
        len(r["evals"]) for r in main["rows"]
    )
