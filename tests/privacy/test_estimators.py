"""`privacy.estimators`: the least-squares estimate of a neighbour's model difference from the
PowerGossip factors it sent, against the oracle that knows the truth."""

from __future__ import annotations

import pytest
import torch

from gossip_powersgd.privacy.estimators import difference_estimates, oracle_estimates
from gossip_powersgd.privacy.reconstruction import relative_error
from privacy_attack_scenarios import run_views


def test_difference_estimate_is_exact_at_full_rank_and_never_beats_its_oracle(tmp_path):

    results, views = run_views("powergossip:rank=6,min_compression_rate=0", steps=4, tmp=tmp_path)
    truth = dict(enumerate(results[3]["sent"]))
    # One square factor determines D exactly: the error is float64 round-off of a 6 x 6 solve.
    for step, estimate in difference_estimates(views[0], 3, steps=[0, 1, 2, 3], window=1).items():
        assert relative_error(estimate, truth[step]) < 1e-10
    results, views = run_views("powergossip:rank=1", steps=8, tmp=tmp_path / "r1")
    truth = dict(enumerate(results[1]["sent"]))
    steps = [3, 5, 7]
    for window in (2, 8):
        lsq = difference_estimates(views[0], 1, steps=steps, window=window)
        oracle = oracle_estimates(views[0], 1, truth, steps=steps, window=window)
        for s in steps:
            # The least-squares D is zero exactly where the oracle drops the truth (the directions
            # no factor measured) and the oracle is exact on the rest: an orthogonal split, so the
            # oracle's error is a lower bound up to round-off.
            assert relative_error(oracle[s], truth[s]) <= relative_error(lsq[s], truth[s]) + 1e-12
    with pytest.raises(ValueError, match="forget must lie in"):
        difference_estimates(views[0], 1, forget=0)
    with pytest.raises(ValueError, match="PowerGossip views"):
        difference_estimates(run_views("exact", steps=1, tmp=tmp_path / "e")[1][0], 1)


def test_difference_estimate_of_a_static_difference_is_exact_once_the_factors_span_it(tmp_path):
    """When the difference is constant the window's measurements are consistent: once the
    factors span the space (8 half-steps of rank 1 for a 6 x 6 with random factors) the
    least squares returns D exactly, wherever both models move (the observer's own history
    removes the common motion)."""

    results, views = run_views("powergossip:rank=1", steps=12, tmp=tmp_path)
    view = views[0]
    own = view.own_trajectory()
    shift = [
        torch.randn(t.shape, generator=torch.Generator().manual_seed(9), dtype=t.dtype)
        for t in own[0]
    ]
    # Rewrite the recorded messages as those of a neighbour at the observer's model + shift.
    for record in view.records:
        for m in record["messages"]:
            if m["sender"] != 1:
                continue
            neighbour = [a + b for a, b in zip(record["own"], shift)]
            blocks = []
            for g, (indices, rows, cols, r) in enumerate(view.meta["groups"]):
                mats = torch.stack([neighbour[k].reshape(rows, cols) for k in indices])
                f = m["factors"][str(g)]
                blocks.append(
                    (mats @ f).transpose(1, 2) if m["kind"] == "right" else f.transpose(1, 2) @ mats
                )
            exact = [neighbour[k].reshape(-1) for k in view.meta["exact_indices"]]
            m["tensor"] = torch.cat([b.reshape(-1) for b in blocks] + exact)
    last = view.steps[-1]
    estimate = difference_estimates(view, 1, steps=[last], window=12)[last]
    truth = [a + b for a, b in zip(own[last], shift)]
    assert relative_error(estimate, truth) < 1e-8  # float64 solve of well-conditioned 6 x 6 sums


def test_the_exact_tensors_are_read_off_whatever_the_window(tmp_path):
    """Two half-steps a step (iters=2): only a step's first message carries the tensors
    PowerGossip sends exactly, so a window of one message holds the second only; the estimate
    still reads them off the step's first message, equal to what the neighbour sent bit for bit
    (it kept the observer's own, 0.1 away), as `reconstruct` does, for both estimators."""
    results, views = run_views("powergossip:rank=1,iters=2", steps=4, tmp=tmp_path)
    view, truth = views[0], dict(enumerate(results[1]["sent"]))
    exact = view.meta["exact_indices"]
    assert exact
    for window in (1, 2):
        lsq = difference_estimates(view, 1, steps=[1, 3], window=window)
        oracle = oracle_estimates(view, 1, truth, steps=[1, 3], window=window)
        for step in (1, 3):
            for k in exact:
                assert torch.equal(lsq[step][k], truth[step][k])
                assert torch.equal(oracle[step][k], truth[step][k])
