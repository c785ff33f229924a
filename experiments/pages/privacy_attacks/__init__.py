"""`python -m experiments privacy_attacks` and `privacy_attacks_overfit`: what a curious neighbour
learns. Each run trains with observer 0 recording what it receives, then attacks its two
neighbours (reconstructions, LOSS and LiRA through several models beside the blind baselines and
the null band) under the membership protocol. privacy_attacks: privacy_regime.md's regime, with
the one-run audit (`audit`) and network DP (`network`); privacy_attacks_overfit: a regime where
the models memorise. The regimes: `regimes`; the runs: `runs`; the page: `page`, `tables`."""

from __future__ import annotations

from functools import partial

from experiments.engine import Page
from experiments.pages import register

from . import page, runs

TITLES = {
    "privacy_attacks": "what a curious neighbour learns (LOSS, LiRA, reconstructions, one-run audit)",
    "privacy_attacks_overfit": "what a curious neighbour learns where the models overfit",
}
PAGES = [
    register(Page(name, title, partial(runs.plan, name), runs.row, partial(page.render, name)))
    for name, title in TITLES.items()
]
