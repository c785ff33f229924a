"""experiments/pages/consensus/page.py: the page lists what of the full grid did not run."""

from __future__ import annotations

import torch

from experiments.pages.consensus import instance

torch.set_num_threads(1)


def test_page_lists_what_of_the_full_grid_did_not_run():
    from experiments.pages.consensus.page import not_run

    ran = {
        "ring:8": [p for p in instance.FULL_GRID if p != "lowrank:r=16,sigma=0.3"],
        "torus:4x4": ["matrix"],
    }
    missing = not_run(ran)
    assert missing["ring:8"] == ["lowrank:r=16,sigma=0.3"]
    # the trained models exist for ring:8 only, so a torus page does not count them as missing
    assert "matrix" not in missing["torus:4x4"] and "cnn" in missing["torus:4x4"]
    assert not any(p.startswith("models:") for p in missing["torus:4x4"])
    assert len(missing["torus:4x4"]) == len(instance.FULL_GRID) - 1 - 3
