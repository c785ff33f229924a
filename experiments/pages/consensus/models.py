"""The `models:epoch=E` problem's tensors: every peer's `cnn1d` parameters after E epochs of D-PSGD
(exact gossip) on MNIST-1D, Dirichlet(0.1), the demo recipe, on the consensus topology itself;
saved at the end of each epoch of `SAVED_EPOCHS` into one cache file per (topology, seed)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, List, Sequence

import torch

from experiments.suite.runs import BASE
from gossip_powersgd.training.hooks import TrainingHooks

SAVED_EPOCHS = (1, 10, 30)
#: D-PSGD on the demo recipe (lr 0.1, momentum 0.9, cosine, batch 32), Dirichlet(0.1) labels.
TRAINING = dict(BASE, algorithm="exact", partition="dirichlet:0.1", eval_every=1000)


class SaveAtEpochs(TrainingHooks):
    """Keeps a float32 copy of the model's parameters at the end of the chosen epochs."""

    name = "consensus_save_at_epochs"

    def __init__(self, epochs: Sequence[int]):
        self.epochs, self.saved = set(int(e) for e in epochs), {}
        self.model, self.steps_per_epoch = None, 1

    def setup(self, context) -> None:
        self.model, self.steps_per_epoch = context.model, context.steps_per_epoch

    def after_gossip(self, step: int) -> None:
        epoch, rest = divmod(step + 1, self.steps_per_epoch)
        if rest == 0 and epoch in self.epochs:
            self.saved[epoch] = [p.detach().float().clone() for p in self.model.parameters()]


def ensure_models(topology: str, seed: int, base: Path, epochs=SAVED_EPOCHS) -> Path:
    """The cache file {"epochs": {E: {rank: [tensors]}}, ...}, trained unless it exists; one
    trainer at a time per file (a lock): instances in parallel wait for it and reuse it."""
    import fcntl
    import io

    from gossip_powersgd import run
    from gossip_powersgd.utils import atomic_write

    path = Path(base) / f"{topology.replace(':', '')}_seed{seed}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists() and set(epochs) <= set(torch.load(path, weights_only=True)["epochs"]):
            return path
        hooks: Dict[int, SaveAtEpochs] = {}

        def make(rank: int) -> List[SaveAtEpochs]:
            hooks[rank] = SaveAtEpochs(epochs)
            return [hooks[rank]]

        started = time.perf_counter()
        result = run(dict(TRAINING, topology=topology, seed=seed, epochs=max(epochs)), make)
        saved = {e: {rank: hooks[rank].saved[e] for rank in sorted(hooks)} for e in epochs}
        data = {"epochs": saved, "seconds": time.perf_counter() - started}
        buffer = io.BytesIO()
        torch.save(
            dict(data, topology=topology, seed=seed, test_acc_avg_model=result.acc_avg), buffer
        )
        atomic_write(path, buffer.getvalue())
    return path
