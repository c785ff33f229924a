"""The `models:epoch=E` problem's tensors: every peer's `cnn1d` parameters after E epochs of D-PSGD
(exact gossip) on MNIST-1D, Dirichlet(0.1), the demo recipe, trained on the consensus topology
itself; saved at the end of each epoch of `SAVED_EPOCHS` into one cache file per (topology,
training seed) under runs/ (git-ignored), reused when it exists."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, List, Sequence

import torch

from gossip_powersgd.training.hooks import TrainingHooks

SAVED_EPOCHS = (1, 10, 30)
#: D-PSGD on the demo recipe (lr 0.1, momentum 0.9, cosine, batch 32), Dirichlet(0.1) labels.
TRAINING = dict(
    dataset="mnist1d",
    model="cnn1d",
    optimizer="sgd",
    lr=0.1,
    momentum=0.9,
    weight_decay=0.0001,
    warmup_epochs=2,
    schedule="cosine",
    batch_size=32,
    algorithm="exact",
    partition="dirichlet:0.1",
    backend="local",
    quiet=True,
    log_every=0,
    checkpoint_every=0,
    out_dir=None,
    threads=1,
    eval_every=1000,
)


class SaveAtEpochs(TrainingHooks):
    """Keeps a float32 copy of the model's parameters at the end of the chosen epochs."""

    name = "consensus_save_at_epochs"

    def __init__(self, epochs: Sequence[int]):
        self.epochs = set(int(e) for e in epochs)
        self.saved: Dict[int, List[torch.Tensor]] = {}
        self.model, self.steps_per_epoch = None, 1

    def setup(self, context) -> None:
        self.model, self.steps_per_epoch = context.model, context.steps_per_epoch

    def after_gossip(self, step: int) -> None:
        epoch, rest = divmod(step + 1, self.steps_per_epoch)
        if rest == 0 and epoch in self.epochs:
            self.saved[epoch] = [
                p.detach().to(torch.float32).clone() for p in self.model.parameters()
            ]


def ensure_models(
    topology: str, seed: int, base: Path, epochs: Sequence[int] = SAVED_EPOCHS
) -> Path:
    """Train (unless cached) and return the cache file {"epochs": {E: {rank: [tensors]}}, ...}.
    One trainer at a time per file (a lock): parallel instances wait for it and reuse it."""
    import fcntl
    import io

    from gossip_powersgd import run
    from gossip_powersgd.utils import atomic_write

    path = Path(base) / f"{topology.replace(':', '')}_seed{seed}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            saved = torch.load(path, map_location="cpu", weights_only=True)
            if set(epochs) <= set(saved["epochs"]):
                return path
        hooks: Dict[int, SaveAtEpochs] = {}

        def make(rank: int) -> List[SaveAtEpochs]:
            hooks[rank] = SaveAtEpochs(epochs)
            return [hooks[rank]]

        started = time.perf_counter()
        result = run({**TRAINING, "topology": topology, "seed": seed, "epochs": max(epochs)}, make)
        data = {
            "epochs": {e: {rank: hooks[rank].saved[e] for rank in sorted(hooks)} for e in epochs},
            "topology": topology,
            "seed": seed,
            "seconds": time.perf_counter() - started,
            "test_acc_avg_model": result.acc_avg,
        }
        buffer = io.BytesIO()
        torch.save(data, buffer)
        atomic_write(path, buffer.getvalue())
    return path
