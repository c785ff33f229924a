"""Datasets and each peer's share of them (partitions are in `partition.py`, the batch iterators in
`batches.py`).

Everything in this module is computed locally and deterministically from seeds. A peer's raw data
never crosses the transport: every peer loads (or generates) the same dataset, computes the same
partition from the same seed with a numpy ``Generator`` (PCG64), and keeps only its own slice.

Dataset specs (``load_dataset``)::

    "mnist1d"                                  the mnist1d package's local generator, 4000/1000 x 40
    "mnist1d:num_samples=1000,shuffle_seq=1"   same, with generator options
    "synthetic_logreg"                         seeded linear classification problem
    "synthetic_logreg:d=20,classes=4,n=4000,noise=0.1,test=0.2"
    "synthetic_images:n=4096,test=1000,noise=1.0"
                                               a CIFAR-shaped synthetic stand-in (3 x 32 x 32,
                                               10 classes; `synthetic_images.py`), generated
                                               record by record: each peer makes only its shard
    "package.module:function"                  bring your own: function() or function(seed=seed)
                                               returns (x_train, y_train, x_test, y_test), or
                                               (train, test) torch Datasets (`records.py`)
    "cifar10:root=DIR"  "wikitext2:root=DIR,bptt=35"
                                               read from local files, record by record: each
                                               peer reads only its shard (`records.py`)

Partition specs (``partition`` / ``peer_shard``)::

    "iid"            seeded random split, sizes differ by at most one
    "contiguous"     peer r takes the r-th of num_peers consecutive runs of records (a language
                     model's text in contiguous chunks), sizes differ by at most one
    "dirichlet:0.5"  per-class proportions across peers ~ Dir(alpha * 1)
    "shards:2"       label-sorted data cut into num_peers * k shards, k random shards per peer
    "local"          data that exists only on its peer: the bring-your-own function is called as
                     function(rank=r, num_peers=n[, seed=s]) on peer r and returns that peer's
                     (x_train, y_train, x_test, y_test) only; x_test and y_test may be None, and the
                     peer then evaluates on the shared test set function(rank=None, num_peers=n)
                     returns as (x_test, y_test). Peers agree on sizes and the number of classes
                     through scalar collectives (``agree_local_dataset``); no sample moves.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import threading
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import torch

from ..specs import UserCodeExit, accepts, import_object, parse_spec, unknown_name, user_code
from .batches import Batches, ResumableBatches  # noqa: F401 (the iterators' home is batches.py)
from .datasets import DATASETS, IN_MEMORY_DATA, WHAT
from .torch_datasets import checked_labels
from .partition import (  # noqa: F401 (partitions' home is partition.py; re-exported here)
    LOCAL_PARTITION,
    PARTITION_NAMES,
    PARTITION_WHAT,
    _as_numpy_labels,
    label_histogram,
    partition,
    skew,
)

if TYPE_CHECKING:
    from ..comm.base import Comm


__all__ = [
    "Dataset",
    "dataset_digest",
    "content_digests",
    "load_dataset",
    "clear_dataset_cache",
    "partition",
    "peer_shard",
    "label_histogram",
    "skew",
    "load_peer_dataset",
    "agree_local_dataset",
    "LOCAL_PARTITION",
    "Batches",
    "DATASET_NAMES",  # noqa: F822 (module __getattr__: the registered datasets)
    "PARTITION_NAMES",
]


def __getattr__(name: str):
    """`DATASET_NAMES`: how each registered dataset (`datasets.DATASETS`) and a bring-your-own one
    are spelled, read when asked (a dataset registered later is listed too)."""
    if name == "DATASET_NAMES":
        return DATASETS.accepted()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)  # == on tensors is ambiguous: compare by identity
class Dataset:
    """A classification dataset held in memory.

    ``x_*`` are float32 tensors of shape ``(N, *input_shape)``, ``y_*`` int64 tensors of shape
    ``(N,)`` with values in ``[0, num_classes)``. Instances come from an in-process cache shared by
    every thread, so treat the tensors as read-only (``peer_shard`` returns copies).
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    name: str
    #: Whether every peer holds this same test set (False for a peer's own test data under
    #: ``partition: local``): only shared data is compared across peers.
    shared_test: bool = True

    #: In-memory datasets need no per-batch transform (see `records.RecordDataset`).
    train_transform = None

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    def partition_labels(self, spec: str) -> torch.Tensor:
        """The labels `partition` splits by (all of them: they are in memory)."""
        return self.y_train

    def read_train(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the training samples at `indices` (advanced indexing copies)."""
        index = torch.as_tensor(np.asarray(indices, dtype=np.int64)).to(self.y_train.device)
        return self.x_train[index], self.y_train[index]

    @property
    def num_test(self) -> int:
        return len(self.y_test)


# Peers that are threads of one process all call load_dataset at start-up; one lock makes the first
# caller generate while the others wait and then share the result. Re-entrant so that a
# bring-your-own loader may itself call load_dataset. The least recently loaded dataset is
# forgotten beyond CACHED_DATASETS (a seed sweep in one process kept every seed's test set).
_CACHE: "collections.OrderedDict[tuple[str, int], Dataset]" = collections.OrderedDict()
#: How many (spec, seed) datasets the in-process cache keeps.
CACHED_DATASETS = 8
#: Of each cached file dataset, its files' `_files_stamp` when it was read.
_STAMPS: dict[tuple[str, int], tuple] = {}
_CACHE_LOCK = threading.RLock()


def load_dataset(name: str, seed: int = 0) -> Dataset:
    """Load or generate the dataset named by ``name`` (see the module docstring for specs).

    Deterministic from ``seed``; cached in-process by ``(name, seed)`` (the `CACHED_DATASETS`
    loaded last) and thread-safe. A file dataset is read again when one of its files changed
    since (size, modification time or inode): a second `run` in one process trains on the files
    as they are, not as they were.
    """
    key = (name.strip() if isinstance(name, str) else name, int(seed))
    with _CACHE_LOCK:
        cached = _CACHE.get(key)
        if cached is not None and _files_stamp(cached) != _STAMPS.get(key):
            cached = None
        if cached is None:
            cached = _build_dataset(key[0], key[1])
            _CACHE[key] = cached
            _STAMPS[key] = _files_stamp(cached)
        _CACHE.move_to_end(key)
        while len(_CACHE) > CACHED_DATASETS:
            _STAMPS.pop(_CACHE.popitem(last=False)[0], None)
        return cached


def _files_stamp(dataset) -> tuple:
    """(path, size, mtime, inode) of each file `dataset` was read from (a `records.DataFile`);
    a file gone or unreadable stamps as None, unequal to any earlier stamp."""
    stamp = []
    for f in getattr(dataset, "files", ()):
        try:
            st = os.stat(f.path)
            stamp.append((f.path, st.st_size, st.st_mtime_ns, st.st_ino))
        except OSError:
            stamp.append((f.path, None))
    return tuple(stamp)


def clear_dataset_cache() -> None:
    """Forget every cached dataset (tests; freeing memory after peers took their shards)."""
    with _CACHE_LOCK:
        _CACHE.clear()
        _STAMPS.clear()


def _build_dataset(spec: str, seed: int) -> Dataset:
    parsed = parse_spec(spec, WHAT)  # the one spec grammar (topologies.grammar via specs)
    if parsed.name in DATASETS:
        kind = DATASETS.get(parsed.name)
        loaded = kind.load(spec, kind.parse(spec, parsed), seed)
        if not isinstance(loaded, (tuple, list)):
            return loaded  # a Dataset, or a RecordDataset that reads per peer
        arrays, classes = (loaded, None) if len(loaded) == 4 else (loaded[:4], loaded[4])
        return _make_dataset_record(spec, *arrays, num_classes=classes)
    if ":" in spec:  # anything else with a colon is "package.module:function"
        return _byo_dataset(spec, seed)
    raise unknown_name(WHAT, spec, parsed.name, DATASETS.accepted())


def _byo_dataset(spec: str, seed: int) -> Dataset:
    fn = import_object(spec, DATASETS.accepted())
    try:
        with user_code(spec, "calling it"):
            result = fn(seed=seed) if accepts(fn, "seed") else fn()
    except UserCodeExit:
        raise
    except Exception as exc:
        raise ValueError(
            f"dataset spec {spec!r}: calling it raised {type(exc).__name__}: {exc}"
        ) from exc
    if (
        isinstance(result, (tuple, list))
        and len(result) == 2
        and all(hasattr(d, "__getitem__") and hasattr(d, "__len__") for d in result)
    ):
        from .torch_datasets import torch_datasets

        return torch_datasets(spec, *result)
    if not isinstance(result, (tuple, list)) or len(result) != 4:
        raise ValueError(
            f"dataset spec {spec!r}: must return a tuple (x_train, y_train, x_test, y_test) or "
            f"two torch Datasets (train, test), got {type(result).__name__}"
        )
    return _make_dataset_record(spec, *result, num_classes=None)


def _make_dataset_record(spec, x_train, y_train, x_test, y_test, num_classes) -> Dataset:
    """Validate and convert four arrays into a Dataset (float32 x, int64 y)."""
    xs, ys = [], []
    for what, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        try:
            x = torch.as_tensor(np.asarray(x) if not torch.is_tensor(x) else x).to(torch.float32)
            y = torch.as_tensor(np.asarray(y) if not torch.is_tensor(y) else y)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(
                f"dataset spec {spec!r}: {what} arrays are not numeric ({exc})"
            ) from None
        if x.ndim < 1 or y.ndim != 1:
            raise ValueError(
                f"dataset spec {spec!r}: y_{what} must be 1-D and x_{what} at least 1-D, "
                f"got shapes {tuple(x.shape)} and {tuple(y.shape)}"
            )
        if len(x) != len(y):
            raise ValueError(
                f"dataset spec {spec!r}: x_{what} has {len(x)} samples but y_{what} has {len(y)}"
            )
        y = checked_labels(y, spec, f"y_{what}")
        xs.append(x.contiguous())
        ys.append(y.contiguous())
    if len(ys[0]) == 0:
        raise ValueError(f"dataset spec {spec!r}: the training set is empty")
    if len(ys[1]) == 0:
        # An empty test set would be reported as 0 % accuracy, which reads as a result.
        raise ValueError(
            f"dataset spec {spec!r}: the test set is empty; return at least one test sample (x_test, y_test)"
        )
    if xs[0].shape[1:] != xs[1].shape[1:]:
        raise ValueError(
            f"dataset spec {spec!r}: train samples have shape {tuple(xs[0].shape[1:])} but test "
            f"samples {tuple(xs[1].shape[1:])}"
        )
    num_classes = _checked_class_count(spec, ys, num_classes)
    return Dataset(
        x_train=xs[0],
        y_train=ys[0],
        x_test=xs[1],
        y_test=ys[1],
        num_classes=int(num_classes),
        input_shape=tuple(xs[0].shape[1:]),
        name=spec,
    )


def load_peer_dataset(spec: str, rank: int, num_peers: int, seed: int = 0) -> Dataset:
    """``partition: local``: peer ``rank``'s own data from a bring-your-own function.

    ``function(rank=rank, num_peers=num_peers[, seed=seed])`` returns this peer's
    ``(x_train, y_train, x_test, y_test)``; with ``x_test`` and ``y_test`` None the shared test set
    is ``function(rank=None, num_peers=num_peers[, seed=seed])``, a pair ``(x_test, y_test)``. The
    record's ``num_classes`` is this peer's own (largest label + 1): `agree_local_dataset` makes it
    the peers' common one. Nothing is cached: the data belongs to this peer alone.
    """
    parsed = parse_spec(spec, WHAT)
    if parsed.name in DATASETS or ":" not in spec:
        raise ValueError(
            f"partition: local needs a bring-your-own dataset 'package.module:function'"
            f" taking rank and num_peers, got dataset {spec!r}; or use partition: iid"
        )
    fn = import_object(spec, DATASETS.accepted())
    if not (accepts(fn, "rank") and accepts(fn, "num_peers")):
        raise ValueError(
            f"dataset spec {spec!r}: with partition: local the dataset function must take the "
            f"arguments rank and num_peers (and return only that peer's data)"
        )
    kwargs = {"num_peers": int(num_peers), **({"seed": seed} if accepts(fn, "seed") else {})}

    def call(who):
        try:
            with user_code(spec, f"calling it with rank={who}"):
                return fn(rank=who, **kwargs)
        except UserCodeExit:
            raise
        except Exception as exc:
            raise ValueError(
                f"dataset spec {spec!r}: calling it with rank={who} raised {type(exc).__name__}: {exc}"
            ) from exc

    result = call(int(rank))
    if not isinstance(result, (tuple, list)) or len(result) != 4:
        raise ValueError(
            f"dataset spec {spec!r}: must return this peer's tuple (x_train, y_train, x_test, "
            f"y_test), got {type(result).__name__}"
        )
    x_train, y_train, x_test, y_test = result
    shared_test = x_test is None and y_test is None
    if shared_test:
        shared = call(None)
        if not isinstance(shared, (tuple, list)) or len(shared) != 2:
            raise ValueError(
                f"dataset spec {spec!r}: with rank=None it must return the shared test set "
                f"(x_test, y_test), got {type(shared).__name__}"
            )
        x_test, y_test = shared
    if x_test is None or y_test is None:
        raise ValueError(
            f"dataset spec {spec!r}: rank {rank} returned only one of x_test and y_test; return "
            f"both, or both None to use the shared test set"
        )
    dataset = dataclasses.replace(
        _make_dataset_record(spec, x_train, y_train, x_test, y_test, num_classes=None),
        shared_test=shared_test,
    )
    if dataset.num_test == 0:
        raise ValueError(
            f"dataset spec {spec!r}: rank {rank} has an empty test set; return at least one test "
            f"sample, or None, None for the shared test set"
        )
    return dataset


def agree_local_dataset(
    comm: Comm, dataset: Dataset, share_size: bool = True
) -> tuple[Dataset, Optional[int]]:
    """This peer's local dataset with the peers' common ``num_classes``, and the total training size.

    Collective, scalars only (metric traffic): the largest label (the models' output width must
    agree), an agreement check on the input shape, and with ``share_size`` the sum of the shard
    sizes (else the total is None: the shard sizes are private, see
    `privacy.training.keeps_peer_statistics_private`).
    """
    comm.check_agreement("input shape of the local dataset", repr(tuple(dataset.input_shape)))
    total = None
    if share_size:
        sizes = torch.tensor([float(dataset.num_train)], dtype=torch.float64)
        total = int(comm.allreduce_(sizes, op="sum", metric=True)[0])
    classes = comm.allreduce_(
        torch.tensor([float(dataset.num_classes)], dtype=torch.float64), op="max", metric=True
    )
    return dataclasses.replace(dataset, num_classes=int(classes[0])), total


#: A bring-your-own dataset's class count is its largest label + 1; it may exceed the number of
#: distinct labels seen by this factor plus `_SPARE_CLASSES` (classes absent from a small dataset)
#: but no more: a stray label such as 10**9 would otherwise mean a 10**9-wide output layer and
#: label histogram (gigabytes) before the first step.
_CLASS_COUNT_FACTOR = 2
_SPARE_CLASSES = 16


def _checked_class_count(spec, ys, num_classes) -> int:
    """`num_classes`, or for a bring-your-own dataset (None) the count its labels imply, after
    checking every label lies in [0, num_classes) (before anything is sized by it)."""
    largest = max(int(y.max()) for y in ys if len(y))
    which = "train" if len(ys[0]) and int(ys[0].max()) == largest else "test"
    if num_classes is None:
        seen = len(torch.unique(torch.cat(ys)))
        limit = _CLASS_COUNT_FACTOR * seen + _SPARE_CLASSES
        if largest + 1 > limit:
            raise ValueError(
                f"dataset spec {spec!r}: label {largest} in y_{which} implies {largest + 1} classes "
                f"but only {seen} distinct labels occur; number the classes "
                f"0..K-1 (at most {limit} classes for these labels)"
            )
        return largest + 1
    if largest >= num_classes:
        raise ValueError(
            f"dataset spec {spec!r}: label {largest} in y_{which} is out of range for "
            f"{num_classes} classes (labels must be 0..{num_classes - 1})"
        )
    return int(num_classes)


def dataset_digest(dataset: Dataset, parts: Sequence[str] = ("train", "test")) -> str:
    """A sha256 over the sizes, dtypes and bytes of `dataset`'s arrays of `parts` and its class
    count: peers compare it to be sure they loaded the same data (the digest, never the data)."""
    h = hashlib.sha256(f"classes={dataset.num_classes};".encode())
    if hasattr(dataset, "fingerprint"):  # a RecordDataset: its files' digest, no record read
        h.update(dataset.fingerprint.encode())
        return h.hexdigest()
    for part in parts:
        for kind in ("x", "y"):
            tensor = getattr(dataset, f"{kind}_{part}")
            h.update(f"{kind}_{part}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
            h.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def content_digests(dataset) -> dict[str, str]:
    """{what: sha256} of the data this peer trains and evaluates on, which its checkpoints record
    so that a resumed run refuses changed data naming it: each file of a file dataset (by path),
    else the in-memory arrays as a whole (named by the spec). Computed once, where the data is read.
    """
    files = getattr(dataset, "files", ())
    if files:
        return {f.path: f.sha256 for f in files}
    return {f"{IN_MEMORY_DATA}{dataset.name!r}": dataset_digest(dataset)}


# --------------------------------------------------------------------------------------------------
# A peer's shard
# --------------------------------------------------------------------------------------------------


def peer_shard(
    dataset: Dataset, rank: int, num_peers: int, spec: str, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This peer's own training samples ``(x, y)`` under ``partition(..., spec, seed)``.

    The returned tensors are fresh copies of just this peer's rows, so the caller may drop the
    shared dataset afterwards (e.g. ``clear_dataset_cache()``) without keeping it alive. A
    `records.RecordDataset` reads only these records (its other records are never touched).
    """
    if not 0 <= rank < num_peers:
        raise ValueError(f"rank {rank} out of range for {num_peers} peers")
    if spec == LOCAL_PARTITION:  # `dataset` is this peer's own (load_peer_dataset)
        return dataset.x_train.clone(), dataset.y_train.clone()
    mine = partition(dataset.partition_labels(spec), num_peers, spec, seed)[rank]
    return dataset.read_train(mine)
