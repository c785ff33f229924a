"""``synthetic_images``: a learnable CIFAR-shaped synthetic stand-in (3 x 32 x 32, 10 classes).

Not CIFAR-10 and not a substitute for it: a task the project generates so that the paper's models
(ResNet-20, VGG-16) can be trained end to end on a machine without the real data. How a record is
made, all from the run's seed:

1. each class has a prototype latent field, ``k = 8`` channels of 8 x 8 standard normals;
2. a record of class c is ``prototype[c] + noise * N(0, I)``, circularly shifted by a random
   (dy, dx) in [-2, 2]^2 latent cells (8 pixels at most: where the object sits varies);
3. the latent is upsampled bilinearly to 32 x 32 and passed through a fixed random conv net
   (3x3 conv k -> 16, tanh, 3x3 conv 16 -> 3; weights ~ N(0, 1 / fan_in)), then mapped to pixels
   ``0.5 + 0.22 * out / s`` (s: the output's standard deviation on the prototypes, so the scale
   does not depend on the seed), clipped to [0, 1] and stored as uint8, like CIFAR's bytes.

``noise`` sets the difficulty: the classes overlap more as it grows
(experiments/results/paper_standin.md trains ResNet-20 at noise=0.7 and shows how far each
algorithm gets). Labels are
exactly balanced (``n`` records hold ``n // classes`` or one more of each class, in a seeded
order). Training records go through the same per-batch transform as ``cifar10``
(`records.cifar_augment`: padded random crop and flip, then CIFAR-10's per-channel
normalisation; ``augment=false``: normalisation only).

Per-peer reads: record i is generated from its own seed ``(seed, 1, i)`` when asked for, so a peer
generates only its own shard (`read_train(indices)`); the test set (seed stream 2) is held in
memory by every peer, as for ``cifar10``.

Spec: ``synthetic_images[:n=4096,test=1000,classes=10,noise=1.0,augment=true]``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from . import records
from .records import RecordDataset, _drop_generator, _normalise, cifar_augment

__all__ = ["synthetic_images", "OPTIONS", "LATENT_CHANNELS", "LATENT_SIZE", "MAX_SHIFT"]

#: The spec's options, their types and defaults.
OPTIONS = {"n": int, "test": int, "classes": int, "noise": float, "augment": bool}
DEFAULTS = {"n": 4096, "test": 1000, "classes": 10, "noise": 1.0, "augment": True}
LATENT_CHANNELS = 8  # k: channels of the latent field
LATENT_SIZE = 8  # the latent is LATENT_SIZE x LATENT_SIZE, upsampled 4x to 32 x 32
MAX_SHIFT = 2  # a record's latent is rolled by up to this many cells each way
HIDDEN = 16  # channels of the random conv net's hidden layer
_SIDE = 32
_TRAIN_STREAM, _TEST_STREAM = 1, 2


def _bilinear(n_in: int, n_out: int) -> np.ndarray:
    """The (n_out, n_in) matrix of bilinear upsampling with align_corners=False (edge-clamped)."""
    u = np.zeros((n_out, n_in))
    for i in range(n_out):
        pos = min(max((i + 0.5) * n_in / n_out - 0.5, 0.0), n_in - 1.0)
        lo = int(np.floor(pos))
        hi = min(lo + 1, n_in - 1)
        u[i, lo] += 1.0 - (pos - lo)
        u[i, hi] += pos - lo
    return u


def _conv3x3(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """'Same' 3x3 convolution (zero padding) of x (B, C, H, W) with w (O, C, 3, 3), float64."""
    b, _, h, wd = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((b, w.shape[0], h, wd))
    for dy in range(3):
        for dx in range(3):
            out += np.einsum(
                "oc,bchw->bohw", w[:, :, dy, dx], padded[:, :, dy : dy + h, dx : dx + wd]
            )
    return out


class _Teacher:
    """The seeded class prototypes and random conv net (step 1 and 3 of the module docstring)."""

    def __init__(self, seed: int, classes: int):
        rng = np.random.default_rng([seed, 0])
        k = LATENT_CHANNELS
        self.prototypes = rng.standard_normal((classes, k, LATENT_SIZE, LATENT_SIZE))
        self.w1 = rng.standard_normal((HIDDEN, k, 3, 3)) / np.sqrt(9 * k)
        self.w2 = rng.standard_normal((3, HIDDEN, 3, 3)) / np.sqrt(9 * HIDDEN)
        self.up = _bilinear(LATENT_SIZE, _SIDE)
        self.scale = float(np.std(self._raw(self.prototypes)))

    def _raw(self, z: np.ndarray) -> np.ndarray:
        x = np.einsum("ij,bcjk,lk->bcil", self.up, z, self.up)
        return _conv3x3(np.tanh(_conv3x3(x, self.w1)), self.w2)

    def images(self, z: np.ndarray) -> np.ndarray:
        """Latents (B, k, 8, 8) -> uint8 images (B, 3, 32, 32)."""
        pixels = np.clip(0.5 + 0.22 * self._raw(z) / self.scale, 0.0, 1.0)
        return np.rint(pixels * 255.0).astype(np.uint8)


def _records(teacher: _Teacher, labels: np.ndarray, indices, seed: int, stream: int, noise: float):
    """uint8 images of the records `indices` of `stream`, each from its own generator."""
    indices = np.asarray(indices, dtype=np.int64)
    k, side = LATENT_CHANNELS, LATENT_SIZE
    z = np.empty((len(indices), k, side, side))
    for row, i in enumerate(indices):
        rng = np.random.default_rng([seed, stream, int(i)])
        field = teacher.prototypes[labels[i]] + noise * rng.standard_normal((k, side, side))
        dy, dx = rng.integers(-MAX_SHIFT, MAX_SHIFT + 1, size=2)
        z[row] = np.roll(field, (int(dy), int(dx)), axis=(1, 2))
    return teacher.images(z)


def _balanced_labels(n: int, classes: int, seed: int, stream: int) -> np.ndarray:
    return np.random.default_rng([seed, 3, stream]).permutation(np.arange(n) % classes)


def _check_sizes(spec: str, n: int, test: int, classes: int) -> None:
    """Refuse in one line a spec one of whose arrays would hold more than
    `records.MAX_GENERATED_NUMBERS` numbers (synthetic_logreg's limit too): the training labels
    (n), the test images (test x 3 x 32 x 32), the class prototypes (classes x the latent's size).
    Before, n=100000000000 failed with a MemoryError traceback."""
    limit = records.MAX_GENERATED_NUMBERS
    latent = LATENT_CHANNELS * LATENT_SIZE * LATENT_SIZE
    for name, count, size in (
        ("n", n, 1),
        ("test", test, 3 * _SIDE * _SIDE),
        ("classes", classes, latent),
    ):
        if count * size > limit:
            raise ValueError(
                f"{spec!r}: {name}={count} needs {count * size} numbers in one array, more than the "
                f"{limit} it builds at most; lower {name} (at most {limit // size})"
            )


def synthetic_images(spec: str, options: dict[str, Any], seed: int) -> RecordDataset:
    """``synthetic_images[:n=...,test=...,classes=...,noise=...,augment=...]`` (module docstring)."""
    opts = dict(DEFAULTS, **options)
    n, n_test, classes, noise = opts["n"], opts["test"], opts["classes"], opts["noise"]
    # noise=inf made every latent infinite: all-black images (NaN cast to uint8), silently
    if n < classes or n_test < 1 or classes < 2 or not 0 <= noise < np.inf:
        raise ValueError(
            f"{spec!r}: need classes >= 2, n >= classes, test >= 1 and a finite noise >= 0 "
            f"(got n={n}, test={n_test}, classes={classes}, noise={noise})"
        )
    if seed < 0:
        raise ValueError(f"{spec!r}: the seed must be >= 0, got {seed}")
    _check_sizes(spec, n=n, test=n_test, classes=classes)
    teacher = _Teacher(seed, classes)
    train_labels = _balanced_labels(n, classes, seed, _TRAIN_STREAM)
    test_labels = _balanced_labels(n_test, classes, seed, _TEST_STREAM)
    test_images = _records(teacher, test_labels, np.arange(n_test), seed, _TEST_STREAM, noise)

    def read_train(indices) -> tuple[torch.Tensor, torch.Tensor]:
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= n):
            raise IndexError(f"{spec!r}: record indices must lie in [0, {n})")
        x = _records(teacher, train_labels, indices, seed, _TRAIN_STREAM, noise)
        return torch.from_numpy(x), torch.from_numpy(train_labels[indices].copy())

    digest = hashlib.sha256(f"{spec};{seed};{n}".encode())
    digest.update(test_images.tobytes())
    return RecordDataset(
        num_train=n,
        x_test=_normalise(torch.from_numpy(test_images)),
        y_test=torch.from_numpy(test_labels.astype(np.int64)),
        num_classes=classes,
        input_shape=(3, _SIDE, _SIDE),
        name=spec,
        read_train=read_train,
        fingerprint=digest.hexdigest(),
        labels=lambda: train_labels.copy(),
        train_transform=cifar_augment if opts["augment"] else _drop_generator(_normalise),
    )
