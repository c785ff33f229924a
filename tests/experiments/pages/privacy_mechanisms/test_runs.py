"""experiments/pages/privacy_mechanisms/runs.py: a calibration keeps only the bounds valid for training."""

from __future__ import annotations

import pytest

from experiments.pages import privacy_mechanisms as mechanisms
from experiments.pages.privacy_mechanisms import runs as mechanism_runs


def test_calibration_keeps_only_the_bounds_valid_for_training():
    """The network bounds are no guarantee for training (adaptive gradients, the evaluation's
    release: `muffliato.NETWORK_LABEL`), at a constant lr as under a cosine one: Muffliato and
    ZIP-DL report DP-SGD's local bound at DP-SGD's sigma; DP-SGD's and DECOR's noise is on the
    gradient, so their sigma and epsilon are the constant schedule's, bit for bit."""
    setting = mechanisms.setting_of("ring:4", True)
    assert setting["schedule"] == "constant"
    constant = mechanism_runs.calibrate(setting)
    cosine = mechanism_runs.calibrate(dict(setting, schedule="cosine"))
    for name in ("muffliato", "zipdl"):
        assert "network_neighbour" not in constant[name]
        assert "no guarantee for training" in constant[name]["note"]
    for name in ("local", "decor"):
        for key in ("sigma", "neighbour", "far", "neighbour_pld", "local"):
            assert cosine[name][key] == constant[name][key]
    local = cosine["local"]
    for name in ("muffliato", "zipdl"):
        row = cosine[name]
        assert "network_neighbour" not in row and "lr is cosine" in row["note"]
        assert row["sigma"] == local["sigma"] and row["neighbour"] == local["neighbour"]
        assert row["far"] == local["far"] and row["local"] == local["local"]
    # ZIP-DL's zero-sum std: rho = 1 times one step's DP noise on the model at the base lr
    expected = setting["lr"] * local["sigma"] * mechanism_runs.CLIP / setting["batch_size"]
    assert cosine["zipdl"]["zipdl_sigma"] == pytest.approx(
        expected * mechanism_runs.ZIPDL_RATIO, rel=1e-12
    )
