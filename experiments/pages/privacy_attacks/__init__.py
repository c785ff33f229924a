"""`python -m experiments privacy_attacks` and `privacy_attacks_overfit`: what a curious neighbour
learns. Each run trains with observer 0 recording what it receives, then attacks its two
neighbours (reconstructions over time, LOSS and LiRA membership inference through several models,
with the blind baselines and the null band: `gossip_powersgd.privacy.attacks`), under the
membership protocol (members and held-out records of each victim's own shard). privacy_attacks:
the regime privacy_regime.md chose (the attacks work without DP, DP learns), with LiRA references
trained by gossip, the one-run audit's ε lower bound beside the claim (`audit`) and the pairwise
network-DP matrices of noisy exact gossip; privacy_attacks_overfit: 1000 samples per peer and an
MLP, where the attacks find members. The regimes: `regimes.REGIMES`; the runs: `runs`; the page: `page`, `tables`."""

from __future__ import annotations

import functools

from experiments.engine import Page
from experiments.pages import register

from . import page, runs

TITLES = {
    "privacy_attacks": "what a curious neighbour learns (LOSS, LiRA, reconstructions, one-run audit)",
    "privacy_attacks_overfit": "what a curious neighbour learns where the models overfit",
}
PAGES = [
    register(
        Page(
            name,
            title,
            functools.partial(runs.plan, name),
            runs.row,
            functools.partial(page.render, name),
        )
    )
    for name, title in TITLES.items()
]
