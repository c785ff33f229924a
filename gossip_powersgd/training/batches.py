"""Checkpointable batch iterators: a peer's batch sequence is a pure function of its state.

`Batches` (shuffled mini-batches, the trainer's default), `StreamBatches` (a language model's
contiguous text as parallel streams, for truncated BPTT) and `privacy.PoissonBatches` (what the DP
accountant assumes) share `ResumableBatches`: iteration to the end of the epoch, and a
`state_dict()` that resumes the remaining batches bit for bit.
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional

import numpy as np
import torch


#: Distinguishes the transform's stream from the batch order's (which seeds (seed, rank, epoch)).
_TRANSFORM_STREAM = 0xA06
#: The stream of the batches `evaluation.refresh_inputs` transforms (epoch: the step, position:
#: the batch's index).
BN_STREAM = 0xB17


class ResumableBatches:
    """Batches over ``(x, y)`` that are a pure function of ``(seed, rank, epoch, position)``.

    What `Batches` and `privacy.PoissonBatches` share: iterating yields ``(xb, yb)`` from the
    current position to the end of the current epoch; the state advances *before* each batch is
    handed out, so a ``state_dict()`` taken while holding a batch points at the next one — what a
    checkpoint written after processing that batch needs; ``load_state_dict`` into a new instance
    over the same data and the remaining batches come out identical. Subclasses say how many steps
    an epoch has (``__len__``) and which samples a step takes (``_epoch_indices``).
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, seed: int, rank: int, empty_error: str):
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} samples but y has {len(y)}")
        if len(x) == 0:
            raise ValueError(empty_error)
        if seed < 0 or rank < 0:
            raise ValueError(f"seed and rank must be non-negative, got seed={seed}, rank={rank}")
        self.x, self.y = x, y
        self.seed, self.rank = int(seed), int(rank)
        self.epoch, self.position = 0, 0  # position = steps already taken this epoch
        #: Per-batch transform ``transform(xb, generator)`` (augmentation, normalisation), or None;
        #: its generator is a pure function of (seed, rank, epoch, position), see `_generator`.
        self.transform: Optional[Callable[[torch.Tensor, torch.Generator], torch.Tensor]] = None
        #: Size of the batch handed out last (the DP engine divides by the expected size instead).
        self.last_batch_size = 0

    def __len__(self) -> int:
        raise NotImplementedError

    def _epoch_indices(self, epoch: int) -> Callable[[int], torch.Tensor]:
        """For `epoch`, the function from a step's position to the indices of its samples."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch = self.epoch
        indices = self._epoch_indices(epoch)
        while self.epoch == epoch:
            position = self.position
            index = indices(position)
            self.position += 1
            if self.position == len(self):
                self.epoch, self.position = self.epoch + 1, 0
            self.last_batch_size = len(index)
            xb = self.x[index]
            if self.transform is not None:
                xb = self.transform(xb, self._generator(epoch, position))
            yield xb, self.y[index]

    def _generator(
        self, epoch: int, position: int, stream: int = _TRANSFORM_STREAM
    ) -> torch.Generator:
        """The transform's generator for step `position` of `epoch`: this peer's own stream
        (seeded by its rank), the same under every transport and after a resume. Another
        `stream` gives draws independent of the training batches' (e.g. `BN_STREAM`)."""
        words = np.random.SeedSequence([self.seed, self.rank, epoch, position, stream])
        state = words.generate_state(2)
        return torch.Generator().manual_seed((int(state[0]) << 31) ^ int(state[1]))

    def state_dict(self) -> dict[str, int]:
        """Where the batches are (plain ints: survives ``torch.load(weights_only=True)``)."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a ``state_dict()``: the following batches are those the saver would see."""
        epoch, position, seed = int(state["epoch"]), int(state["position"]), int(state["seed"])
        if epoch < 0 or not 0 <= position < len(self) or seed < 0:
            raise ValueError(
                f"invalid {type(self).__name__} state {dict(state)} for {len(self)} steps/epoch"
            )
        self.epoch, self.position, self.seed = epoch, position, seed


class Batches(ResumableBatches):
    """Deterministic shuffled mini-batches over ``(x, y)`` with a checkpointable position.

    Each epoch uses a fresh permutation drawn from a generator seeded by ``(seed, rank, epoch)``
    (see `ResumableBatches` for iteration and resuming). The last batch may be smaller
    (``drop_last=False``); ``len()`` counts it.
    """

    def __init__(
        self, x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int = 0, rank: int = 0
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        super().__init__(x, y, seed, rank, "cannot batch an empty dataset")
        self.batch_size = int(batch_size)

    def __len__(self) -> int:
        return -(-len(self.x) // self.batch_size)

    def _permutation(self, epoch: int) -> torch.Tensor:
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, self.rank, epoch]))
        return torch.from_numpy(rng.permutation(len(self.x))).to(self.x.device)

    def _epoch_indices(self, epoch: int) -> Callable[[int], torch.Tensor]:
        order = self._permutation(epoch)
        return lambda position: order[position * self.batch_size : (position + 1) * self.batch_size]


class StreamBatches(ResumableBatches):
    """A peer's contiguous text as `batch_size` parallel streams, for truncated BPTT.

    ``x`` holds consecutive windows of one text (a `contiguous` shard of a language-model dataset,
    records in text order). They are cut into ``min(batch_size, len(x))`` streams of consecutive
    windows, lengths differing by at most one (the longer ones first), and step t of a pass takes
    window t of every stream that still runs: row k of each batch continues row k of the one
    before, as in PyTorch's word-language-model example (which drops the remainder; here the last
    step takes the longer streams only). Nothing is shuffled. `carrier` (the model, with
    ``reset_state``, ``get_state``, ``set_state``) starts from a zero state at every pass and its
    carried state is part of `state_dict`, so a resumed run continues bit for bit.
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        carrier=None,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        super().__init__(x, y, seed, rank, "cannot batch an empty dataset")
        self.batch_size = int(batch_size)
        self.streams = min(self.batch_size, len(x))
        shortest, longer = divmod(len(x), self.streams)
        lengths = [shortest + 1] * longer + [shortest] * (self.streams - longer)
        self.lengths = torch.tensor(lengths)
        self.starts = torch.cumsum(torch.tensor([0] + lengths[:-1]), 0)
        self.carrier = carrier

    def __len__(self) -> int:
        return int(self.lengths[0])

    def _epoch_indices(self, epoch: int) -> Callable[[int], torch.Tensor]:
        def at(position: int) -> torch.Tensor:
            running = self.lengths > position
            return (self.starts[running] + position).to(self.x.device)

        return at

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.position == 0 and self.carrier is not None:
            self.carrier.reset_state()  # a new pass: every stream starts again
        yield from super().__iter__()

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.carrier is not None:
            state["hidden"] = self.carrier.get_state()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.carrier is not None:
            self.carrier.set_state(state.get("hidden", []))


def stream_rows(n: int, streams: int, device=None) -> Iterator[torch.Tensor]:
    """The rows of each step when `n` consecutive windows are read as `streams` parallel streams,
    laid out as `StreamBatches` lays out a shard (what evaluation reads a test text with)."""
    layout = StreamBatches(torch.zeros(n, 1), torch.zeros(n), streams)
    at = layout._epoch_indices(0)
    return (at(t).to(device) for t in range(len(layout)))
