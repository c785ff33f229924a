"""A user hook that paces training: `hooks: [{"pace:Paced": {"seconds": S}}]` (tests/support on
PYTHONPATH) sleeps S seconds after every step. A test whose run must outlast a timeout (a peer's
rejoin refused after comm_timeout) then lasts long enough in few steps, and its processes wait
instead of computing, as with a model whose steps take S seconds."""

from __future__ import annotations

import time

from gossip_powersgd.training.hooks import TrainingHooks


class Paced(TrainingHooks):
    def __init__(self, seconds: float):
        self.seconds = float(seconds)

    def after_step(self, step, loss):
        time.sleep(self.seconds)
