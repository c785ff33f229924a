"""LiRA references trained by gossip (`privacy.gossip_references`): every candidate IN exactly half
of the references; each reference built once and cached on disk under a key of what determines it
(a second call reads the same numbers back, any change of split, recipe, count, seed or index is
another entry); the references' victims have seen their IN candidates (lower loss on them);
candidates of some victims only are refused in one line, before any training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gossip_powersgd.privacy.attacks import Candidates
from gossip_powersgd.privacy.gossip_references import cache_path, gossip_references
from gossip_powersgd.privacy.gossip_references import reference_stats
from gossip_powersgd.privacy.heldout import make_split
from privacy_attack_scenarios import SPLIT_DATA

TRAIN = dict(topology="ring:4", model="logreg", epochs=3, batch_size=8, lr=0.5, momentum=0.0)
TRAIN.update(warmup_epochs=0, algorithm="exact", quiet=True, log_every=0, checkpoint_every=0)
TRAIN.update(out_dir=None, release_peer_statistics=True)


def test_gossip_references_are_built_once_and_read_back(tmp_path):
    split = make_split(SPLIT_DATA, 4, "iid", 0, victims=[1, 3], fraction=0.5, split_seed=0)
    candidates = Candidates.of(split)
    refs = gossip_references(split, candidates, TRAIN, 2, 0, 0, cache_dir=tmp_path)
    n = len(candidates.y)
    assert refs.masks.shape == refs.phi.shape == refs.loss.shape == (2, n)
    assert (refs.masks.sum(axis=0) == 1).all()  # every candidate IN one of the two
    assert {p.name for p in tmp_path.glob("*.npz")} == {
        cache_path(split, TRAIN, 2, 0, k, tmp_path).name for k in (0, 1)
    }
    again = gossip_references(split, candidates, TRAIN, 2, 0, 0, cache_dir=tmp_path)
    assert np.array_equal(again.phi, refs.phi) and np.array_equal(again.loss, refs.loss)
    # the loss of a candidate is lower in the reference that trained on it (3 epochs on 100
    # records of a 4-class linear problem: the IN mean below the OUT mean)
    assert refs.loss[refs.masks].mean() < refs.loss[~refs.masks].mean()


def test_the_cache_key_is_what_determines_a_reference(monkeypatch):
    """Any change of split, recipe, count, seed, index, observer or the library's source names
    another file; the same inputs the same file."""
    from gossip_powersgd.training import data_cache

    split = make_split(SPLIT_DATA, 4, "iid", 0, victims=[1, 3], fraction=0.5, split_seed=0)
    other = make_split(SPLIT_DATA, 4, "iid", 0, victims=[1, 3], fraction=0.5, split_seed=1)
    base = cache_path(split, TRAIN, 2, 0, 0)
    assert base == cache_path(split, dict(TRAIN), 2, 0, 0)
    changed = [
        cache_path(other, TRAIN, 2, 0, 0),
        cache_path(split, dict(TRAIN, lr=0.1), 2, 0, 0),
        cache_path(split, TRAIN, 4, 0, 0),
        cache_path(split, TRAIN, 2, 1, 0),
        cache_path(split, TRAIN, 2, 0, 1),
        cache_path(split, TRAIN, 2, 0, 0, observer=2),
    ]
    monkeypatch.setattr(data_cache, "code_digest", lambda: "edited code")
    changed.append(cache_path(split, TRAIN, 2, 0, 0))
    assert len({base, *changed}) == 8


def test_a_damaged_reference_file_is_built_again_and_off_keeps_nothing(tmp_path, monkeypatch):
    """A cache file whose arrays no longer match their digest (altered, or cut short) is not
    read: the reference is trained again, to the same numbers. GOSSIP_POWERSGD_CACHE=off writes
    no file and gives the same numbers too (a reference is a deterministic run of its seed)."""
    from gossip_powersgd.privacy.gossip_references import reference_stats

    split = make_split(SPLIT_DATA, 4, "iid", 0, victims=[1, 3], fraction=0.5, split_seed=0)
    candidates = Candidates.of(split)
    phi, loss = reference_stats(split, candidates, TRAIN, 2, 0, 0, 0, cache_dir=tmp_path)
    path = cache_path(split, TRAIN, 2, 0, 0, tmp_path)
    with np.load(path) as data:
        stored = {k: data[k] for k in data.files}
    np.savez(path, **dict(stored, phi=stored["phi"] + 1.0))  # its digest now disagrees
    again = reference_stats(split, candidates, TRAIN, 2, 0, 0, 0, cache_dir=tmp_path)
    assert np.array_equal(again[0], phi) and np.array_equal(again[1], loss)
    monkeypatch.setenv("GOSSIP_POWERSGD_CACHE", "off")
    assert cache_path(split, TRAIN, 2, 0, 0) is None
    fresh = reference_stats(split, candidates, TRAIN, 2, 0, 0, 0)
    assert np.array_equal(fresh[0], phi) and np.array_equal(fresh[1], loss)


def test_a_config_that_leaves_keys_at_their_defaults_is_read_with_them(tmp_path):
    """`train` is a `gossip_powersgd.run` config: keys it leaves out (momentum, warm-up) take the
    trainer's defaults for the blind model's recipe too, as they do for the reference runs
    (this raised KeyError: 'momentum' after every reference run had been trained)."""
    minimal = {k: v for k, v in TRAIN.items() if k not in ("momentum", "warmup_epochs")}
    split = make_split(SPLIT_DATA, 4, "iid", 0, victims=[1, 3], fraction=0.5, split_seed=0)
    candidates = Candidates.of(split)
    refs = gossip_references(split, candidates, minimal, 2, 0, 0, cache_dir=tmp_path)
    spelled = gossip_references(split, candidates, TRAIN, 2, 0, 0, cache_dir=tmp_path / "b")
    # the defaults are momentum 0 and no warm-up, TRAIN's values: the same blind model
    for mine, theirs in zip(refs.blind.parameters(), spelled.blind.parameters()):
        assert torch.equal(mine, theirs)
    assert np.array_equal(refs.phi, spelled.phi)


def test_candidates_of_some_victims_only_are_refused_before_any_training(tmp_path):
    """Before: `Candidates.of(split, victims=[1])` made the candidate index (every victim's
    records) and the mask (peer 1's) differ in length: an IndexError traceback."""
    split = make_split(SPLIT_DATA, 4, "iid", 0, victims=[1, 3], fraction=0.5, split_seed=0)
    message = (
        r"^gossip references take the candidates of every victim of the split \[1, 3\], got "
        r"those of peers \[1\]: pass Candidates.of\(split\), or make the split with victims=\[1\]$"
    )
    subset = Candidates.of(split, victims=[1])
    with pytest.raises(ValueError, match=message):
        gossip_references(split, subset, TRAIN, 2, 0, 0, cache_dir=tmp_path)
    with pytest.raises(ValueError, match=message):
        reference_stats(split, subset, TRAIN, 2, 0, 0, 0, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing trained, nothing cached
