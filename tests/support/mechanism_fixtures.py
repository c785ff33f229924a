"""The small private training config the privacy tests share (tests/privacy/)."""

from __future__ import annotations

from gossip_powersgd.training.config import TrainConfig


def small_config(**changes):
    base = TrainConfig(
        topology="ring:4",
        dataset="synthetic_logreg:d=20,classes=4,n=2000",
        model="logreg",
        lr=0.5,
        batch_size=32,
        epochs=1,
        quiet=True,
        checkpoint_every=0,
        algorithm="exact",
        partition="iid",
        dp_noise_multiplier=0.5,
        dp_max_grad_norm=1.0,
    )
    return base.replace(**changes)
