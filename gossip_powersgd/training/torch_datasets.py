"""Bring-your-own torch Datasets as a `records.RecordDataset`.

A bring-your-own dataset function may return ``(train, test)``, two map-style torch Datasets
(``len`` and ``[i] -> (x, y)``), instead of four arrays: a peer calls ``train[i]`` for the
indices of its own shard only (once, at start-up). Non-IID partitions need the labels of every
record: give the training Dataset a ``targets`` attribute (as torchvision's do). What the peers
compare (and each checkpoint records) is the test set, every label of ``targets`` and the training
records a Dataset holds in memory (a TensorDataset's tensors, an array ``data`` of one row per
record); records read only through ``train[i]`` are not compared, as no peer reads all of them.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from .records import RecordDataset

__all__ = ["checked_labels", "torch_datasets"]


def checked_labels(y: torch.Tensor, spec: str, name: str) -> torch.Tensor:
    """`y` as int64 class labels, refusing (one line naming `name`) what is not one: a fraction
    (a cast would truncate 2.7 to class 2), NaN, a bool or complex value, or a negative label
    (cross-entropy skips -100 silently and fails on any other)."""
    if y.is_floating_point():
        if not torch.equal(y, torch.round(y)):  # NaN is unequal to itself: refused too
            raise ValueError(f"dataset spec {spec!r}: {name} must hold integer class labels")
    elif y.dtype == torch.bool or y.is_complex():
        raise ValueError(
            f"dataset spec {spec!r}: {name} must hold integer class labels, not {y.dtype}"
        )
    y = y.to(torch.int64)
    if y.numel() and int(y.min()) < 0:
        raise ValueError(f"dataset spec {spec!r}: {name} has negative labels")
    return y


def _stack(dataset, indices, spec: str, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = [], []
    for i in indices:
        try:
            x, y = dataset[int(i)]
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"dataset spec {spec!r}: {what}[{int(i)}] must be a pair (x, y): {exc}"
            ) from None
        xs.append(torch.as_tensor(np.asarray(x) if not torch.is_tensor(x) else x))
        ys.append(torch.as_tensor(y))
    if not xs:
        raise ValueError(f"dataset spec {spec!r}: the {what} Dataset is empty")
    labels = checked_labels(torch.stack(ys), spec, f"the {what} Dataset")
    return torch.stack(xs).to(torch.float32), labels


def _digest_training_set(digest, train, targets, n: int) -> None:
    """Add to `digest` what is known of the training set without reading a record through
    ``train[i]`` (a peer reads only its own shard's): every label of ``targets``, and the records
    held in memory, a TensorDataset's tensors or an array ``data`` of one row per record (as
    torchvision's MNIST and CIFAR hold)."""
    if targets is not None:
        labels = np.ascontiguousarray(np.asarray(targets, dtype=np.int64))
        digest.update(f"targets:{labels.shape};".encode() + labels.tobytes())
    arrays = list(train.tensors) if isinstance(train, torch.utils.data.TensorDataset) else []
    data = getattr(train, "data", None)
    if not arrays and isinstance(data, (np.ndarray, torch.Tensor)) and data.ndim and len(data) == n:
        arrays = [data]
    for array in arrays:
        digest.update(f"records:{tuple(array.shape)}:{array.dtype};".encode())
        if isinstance(array, torch.Tensor):
            digest.update(array.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
        elif array.dtype.kind in "biufc":  # not objects or strings (whose bytes are pointers)
            digest.update(np.ascontiguousarray(array).tobytes())


def torch_datasets(spec: str, train, test) -> RecordDataset:
    """A bring-your-own function's ``(train, test)`` torch Datasets as a `RecordDataset`."""
    x_test, y_test = _stack(test, range(len(test)), spec, "test")
    n = len(train)
    if n == 0:
        raise ValueError(f"dataset spec {spec!r}: the training Dataset is empty")
    classes = getattr(train, "classes", None)
    targets = getattr(train, "targets", None)
    num_classes = len(classes) if classes is not None else int(y_test.max()) + 1
    if targets is not None:
        num_classes = max(num_classes, int(np.max(np.asarray(targets))) + 1)

    def read_train(indices):
        x, y = _stack(train, indices, spec, "train")
        # the model is built and checked for the test records' shape: another shape failed
        # deep inside the model at the first training step
        if tuple(x.shape[1:]) != tuple(x_test.shape[1:]):
            raise ValueError(
                f"dataset spec {spec!r}: training records have shape {tuple(x.shape[1:])} but "
                f"test records {tuple(x_test.shape[1:])}; return records of one shape"
            )
        if len(y) and int(y.max()) >= num_classes:
            raise ValueError(
                f"dataset spec {spec!r}: training label {int(y.max())} is out of range for "
                f"{num_classes} classes; give the Dataset a classes or targets "
                "attribute"
            )
        return x, y

    digest = hashlib.sha256(f"{n};{num_classes};".encode())
    digest.update(x_test.numpy().tobytes())
    digest.update(y_test.numpy().tobytes())
    _digest_training_set(digest, train, targets, n)
    return RecordDataset(
        num_train=n,
        x_test=x_test,
        y_test=y_test,
        num_classes=num_classes,
        input_shape=tuple(x_test.shape[1:]),
        name=spec,
        read_train=read_train,
        fingerprint=digest.hexdigest(),
        labels=None if targets is None else (lambda: np.asarray(targets, dtype=np.int64)),
    )
