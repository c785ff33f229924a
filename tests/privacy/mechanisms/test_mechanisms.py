"""The mechanisms together (`privacy.mechanisms`): each trains on both algorithms, through the CLI,
is refused in one line where it cannot run, and its update noise scales with the learning rate as
the sensitivity does. Each mechanism's own invariants and accountant: test_zipdl.py, test_decor.py,
test_pair_secrets.py, test_muffliato.py beside this file.

Threat model: a peer knows the whole config (the seed too), the code and every byte it receives.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

import topologies
from gossip_powersgd import LocalCluster
from gossip_powersgd.privacy.mechanisms import decor
from gossip_powersgd.privacy.seeds import Randomness
from mechanism_fixtures import small_config


# ---- in training, and through the CLI --------------------------------------------------------------

MECHANISM_KEYS = {
    "zipdl": {"dp_zipdl_sigma": 0.01},
    "decor": {"dp_decor_sigma_cor": 1.0},
    "muffliato": {},
}


@pytest.mark.parametrize("mechanism", sorted(MECHANISM_KEYS))
@pytest.mark.parametrize("algorithm", ["exact", "powergossip:rank=1"])
def test_each_mechanism_trains_on_both_algorithms(mechanism, algorithm):
    from gossip_powersgd.training.trainer import train

    config = small_config(algorithm=algorithm, dp_mechanism=mechanism, **MECHANISM_KEYS[mechanism])
    results = LocalCluster(topologies.ring(4), timeout=60).run(train, config)
    assert results[0]["dp_mechanism"] == mechanism
    # learned something: synthetic logreg with 4 classes, chance 25 %
    assert results[0]["final_test_acc_avg_model"] > 0.4


def cli(tmp_path, *sets):
    args = [
        sys.executable,
        "-m",
        "gossip_powersgd.cli.train",
        "--config",
        "experiments/configs/tiny.yaml",
        "--quiet",
        "--set",
        "epochs=1",
        "--set",
        f"out_dir={tmp_path}/run",
        "--set",
        "dp_noise_multiplier=0.5",
        "--set",
        "dp_max_grad_norm=1",
    ]
    for item in sets:
        args += ["--set", item]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def test_a_mechanism_trains_through_the_cli_and_is_refused_elsewhere_in_one_line(tmp_path):
    import json

    done = cli(
        tmp_path, "algorithm=powergossip:rank=1", "dp_mechanism=decor", "dp_decor_sigma_cor=3"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dp_mechanism"] == "decor"
    done = cli(
        tmp_path / "refused", "algorithm=allreduce", "dp_mechanism=zipdl", "dp_zipdl_sigma=0.1"
    )
    assert done.returncode != 0
    assert done.stderr.strip() == (
        "error: dp_mechanism: zipdl works with algorithm exact or powergossip, not allreduce"
    ), done.stderr


@pytest.mark.parametrize(
    "changes, words",
    [
        (
            dict(algorithm="pushsum", dp_mechanism="decor", dp_decor_sigma_cor=1.0),
            "dp_mechanism: decor works with algorithm exact or powergossip or choco, not pushsum",
        ),
        (dict(dp_mechanism="decor"), "dp_mechanism: decor needs dp_decor_sigma_cor"),
        (dict(dp_mechanism="zipdl"), "dp_mechanism: zipdl needs dp_zipdl_sigma"),
        # refused as the config is checked, not once the run attaches the mechanism (after the
        # data has loaded, on every rank)
        (dict(dp_mechanism="zipdl", dp_zipdl_sigma=-1.0), "bad value for 'dp_zipdl_sigma': -1.0"),
        (dict(dp_mechanism="zipdl", dp_zipdl_sigma=float("nan")), "'dp_zipdl_sigma': nan"),
        (
            dict(dp_mechanism="decor", dp_decor_sigma_cor=float("inf")),
            "bad value for 'dp_decor_sigma_cor': inf",
        ),
        (dict(dp_mechanism="decor", dp_decor_sigma_cor=-0.5), "'dp_decor_sigma_cor': -0.5"),
        (dict(dp_mechanism="secure_aggregation"), "dp_mechanism must be one of local, muffliato"),
        (dict(dp_decor_sigma_cor=1.0), "dp_decor_sigma_cor is for dp_mechanism: decor"),
        (
            dict(dp_mechanism="muffliato", dp_noise_multiplier=None, dp_max_grad_norm=None),
            "dp_mechanism: muffliato runs on DP-SGD",
        ),
    ],
)
def test_bad_mechanism_settings_are_one_line_errors(changes, words):
    from gossip_powersgd.privacy.mechanisms import validate_mechanism_config

    with pytest.raises(ValueError, match=words):
        validate_mechanism_config(small_config(**changes))


# ---- a decaying learning rate (cosine schedule) -------------------------------------------------


@pytest.mark.parametrize("mechanism", ["local", "decor"])
def test_update_noise_scales_with_the_step_lr_exactly_as_the_sensitivity(mechanism):
    """DP-SGD's and DECOR's noise is on the clipped gradient sum: the model moves by -lr_t times
    (clipped sum + noise) / batch, so noise and a record's shift lr_t C / batch scale alike and
    their ratio, which the accountant prices, is the same at every lr_t (a schedule changes no
    epsilon). Fails if a mechanism's noise entered the model with a fixed, lr-free scale."""
    from gossip_powersgd.privacy.dpsgd import DPSGD

    key, pair_key = bytes(range(32)), bytes(range(1, 33))
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(16, 5, generator=g), torch.randint(0, 3, (16,), generator=g)
    start = torch.nn.Linear(5, 3)

    def update_over_lr(lr, sigma):
        model = torch.nn.Linear(5, 3)
        model.load_state_dict(start.state_dict())
        dp = DPSGD(sigma, 1.0, sample_rate=16 / 64, shard_size=64, randomness=Randomness(key, "os"))
        if mechanism == "decor":
            dp.extra_noise = decor.PairwiseNoise(0, {1: pair_key}, 4 * sigma, 1.0, "os")
        wrapped = dp.wrap(model)
        torch.nn.functional.cross_entropy(wrapped(x), y).backward()
        dp.privatize(wrapped, len(x))
        torch.optim.SGD(wrapped.parameters(), lr=lr).step()
        moved = [
            (p.detach() - p0.detach()).flatten()
            for p, p0 in zip(model.parameters(), start.parameters())
        ]
        return torch.cat(moved) / lr

    for lr in (0.5, 0.5 * 0.5 * (1 + math.cos(math.pi * 0.9))):  # cosine's start and 90 %
        signal = update_over_lr(lr, 0.0)  # -(clipped sum) / batch
        noise = update_over_lr(lr, 1.5) - signal  # -(noise) / batch
        if lr == 0.5:
            first = (signal, noise)
        # float32 parameters: p - p0 carries the rounding of p and of the difference, each at most
        # half an ulp of a value below 4 here (init <= 0.45, moves of a few noise stds), so the
        # difference is exact to 4 * 2^-23 and (p - p0) / lr to that over lr
        tol = 4 * 2.0**-23 / lr
        assert float((signal - first[0]).abs().max()) <= tol
        assert float((noise - first[1]).abs().max()) <= tol
        assert float(noise.abs().max()) > 0.1  # the noise is there, in gradient units
