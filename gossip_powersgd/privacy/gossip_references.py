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

A reference run costs a whole training run, so each one's statistics are cached on disk and built
once (`reference_stats`, through `training.data_cache`: in ``$GOSSIP_POWERSGD_CACHE``, else
``~/.cache/gossip_powersgd``, a folder of this user's; ``off`` builds them in every call): a
process that needs one while another builds it waits for it, so parallel attacked runs of one seed
share their references. The key is what determines a reference: the split, the training config,
the count, the seed, the reference's index, the observer, torch's version and this library's source
(`data_cache.code_digest`: a reference of older code is never read as this code's). Each file
holds the digest of its arrays, checked on every read: a damaged or altered file is built again.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Tuple

import numpy as np
import torch

from ..training import data_cache

__all__ = ["cache_path", "gossip_references", "reference_stats"]


#: The name of the cache files (`data_cache.cache_file`).
CACHE_NAME = "lira-gossip-reference"


def _recipe(split, train: Mapping[str, Any], count: int, seed: int, k: int, observer: int):
    identity = dict(split=split.key(), train=dict(train), count=count, seed=seed, k=k)
    return dict(identity, observer=observer, code=data_cache.code_digest())


def _check_candidates(split, candidates) -> None:
    """Refuse in one line candidates other than `Candidates.of(split)`'s (every victim's records,
    in the split's order): the references' masks and statistics are indexed by those, and the
    cache key names the split alone. Before, a subset (`Candidates.of(split, victims=...)`) failed
    with an IndexError traceback, or, its statistics cached, was given another's."""
    sizes = [len(split.members[v]) + len(split.heldout[v]) for v in split.victims]
    expected = np.repeat(np.asarray(split.victims, dtype=np.int64), sizes)
    if not np.array_equal(np.asarray(candidates.victim), expected):
        peers = list(dict.fromkeys(np.asarray(candidates.victim).tolist()))
        raise ValueError(
            f"gossip references take the candidates of every victim of the split "
            f"{list(split.victims)}, got those of peers {peers}: pass Candidates.of(split), or "
            f"make the split with victims={peers}"
        )


def _settings(train: Mapping[str, Any]):
    """`train` with every key it leaves out at its default (a `TrainConfig`): the model and the
    blind model's recipe read from it, whatever the caller spelled out."""
    from gossip_powersgd.training.config import config_from_dict

    return config_from_dict(dict(train))


def cache_path(
    split,
    train: Mapping[str, Any],
    count: int,
    seed: int,
    k: int,
    cache_dir: Optional[Path] = None,
    observer: int = 0,
) -> Optional[Path]:
    """Where reference k's statistics are kept (`cache_dir`, else the cache's folder): named by a
    hash of what determines them (the module docstring); None when caching is off."""
    recipe = _recipe(split, train, count, seed, k, observer)
    return data_cache.cache_file(CACHE_NAME, recipe, ("torch",), cache_dir)


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
    `lira.inclusion_masks(candidates, count, seed)` includes. Built once, cached on disk (in
    `cache_dir` if given)."""
    from gossip_powersgd.privacy.attack_run import observe
    from gossip_powersgd.privacy.lira import inclusion_masks, logit_confidence
    from gossip_powersgd.privacy.membership import loss_scores, model_with_parameters
    from gossip_powersgd.training.models import build_model

    _check_candidates(split, candidates)

    def build():
        base, mask = split.data(), inclusion_masks(len(candidates.y), count, seed=seed)[k]
        index = np.concatenate([np.r_[split.members[v], split.heldout[v]] for v in split.victims])
        members = dict(split.members)
        for v in split.victims:
            members[v] = np.sort(index[(candidates.victim == v) & mask])
        reference = dataclasses.replace(split, members=members)
        ran = observe(dict(train, seed=1000 * seed + k), reference, observer, (1.0,))
        phi, loss = np.empty(len(index)), np.empty(len(index))
        for v in split.victims:
            model = build_model(_settings(train).model, base.input_shape, base.num_classes, 0)
            model = model_with_parameters(model, ran.snapshots[v][ran.steps[-1]])
            where = np.flatnonzero(candidates.victim == v)
            x, y = candidates.x[torch.from_numpy(where)], candidates.y[torch.from_numpy(where)]
            phi[where], loss[where] = logit_confidence(model, x, y), -loss_scores(model, x, y)
        return {"phi": phi, "loss": loss}

    recipe = _recipe(split, train, count, seed, k, observer)
    stats = data_cache.cached(CACHE_NAME, recipe, build, ("torch",), cache_dir)
    return stats["phi"], stats["loss"]


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
    model: an `attacks.References`, whose `seconds` is the CPU time this call took. `candidates`
    must be `Candidates.of(split)` (every victim's): a subset is refused, before any training.

    The blind model is trained alone on the observer's shard as `References.build` trains it
    (`lira.train_classifier`: SGD with `train`'s lr, momentum, batch size, epochs and warm-up,
    then a cosine decay), not with `train`'s optimizer, schedule or weight decay: a blind
    baseline needs only a model that never saw a candidate, whose scores are independent of
    membership whatever its recipe. The references themselves are runs of `train` itself."""
    from gossip_powersgd.privacy.attacks import References
    from gossip_powersgd.privacy.lira import inclusion_masks, train_classifier
    from gossip_powersgd.training.models import build_model

    _check_candidates(split, candidates)
    started, base = time.process_time(), split.data()
    config = _settings(train)  # before the runs: a bad key is refused before hours of training
    stats = [
        reference_stats(split, candidates, train, count, seed, observer, k, cache_dir)
        for k in range(count)
    ]
    phi, loss = np.stack([p for p, _ in stats]), np.stack([q for _, q in stats])

    def make():
        return build_model(config.model, base.input_shape, base.num_classes, 0)

    own_x, own_y = split.member_set(observer)
    recipe = dict(epochs=config.epochs, lr=config.lr, batch=config.batch_size)
    recipe.update(momentum=config.momentum, warmup_epochs=config.warmup_epochs)
    torch.manual_seed(1000 * seed + count)
    blind = train_classifier(make, own_x, own_y, seed=1000 * seed + count, **recipe)
    masks = inclusion_masks(len(candidates.y), count, seed=seed)
    return References(masks, phi, loss, blind, time.process_time() - started)
