"""`python -m experiments privacy_attacks` and `privacy_attacks_overfit`: what a curious neighbour
learns, in privacy_regime.md's regime and where the models memorise (`regimes`, `runs`, `page`)."""

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
