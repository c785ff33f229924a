"""Tiny files in the real formats of the paper's datasets, and datasets that police their reads.

`write_cifar10` writes the CIFAR-10 binary distribution's files (1 label byte + 3072 pixel bytes
per record), `write_wikitext2` the three WikiText-2 token files; nothing here needs the real
datasets. `rank_guarded` is a bring-your-own dataset whose training records raise when a rank other
than their owner touches them (the rank comes from the MPI launcher's environment).
"""

from pathlib import Path

import numpy as np
import torch

RECORD = 1 + 3 * 32 * 32


def cifar_records(n: int, seed: int) -> np.ndarray:
    """`n` records: a label in 0..9, then a 3x32x32 image whose mean brightness grows with it
    (so a model can learn the labels)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    pixels = rng.integers(0, 100, (n, 3072)) + 15 * labels[:, None]
    return np.concatenate([labels[:, None], pixels], axis=1).astype(np.uint8)


def write_cifar10(root: Path, per_batch: int = 8, test: int = 10, seed: int = 0) -> Path:
    """root/cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin; returns that folder."""
    folder = Path(root) / "cifar-10-batches-bin"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(1, 6):
        (folder / f"data_batch_{i}.bin").write_bytes(cifar_records(per_batch, seed + i).tobytes())
    (folder / "test_batch.bin").write_bytes(cifar_records(test, seed).tobytes())
    return folder


TRAIN_TEXT = " = Valkyria = \n\n the game began development in 2010 \n the game is a <unk> \n"
VALID_TEXT = " the game began in 2011 \n"
TEST_TEXT = " the unseen game began \n development is a game \n"


def write_wikitext2(root: Path, repeat: int = 20) -> Path:
    """root/wikitext-2/wiki.{train,valid,test}.tokens; returns that folder."""
    folder = Path(root) / "wikitext-2"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "wiki.train.tokens").write_text(TRAIN_TEXT * repeat, encoding="utf-8")
    (folder / "wiki.valid.tokens").write_text(VALID_TEXT * repeat, encoding="utf-8")
    (folder / "wiki.test.tokens").write_text(TEST_TEXT * repeat, encoding="utf-8")
    return folder


class GuardedRecords(torch.utils.data.Dataset):
    """Training records of which this process may touch only `allowed`; any other raises."""

    def __init__(self, x, y, allowed):
        self.x, self.y, self.allowed = x, y, set(int(i) for i in allowed)
        self.targets = y.tolist()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        if i not in self.allowed:
            raise RuntimeError(f"record {i} belongs to another rank's shard")
        return self.x[i], self.y[i]


class Plain(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _separable(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return x, (x[:, 0] + x[:, 1] > 0).long()


def rank_guarded(seed=0):
    """(train, test) torch Datasets; train raises for records outside this MPI rank's iid shard."""
    import os

    from gossip_powersgd.training.data import partition

    rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    x, y = _separable(96, 1)
    mine = partition(np.zeros(len(y)), size, "iid", seed)[rank]
    x_test, y_test = _separable(40, 2)
    return GuardedRecords(x, y, mine), Plain(x_test, y_test)


def torch_pair(seed=0):
    """(train, test) torch Datasets without guards, for in-process runs."""
    x, y = _separable(96, 1)
    x_test, y_test = _separable(40, 2)
    return Plain(x, y), Plain(x_test, y_test)


def class_images(seed=0):
    """A learnable image task for BatchNorm tests: 4 classes of 3x8x8 images, each a fixed random
    template per class plus noise (train 320, test 160)."""
    g = torch.Generator().manual_seed(7)
    templates = torch.randn(4, 3, 8, 8, generator=g)

    def draw(n, s):
        gen = torch.Generator().manual_seed(s)
        y = torch.randint(0, 4, (n,), generator=gen)
        return 3.0 + 2.0 * templates[y] + 1.5 * torch.randn(n, 3, 8, 8, generator=gen), y

    (x, y), (xt, yt) = draw(320, 1), draw(160, 2)
    return x, y, xt, yt
