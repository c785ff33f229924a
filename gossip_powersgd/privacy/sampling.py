"""Poisson sampling of a peer's shard: the batches the privacy accountant assumes.

The accountants' epsilon holds for batches in which every record is included independently with
probability q. A shuffled fixed-size batch is a different mechanism; using it with these
accountants would report a smaller epsilon than the run spent. ``PoissonBatches`` draws exactly
what is accounted for.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from gossip_powersgd.privacy.seeds import SAMPLER_STREAM, Randomness
from gossip_powersgd.training.batches import ResumableBatches

__all__ = ["PoissonBatches", "poisson_rate"]


def poisson_rate(batch_size: int, shard_size: int) -> float:
    """A peer's sampling rate q = batch_size / shard_size (its expected batch is batch_size)."""
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if isinstance(shard_size, bool) or int(shard_size) != shard_size or shard_size < 1:
        raise ValueError(f"a peer's shard must hold at least one sample, got {shard_size!r}")
    if batch_size > shard_size:
        raise ValueError(
            f"batch_size={batch_size} is larger than a peer's shard of {shard_size} "
            f"samples, so Poisson sampling at rate batch_size/shard is impossible: "
            f"lower batch_size to at most {shard_size}"
        )
    return batch_size / shard_size


class PoissonBatches(ResumableBatches):
    """Poisson-sampled batches over ``(x, y)`` with a checkpointable position.

    Every step includes each example independently with probability ``sample_rate``, so batch
    sizes vary and may be 0 (then ``xb`` and ``yb`` have length 0). An epoch is
    ``round(1 / sample_rate)`` steps, which visits each example once in expectation.

    The inclusion mask of step ``position`` of ``epoch`` is drawn from this peer's secret
    keystream ``randomness`` (`seeds.Randomness`; default: a fresh OS-entropy key), at the label
    ``(SAMPLER_STREAM, epoch, position)``: a neighbour who knows the config cannot tell which
    records a batch holds, which is what amplification by subsampling assumes. The batches are a
    pure function of the key and the state, so ``load_state_dict`` with the same key resumes
    them bit for bit; iteration and resuming are the trainer's ``Batches``' (see
    `ResumableBatches`). ``last_batch_size`` is what `DPSGD.privatize` is told.
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        sample_rate: float,
        seed: int = 0,
        rank: int = 0,
        *,
        randomness: Optional[Randomness] = None,
    ):
        if isinstance(sample_rate, bool) or not 0 < float(sample_rate) <= 1:
            raise ValueError(f"the Poisson sample rate must lie in (0, 1], got {sample_rate!r}")
        super().__init__(x, y, seed, rank, "cannot sample batches from an empty dataset")
        self.sample_rate = float(sample_rate)
        self.randomness = randomness if randomness is not None else Randomness.os_entropy()

    def __len__(self) -> int:
        return max(1, round(1 / self.sample_rate))

    @property
    def expected_batch_size(self) -> float:
        """q * |D|: what the private gradient's sum is divided by, whatever a batch's size."""
        return self.sample_rate * len(self.x)

    def _mask(self, epoch: int, position: int) -> torch.Tensor:
        uniforms = self.randomness.uniforms(SAMPLER_STREAM, epoch, position, n=len(self.x))
        return (uniforms < self.sample_rate).to(self.x.device)

    def _epoch_indices(self, epoch: int) -> Callable[[int], torch.Tensor]:
        return lambda position: torch.nonzero(self._mask(epoch, position), as_tuple=True)[0]
