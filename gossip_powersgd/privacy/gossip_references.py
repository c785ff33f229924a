"""LiRA's reference models trained the way the victim is: whole gossip runs.

`attacks.References.build` trains each reference model alone; here each reference is a whole
gossip run (`attack_run.observe`) of a given training config on the split's topology, in which
each victim trains on a random half of its candidates (members and held-out records: every
candidate in exactly half of the references, `lira.inclusion_masks`), as many records as it trains
on in the attacked run, and every other peer on its own shard (population data from the same
distribution, never a candidate: LiRA's shadow-model assumption). A reference's model of a
candidate is that candidate's victim's final model; LiRA reads its logit confidence (phi) and loss
on every candidate.

    refs = gossip_references(split, Candidates.of(split), train, count=4, seed=seed, observer=0)
    rounds = attack_run.neighbour_report(run, split, 0, refs, make_model, x_test)

A reference run costs a whole training run, so each one's statistics are cached on disk
(`reference_stats`, under `cache_dir`) and built once: a process that needs one while another
builds it waits for it, so parallel attacked runs of one seed share their references. The cache
is keyed by what determines a reference (the split, the training config, the count, the seed
and the reference's index), not by the code: clear it after changing how a reference is made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Tuple

import numpy as np
import torch

__all__ = ["cache_path", "gossip_references", "reference_stats"]


def _cache_dir() -> Path:
    return Path(tempfile.gettempdir()) / "gossip_powersgd_lira"


def cache_path(
    split, train: Mapping[str, Any], count: int, seed: int, k: int, cache_dir: Optional[Path] = None
) -> Path:
    """Where reference k's statistics are kept: a hash of what determines them (the split, the
    training config, the count and the seed)."""
    text = json.dumps([split.key(), dict(train), count, seed, k], sort_keys=True)
    name = hashlib.sha256(text.encode()).hexdigest()[:24]
    return Path(cache_dir or _cache_dir()) / f"{name}.pt"


@contextlib.contextmanager
def _locked(path: Path):
    """Hold an exclusive lock beside `path`: a second process waits while the first builds it."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def reference_stats(
    split,
    candidates,
    train: Mapping[str, Any],
    count: int,
    seed: int,
    observer: int,
    k: int,
    cache_dir: Optional[Path] = None,
) -> Tuple[np.ndarray, np.ndarray]:
    """(phi, loss) of every candidate under reference run k of `count` (the module docstring):
    `train` (a `gossip_powersgd.run` config, seeded 1000 seed + k) on `split` with `observer`
    recording, each victim on its half of the candidates that mask k of
    `lira.inclusion_masks(candidates, count, seed)` includes. Built once, cached on disk."""
    from gossip_powersgd.privacy.attack_run import observe
    from gossip_powersgd.privacy.lira import inclusion_masks, logit_confidence
    from gossip_powersgd.privacy.membership import loss_scores, model_with_parameters
    from gossip_powersgd.training.models import build_model

    path = cache_path(split, train, count, seed, k, cache_dir)
    with _locked(path):
        if path.exists():
            saved = torch.load(path, weights_only=True)
            return saved["phi"].numpy(), saved["loss"].numpy()
        base, mask = split.data(), inclusion_masks(len(candidates.y), count, seed=seed)[k]
        index = np.concatenate([np.r_[split.members[v], split.heldout[v]] for v in split.victims])
        members = dict(split.members)
        for v in split.victims:
            members[v] = np.sort(index[(candidates.victim == v) & mask])
        reference = dataclasses.replace(split, members=members)
        ran = observe(dict(train, seed=1000 * seed + k), reference, observer, (1.0,))
        phi, loss = np.empty(len(index)), np.empty(len(index))
        for v in split.victims:
            model = build_model(train["model"], base.input_shape, base.num_classes, 0)
            model = model_with_parameters(model, ran.snapshots[v][ran.steps[-1]])
            where = np.flatnonzero(candidates.victim == v)
            x, y = candidates.x[torch.from_numpy(where)], candidates.y[torch.from_numpy(where)]
            phi[where], loss[where] = logit_confidence(model, x, y), -loss_scores(model, x, y)
        partial = path.with_suffix(".part")
        torch.save({"phi": torch.from_numpy(phi), "loss": torch.from_numpy(loss)}, partial)
        os.replace(partial, path)
        return phi, loss


def gossip_references(
    split,
    candidates,
    train: Mapping[str, Any],
    count: int,
    seed: int,
    observer: int,
    cache_dir: Optional[Path] = None,
):
    """`count` reference runs by gossip (`reference_stats`, k = 0 .. count - 1) and the blind
    model (trained alone on the observer's shard in `train`'s recipe, as `References.build`
    does): an `attacks.References`, whose `seconds` is the CPU time this call took."""
    from gossip_powersgd.privacy.attacks import References
    from gossip_powersgd.privacy.lira import inclusion_masks, train_classifier
    from gossip_powersgd.training.models import build_model

    started, base = time.process_time(), split.data()
    stats = [
        reference_stats(split, candidates, train, count, seed, observer, k, cache_dir)
        for k in range(count)
    ]
    phi, loss = np.stack([p for p, _ in stats]), np.stack([q for _, q in stats])

    def make():
        return build_model(train["model"], base.input_shape, base.num_classes, 0)

    own_x, own_y = split.member_set(observer)
    recipe = dict(epochs=train["epochs"], lr=train["lr"], batch=train["batch_size"])
    recipe.update(momentum=train["momentum"], warmup_epochs=train["warmup_epochs"])
    torch.manual_seed(1000 * seed + count)
    blind = train_classifier(make, own_x, own_y, seed=1000 * seed + count, **recipe)
    masks = inclusion_masks(len(candidates.y), count, seed=seed)
    return References(masks, phi, loss, blind, time.process_time() - started)
