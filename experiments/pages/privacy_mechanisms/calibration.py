"""The mechanisms page's calibration: each mechanism's noise for epsilon = TARGET against a direct
neighbour on a setting's topology (`gossip_powersgd.privacy.mechanisms.calibration.calibrate`,
each mechanism with its own valid accountant), with the constants below, fixed before any run."""

from __future__ import annotations

from typing import Any, Dict

DELTA, CLIP, TARGET = 1e-5, 1.0, 4.0
#: DECOR's sigma_cor / sigma_ind, fixed before any run (not tuned on accuracy).
DECOR_RATIO = 4.0
#: ZIP-DL's per-draw std over DP-SGD's noise std on the model (`zipdl.noise_ratio`), fixed before
#: any run: its zero-sum noise as large as the DP noise of one step.
ZIPDL_RATIO = 1.0
#: The first T of the network view the page's text describes (T doubled from it). No run here
#: computes that view: its bound is no guarantee for training (`muffliato.network_applies`), and
#: Muffliato's and ZIP-DL's epsilon is DP-SGD's local bound.
NETWORK_STEPS = 128
RATIOS = dict(decor_ratio=DECOR_RATIO, zipdl_ratio=ZIPDL_RATIO)


def calibrate(setting: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """{mechanism: its noise (sigma, extra noise) and epsilons} on `setting`'s topology."""
    from gossip_powersgd.privacy.mechanisms.calibration import calibrate as solve

    keys = ("topology", "batch_size", "shard", "epochs", "lr", "schedule")
    return solve(*(setting[k] for k in keys), target=TARGET, delta=DELTA, clip=CLIP, **RATIOS)
