"""Real model differences for the `models:epoch=E` consensus problem: every peer's `cnn1d`
parameters after E epochs of D-PSGD (exact gossip) on MNIST-1D, Dirichlet(0.1) partition, the
demo recipe (experiments/suite/runs.py's BASE), trained on the consensus topology itself.

The parameters are saved at the end of each epoch of `SAVED_EPOCHS` into one cache file per
(topology, training seed) under the output folder, and reused when it exists."""

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
        self.model = None
        self.steps_per_epoch = 1

    def setup(self, context) -> None:
        self.model, self.steps_per_epoch = context.model, context.steps_per_epoch

    def after_gossip(self, step: int) -> None:
        done = step + 1
        if done % self.steps_per_epoch == 0 and done // self.steps_per_epoch in self.epochs:
            self.saved[done // self.steps_per_epoch] = [
                p.detach().to(torch.float32).clone() for p in self.model.parameters()
            ]


def models_file(base: Path, topology: str, seed: int) -> Path:
    """The cache file of one (topology, training seed)."""
    from .report import slug

    return Path(base) / f"{slug(topology.replace(':', ''))}_seed{seed}.pt"


def ensure_models(
    topology: str, seed: int, base: Path, epochs: Sequence[int] = SAVED_EPOCHS, log=print
) -> Path:
    """Train (unless cached) and return the cache file: {"epochs": {E: {rank: [tensors]}}, ...}."""
    import io

    from gossip_powersgd import run
    from gossip_powersgd.utils import atomic_write

    path = models_file(base, topology, seed)
    if path.exists():
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if set(epochs) <= set(saved["epochs"]):
            return path
    saved: Dict[int, SaveAtEpochs] = {}

    def hooks(rank: int) -> List[SaveAtEpochs]:
        saved[rank] = SaveAtEpochs(epochs)
        return [saved[rank]]

    config = {**TRAINING, "topology": topology, "seed": seed, "epochs": max(epochs)}
    started = time.perf_counter()
    result = run(config, hooks=hooks)
    seconds = time.perf_counter() - started
    accuracy = result.acc_avg
    log(
        f"  trained {len(saved)} cnn1d peers on {topology} (D-PSGD, Dirichlet(0.1), seed {seed}) "
        f"for {max(epochs)} epochs in {seconds:.0f} s; averaged-model test accuracy {accuracy}"
    )
    data = {
        "epochs": {e: {rank: saved[rank].saved[e] for rank in sorted(saved)} for e in epochs},
        "topology": topology,
        "seed": seed,
        "seconds": seconds,
        "test_acc_avg_model": accuracy,
        "recipe": {k: v for k, v in TRAINING.items()},
    }
    buffer = io.BytesIO()
    torch.save(data, buffer)
    atomic_write(path, buffer.getvalue())
    return path


__all__ = ["SAVED_EPOCHS", "SaveAtEpochs", "TRAINING", "ensure_models", "models_file"]
