"""experiments/pages/consensus/__init__.py: the page's plan (its 25 instances) and one instance run
and drawn from its row (seeds rerun at seed 0's best γ)."""

from __future__ import annotations

import torch

from experiments.pages import consensus as page
from experiments.pages.consensus import files

from tests.experiments.pages.consensus._support import _instance

torch.set_num_threads(1)


def test_the_plan_is_the_pages_25_instances():
    runs = page.plan(False, {})
    assert (
        len(runs) == 25
        and runs[0].key == "ring:8/matrix"
        and runs[-1].key == "torus:4x4/offset:beta=10"
    )
    models = [r for r in runs if r.config["problem"].startswith("models:")]
    assert len(models) == 3 and all(r.config["seeds"] == [0] for r in models)
    full = [r.key for r in runs if r.config["reseed"] is not None]
    assert full == ["ring:8/matrix", "ring:8/cnn", "torus:4x4/matrix"]


def test_seeds_rerun_the_chosen_algorithms_at_seed_zeros_best_gamma(tmp_path):
    specs = ["exact", "choco:compressor=sign", "choco:compressor=topk:0.2"]
    row, inst = _instance(
        tmp_path, "lowrank:r=2,sigma=0.1,n=12", specs, ["exact", "choco:compressor=sign"], (0, 1)
    )
    by_seed = {s: [r for r in inst["results"] if r["seed"] == s] for s in (0, 1)}
    assert len(by_seed[0]) == 5 and {r["label"] for r in by_seed[1]} == {
        "exact gossip",
        "Choco sign",
    }
    assert sorted(r["stage"] for r in by_seed[0] if r["swept"]) == [
        "full",
        "full",
        "screen",
        "screen",
    ]
    best = inst["summary"]["Choco sign"]["plot_spec"]
    assert [r["spec"] for r in by_seed[1] if r["label"] == "Choco sign"] == [best]
    from experiments.pages.consensus.page import page as draw

    text = draw([inst], "made by", {"seconds": 1.0, "cpu_count": 2, "machine": "x"})
    assert "## Winner map" in text and "| ring:4 | lowrank:r=2,sigma=0.1,n=12 | 2 |" in text
    assert files.heat_map([inst], inst["budgets"])[:4] == b"\x89PNG"
