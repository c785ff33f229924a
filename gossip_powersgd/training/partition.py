"""Per-peer partitions of a dataset's training records: pure functions of (labels, peers, spec, seed).

Partition specs (``partition``; `data.peer_shard` cuts a peer's records with it)::

    "iid"            seeded random split, sizes differ by at most one
    "contiguous"     peer r takes the r-th of num_peers consecutive runs of records (a language
                     model's text in contiguous chunks), sizes differ by at most one
    "dirichlet:0.5"  per-class proportions across peers ~ Dir(alpha * 1)
    "shards:2"       label-sorted data cut into num_peers * k shards, k random shards per peer
    "local"          data that exists only on its peer (`data.load_peer_dataset`): no global split

Every peer computes the same partition from the same seed with a numpy ``Generator`` (PCG64) and
keeps only its own part; nothing is communicated.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..specs import Spec, check_options, parse_spec, spec_error, unknown_name

__all__ = [
    "partition",
    "partition_meaning",
    "label_histogram",
    "skew",
    "LOCAL_PARTITION",
    "PARTITION_NAMES",
]

PARTITION_NAMES = ("iid", "dirichlet:<alpha>", "shards:<k>", "contiguous", "local")
#: The partition whose data is never split by us: each peer's function call returns its own.
LOCAL_PARTITION = "local"
#: What a partition spec is called in its errors (the one error style, `specs.spec_error`).
PARTITION_WHAT = "partition spec"
#: The partitions that take one number: its name, type and an example spec.
_PARTITION_NUMBER = {
    "dirichlet": ("alpha", float, "dirichlet:0.5"),
    "shards": ("k", int, "shards:2"),
}

# Dirichlet draws can leave a peer with no samples at all (likely for small alpha and many peers).
# We redraw the whole partition up to this many times, then repair what is left (see _dirichlet).
_DIRICHLET_TRIES = 100


def _as_numpy_labels(labels) -> np.ndarray:
    if torch.is_tensor(labels):
        labels = labels.detach().cpu().numpy()
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    return labels


def partition(labels, num_peers: int, spec: str, seed: int) -> list[np.ndarray]:
    """Split the training indices ``0..len(labels)-1`` among ``num_peers`` peers.

    Returns one sorted int64 index array per peer; the arrays are disjoint, non-empty and together
    cover every index. The result depends only on ``(labels, num_peers, spec, seed)``, so all peers
    compute the same partition without communicating.
    """
    labels = _as_numpy_labels(labels)
    n = len(labels)
    if isinstance(num_peers, bool) or int(num_peers) != num_peers or num_peers < 1:
        raise ValueError(f"num_peers must be a positive integer, got {num_peers!r}")
    num_peers = int(num_peers)
    if num_peers > n:
        raise ValueError(
            f"cannot split {n} samples among {num_peers} peers: "
            f"use at most {n} peers or a larger dataset"
        )

    parsed = parse_spec(spec, PARTITION_WHAT, imports=False)  # the one spec grammar
    head = parsed.name
    if head in _PARTITION_NUMBER:
        value = _partition_number(spec, parsed)
    elif head in ("iid", "contiguous", LOCAL_PARTITION) and (parsed.positional or parsed.options):
        raise spec_error(PARTITION_WHAT, spec, f"{head} takes no argument; write {head!r}")
    if head == LOCAL_PARTITION:
        raise ValueError(
            "partition: local has no global split to compute: each peer's dataset "
            "function returns its own data (load_peer_dataset)"
        )
    rng = np.random.default_rng(np.random.PCG64(seed))
    if head == "iid":
        parts = np.array_split(rng.permutation(n), num_peers)
    elif head == "contiguous":
        parts = np.array_split(np.arange(n), num_peers)
    elif head == "dirichlet":
        if not np.isfinite(value) or value <= 0:
            raise spec_error(
                PARTITION_WHAT,
                spec,
                "Dirichlet alpha must be > 0 (e.g. dirichlet:0.5; smaller is more skewed)",
            )
        parts = _dirichlet(labels, num_peers, value, rng)
    elif head == "shards":
        if value < 1:
            raise spec_error(PARTITION_WHAT, spec, "shards per peer k must be >= 1 (e.g. shards:2)")
        if num_peers * value > n:
            raise spec_error(
                PARTITION_WHAT,
                spec,
                f"{num_peers} peers x {value} shards = {num_peers * value} shards but only "
                f"{n} samples; use fewer peers or a smaller k",
            )
        parts = _shards(labels, num_peers, value, rng)
    else:
        raise unknown_name(PARTITION_WHAT, spec, head, PARTITION_NAMES)
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def partition_meaning(spec: str) -> tuple:
    """What `spec` splits by, whatever its spelling, for a resume to compare: its name and its
    number ("dirichlet:0.5", "dirichlet:alpha=0.50" -> ("dirichlet", 0.5); None for the
    partitions without one). A ValueError for a spec that does not parse."""
    parsed = parse_spec(spec, PARTITION_WHAT, imports=False)
    if parsed.name in _PARTITION_NUMBER:
        return parsed.name, _partition_number(spec, parsed)
    return parsed.name, parsed.positional, tuple(sorted(parsed.options.items()))


def _partition_number(spec: str, parsed: Spec):
    """The one number of ``"dirichlet:0.5"`` / ``"shards:2"``, given positionally or by its name
    (``"dirichlet:alpha=0.5"``), converted and checked to be there exactly once."""
    name, kind, example = _PARTITION_NUMBER[parsed.name]
    check_options(parsed, (name,), PARTITION_WHAT, spec)
    values = [*parsed.positional, *parsed.options.values()]
    if not values:
        raise spec_error(PARTITION_WHAT, spec, f"missing {name}, write it like {example}")
    if len(values) > 1:
        raise spec_error(PARTITION_WHAT, spec, f"takes one value, {name}; write it like {example}")
    try:
        return kind(values[0])
    except ValueError:
        raise spec_error(
            PARTITION_WHAT,
            spec,
            f"{name} must be a{'n integer' if kind is int else ' number'}, write it like {example}",
        ) from None


def _dirichlet(
    labels: np.ndarray, num_peers: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Per class, split its (shuffled) indices across peers in proportions ~ Dir(alpha * 1).

    Empty peers: the whole draw is repeated (from the same generator, so still deterministic) up
    to ``_DIRICHLET_TRIES`` times until every peer has at least one sample. If every try leaves
    someone empty (tiny datasets, extreme alpha), the last draw is repaired: each empty peer in
    turn takes one random sample from the currently largest peer. Conditioning on non-empty
    peers is the usual practice; the repair changes at most ``num_peers - 1`` samples.
    """
    classes = np.unique(labels)
    by_class = [np.flatnonzero(labels == c) for c in classes]
    parts: list[list[np.ndarray]] = []
    for _ in range(_DIRICHLET_TRIES):
        parts = [[] for _ in range(num_peers)]
        for idx in by_class:
            idx = rng.permutation(idx)
            proportions = rng.dirichlet(np.full(num_peers, alpha))
            # Extreme alphas can underflow to all zeros; treat that as "all to one random peer".
            if not np.all(np.isfinite(proportions)) or proportions.sum() <= 0:
                proportions = np.eye(num_peers)[rng.integers(num_peers)]
            counts = rng.multinomial(len(idx), proportions / proportions.sum())
            for peer, chunk in enumerate(np.split(idx, np.cumsum(counts)[:-1])):
                parts[peer].append(chunk)
        if all(sum(len(c) for c in peer) > 0 for peer in parts):
            break
    flat = [np.concatenate(p) if p else np.empty(0, np.int64) for p in parts]
    for peer in range(num_peers):
        if len(flat[peer]) == 0:
            donor = int(np.argmax([len(f) for f in flat]))
            take = int(rng.integers(len(flat[donor])))
            flat[peer] = flat[donor][take : take + 1]
            flat[donor] = np.delete(flat[donor], take)
    return flat


def _shards(
    labels: np.ndarray, num_peers: int, k: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """McMahan et al.'s pathological non-IID split: label-sorted shards, k per peer."""
    # Shuffle before the stable sort so that which samples of a class share a shard is random.
    shuffled = rng.permutation(len(labels))
    order = shuffled[np.argsort(labels[shuffled], kind="stable")]
    shards = np.array_split(order, num_peers * k)
    owner = rng.permutation(num_peers * k)
    return [
        np.concatenate([shards[s] for s in owner[p * k : (p + 1) * k]]) for p in range(num_peers)
    ]


def label_histogram(y, num_classes: int) -> list[int]:
    """Number of samples of each class ``0..num_classes-1`` in ``y``."""
    y = _as_numpy_labels(y).astype(np.int64, copy=False)
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), found {y.min()}..{y.max()}")
    return np.bincount(y, minlength=num_classes).tolist()


def skew(partitions: Sequence[np.ndarray], labels, num_classes: int) -> float:
    """Mean total-variation distance between each peer's label distribution and the global one.

    0 means every peer sees the global class mix; values near 1 mean peers see disjoint classes.
    """
    labels = _as_numpy_labels(labels)
    global_dist = np.asarray(label_histogram(labels, num_classes), dtype=np.float64)
    global_dist /= global_dist.sum()
    distances = []
    for peer, idx in enumerate(partitions):
        if len(idx) == 0:
            raise ValueError(f"peer {peer} has no samples; its label distribution is undefined")
        local = np.asarray(label_histogram(labels[np.asarray(idx)], num_classes), np.float64)
        distances.append(0.5 * np.abs(local / local.sum() - global_dist).sum())
    return float(np.mean(distances))
