"""The membership protocol's split: members and held-out non-members from each victim's own data.

With non-IID shards, members from a skewed shard against uniform test samples measure label shift,
not membership (a score that never looks at a model reaches a high AUC). So, before training, each
victim's local shard is split at random into *members*, which it trains on, and *held-out*
non-members, which no peer ever trains on: both come from the victim's own distribution, and their
class mix is the same in expectation (a uniformly random subset of the shard).

`make_split(dataset, num_peers, partition, seed, victims, fraction, split_seed)` computes the
shards exactly as training would (`training.data.partition` of the dataset's training set with the
run's seed) and draws each victim's held-out subset with a numpy generator keyed by
``(split_seed, victim)``. The split enters training through the data path itself: `HeldOutSplit.
spec()` registers the split and returns a bring-your-own dataset spec
``gossip_powersgd.privacy.heldout:SPLITS.<key>`` for ``partition: local``, whose function returns
each peer's training data (the victims' members only) and the shared test set; a run configured
with it can train on nothing else. The registry lives in the process (the `local` backend's
peers are its threads). `HeldOutSplit.record()` is the audit record (seeds, fraction and every
index, JSON), to be stored with the run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch

__all__ = ["HeldOutSplit", "SPLITS", "make_split"]


@dataclasses.dataclass(frozen=True, eq=False)
class HeldOutSplit:
    """Every peer's training indices and each victim's held-out indices (into the dataset's
    training set); see the module docstring."""

    dataset: str
    seed: int
    partition: str
    num_peers: int
    fraction: float
    split_seed: int
    #: rank -> indices the peer trains on (its whole shard, a victim's members only).
    members: Dict[int, np.ndarray]
    #: victim rank -> its held-out indices (empty for a peer that is no victim).
    heldout: Dict[int, np.ndarray]

    @property
    def victims(self) -> Tuple[int, ...]:
        return tuple(sorted(k for k, v in self.heldout.items() if len(v)))

    def record(self) -> Dict:
        """The split as JSON-able data: enough to audit or rebuild it."""
        return {
            "dataset": self.dataset,
            "seed": self.seed,
            "partition": self.partition,
            "num_peers": self.num_peers,
            "fraction": self.fraction,
            "split_seed": self.split_seed,
            "victims": list(self.victims),
            "members": {str(k): v.tolist() for k, v in sorted(self.members.items())},
            "heldout": {str(k): self.heldout[k].tolist() for k in self.victims},
        }

    def key(self) -> str:
        """A name for the split, from its content (the same split gets the same name)."""
        text = json.dumps(self.record(), sort_keys=True).encode()
        return "s" + hashlib.sha256(text).hexdigest()[:16]

    def spec(self) -> str:
        """Register the split and return the dataset spec of its ``partition: local`` data."""
        SPLITS.register(self)
        return f"{__name__}:SPLITS.{self.key()}"

    def data(self) -> "object":
        from gossip_powersgd.training.data import load_dataset

        return load_dataset(self.dataset, self.seed)

    def member_set(self, rank: int) -> Tuple[torch.Tensor, torch.Tensor]:
        d = self.data()
        index = torch.from_numpy(self.members[rank])
        return d.x_train[index], d.y_train[index]

    def heldout_set(self, rank: int) -> Tuple[torch.Tensor, torch.Tensor]:
        d = self.data()
        index = torch.from_numpy(self.heldout[rank])
        return d.x_train[index], d.y_train[index]


def make_split(
    dataset: str,
    num_peers: int,
    partition: str,
    seed: int,
    victims: Sequence[int],
    fraction: float = 0.5,
    split_seed: int = 0,
) -> HeldOutSplit:
    """Split each victim's shard (as `partition` cuts `dataset`'s training set with `seed`) into
    members and a uniformly random held-out share `fraction` of it (see the module docstring)."""
    from gossip_powersgd.training.data import LOCAL_PARTITION, load_dataset
    from gossip_powersgd.training.data import partition as cut

    if partition == LOCAL_PARTITION:
        raise ValueError(
            "make_split splits a built-in partition (iid, dirichlet:..., shards:...); "
            "the split itself is the run's partition: local"
        )
    if not 0 < fraction < 1:
        raise ValueError(
            f"fraction (the held-out share of each victim's shard) must lie in (0, 1), "
            f"got {fraction}"
        )
    bad = [v for v in victims if not 0 <= int(v) < num_peers]
    if bad:
        raise ValueError(f"victims {bad} are not ranks of a {num_peers}-peer run")
    labels = load_dataset(dataset, seed).y_train
    shards = cut(labels, num_peers, partition, seed)
    members: Dict[int, np.ndarray] = {}
    heldout: Dict[int, np.ndarray] = {}
    for rank, shard in enumerate(shards):
        shard = np.asarray(shard, dtype=np.int64)
        if rank in {int(v) for v in victims}:
            order = np.random.default_rng([int(split_seed), rank]).permutation(len(shard))
            count = int(round(fraction * len(shard)))
            if count == 0 or count == len(shard):
                raise ValueError(
                    f"victim {rank}'s shard has {len(shard)} samples: too few to hold "
                    f"out a share {fraction} and keep members; use more data"
                )
            heldout[rank] = np.sort(shard[order[:count]])
            members[rank] = np.sort(shard[order[count:]])
        else:
            heldout[rank] = np.zeros(0, dtype=np.int64)
            members[rank] = np.sort(shard)
    return HeldOutSplit(
        dataset=dataset,
        seed=int(seed),
        partition=partition,
        num_peers=int(num_peers),
        fraction=float(fraction),
        split_seed=int(split_seed),
        members=members,
        heldout=heldout,
    )


class _Registry:
    """`SPLITS.<key>` is the ``partition: local`` dataset function of a registered split."""

    def __init__(self):
        self._splits: Dict[str, HeldOutSplit] = {}

    def register(self, split: HeldOutSplit) -> None:
        self._splits[split.key()] = split

    def __getattr__(self, key: str):
        if key.startswith("_"):
            raise AttributeError(key)
        split = self.__dict__["_splits"].get(key)
        if split is None:
            raise AttributeError(
                f"no held-out split {key!r} is registered in this process "
                "(HeldOutSplit.spec() registers one; the local backend runs "
                "every peer in the process that registered it)"
            )

        def peer_data(rank: Optional[int], num_peers: int):
            """This peer's training data (its members), or the shared test set for rank None."""
            if num_peers != split.num_peers:
                raise ValueError(
                    f"the split is for {split.num_peers} peers, the run has {num_peers}"
                )
            d = split.data()
            if rank is None:
                return d.x_test, d.y_test
            index = torch.from_numpy(split.members[int(rank)])
            return d.x_train[index], d.y_train[index], None, None

        return peer_data


#: The registered splits (see `HeldOutSplit.spec`).
SPLITS = _Registry()
