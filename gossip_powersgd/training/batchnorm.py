"""BatchNorm in a decentralized run: which running statistics the local and averaged models use.

Gossip mixes the parameters only; BatchNorm's running statistics are buffers, never gossiped. Each
local model keeps (and is evaluated with) its own statistics, which belong to its own parameters.
The averaged model's are recomputed at every evaluation (`refresh_batch_norm`) on a few batches of
a seeded sample of each peer's own training data (`refresh_inputs`) and pooled over the peers,
because the average of the peers' statistics does not describe the averaged parameters. Where the
peers' statistics are private (`features.peer_statistics_private`: under differential privacy, and
under `partition: local`, each unless `release_peer_statistics: true`) the trainer skips the
refresh: a peer's batch statistics are functions of its private data and would leave it (outside
the DP mechanism; under `partition: local`, data that exists on its peer only), so the averaged
model keeps the peers' mean statistics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np
import torch

if TYPE_CHECKING:
    from ..comm.base import Comm

__all__ = ["BN_REFRESH_BATCHES", "refresh_batch_norm", "refresh_inputs"]


#: How many of its own training batches each peer runs the averaged model on to recompute its
#: BatchNorm statistics (`refresh_batch_norm`).
BN_REFRESH_BATCHES = 8
#: Distinguishes the draw of the samples `refresh_inputs` takes from every other seeded stream.
_SAMPLE_STREAM = 0xB18


def refresh_batch_norm(model: torch.nn.Module, inputs: Iterable[torch.Tensor], comm: Comm) -> bool:
    """Recompute the BatchNorm running statistics of `model` (the averaged model, the same on
    every peer) on this peer's `inputs`, then average them over the peers (collective, metric
    traffic); False (and nothing done) for a model without BatchNorm.

    Why: a BN network's running statistics belong to its own parameters. Gossip mixes the
    parameters only, so each local model keeps (and is evaluated with) its own statistics, and
    the average of the peers' statistics does not describe the averaged parameters (a 2-step
    ResNet run gave the averaged model below-chance accuracy that way). Each peer therefore
    passes a few of its own training batches through the averaged model in training mode with a
    cumulative average (``momentum=None``, as ``torch.optim.swa_utils.update_bn``), and the peers
    combine their per-channel statistics: mean = the peers' mean of means; variance = the peers'
    mean of (variance + mean^2) - mean^2 (the law of total variance). Each peer's statistics
    weigh by the number of samples it ran (the counts are all-gathered, control traffic): a peer
    whose batches held none (a shard of one sample) adds nothing, and where no peer ran any the
    model keeps the statistics it had (the peers' mean). Equal counts, every peer's full batches,
    are the plain mean, computed as before.
    """
    norms = [
        m
        for m in model.modules()
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]
    if not norms:
        return False
    inputs = list(inputs)
    mine = sum(len(x) for x in inputs)
    counts = [int.from_bytes(c, "little") for c in comm.allgather_bytes(mine.to_bytes(8, "little"))]
    if not any(counts):
        return True  # no peer has two samples to measure a batch: keep the peers' mean
    momenta = [m.momentum for m in norms]
    was_training = model.training
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    with torch.no_grad():
        for x in inputs:
            model(x)
    for m, momentum in zip(norms, momenta):
        m.momentum = momentum
    model.train(was_training)
    flat = torch.cat(
        [torch.cat([m.running_mean, m.running_var + m.running_mean**2]).double() for m in norms]
    )
    if len(set(counts)) == 1:
        comm.allreduce_(flat, op="mean", metric=True)
    else:  # weighted by the samples; a peer without any ran nothing (its statistics are reset)
        flat = flat * mine if mine else torch.zeros_like(flat)
        comm.allreduce_(flat, op="sum", metric=True)
        flat /= sum(counts)
    offset = 0
    for m in norms:
        c = m.num_features
        mean, second = flat[offset : offset + c], flat[offset + c : offset + 2 * c]
        m.running_mean.copy_(mean)
        m.running_var.copy_((second - mean**2).clamp_min(0))
        offset += 2 * c
    return True


def refresh_inputs(batches, step: int, count: int = BN_REFRESH_BATCHES) -> Iterator[torch.Tensor]:
    """`count` mini-batches (of 2 samples at least, where the batch size is 1) of a sample of this
    peer's shard (`batches.x`) drawn without replacement from a generator of (seed, rank, step),
    through its per-batch transform: what `refresh_batch_norm` runs on. Leaves the batch
    iterator's position alone.

    A sample, not the shard's first records: a shard keeps its dataset's order, and a dataset
    stored class by class (torchvision's ImageFolder, a user's arrays sorted by label) gave the
    averaged model the statistics of its first class only."""
    size = getattr(batches, "batch_size", None) or round(batches.sample_rate * len(batches.x))
    size = max(2, size)  # training-mode BN needs more than one value per channel
    n = len(batches.x)
    words = [getattr(batches, "seed", 0), getattr(batches, "rank", 0), step, _SAMPLE_STREAM]
    rng = np.random.default_rng(np.random.SeedSequence(words))
    order = torch.from_numpy(rng.choice(n, size=min(count * size, n), replace=False))
    order = order.to(batches.x.device)
    for i in range(-(-len(order) // size)):
        x = batches.x[order[i * size : (i + 1) * size]]
        if len(x) < 2:  # a last sample alone: not a batch BN can measure
            break
        if batches.transform is not None:
            from .batches import BN_STREAM

            x = batches.transform(x, batches._generator(step, i, stream=BN_STREAM))
        yield x
