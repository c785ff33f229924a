"""`privacy.membership`: the membership-inference scores and their statistics — AUC and TPR at a
fixed FPR on hand-computed and Gaussian scores, the LOSS attack, the null band, the class prior."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gossip_powersgd.privacy.heldout import make_split
from gossip_powersgd.privacy.membership import (
    attack_report,
    auc,
    class_prior_scores,
    loss_attack,
    model_with_parameters,
    null_auc_std,
    null_band,
    per_class_auc,
    roc_curve,
    tpr_at_fpr,
)
from privacy_attack_scenarios import SPLIT_DATA


def test_auc_and_tpr_on_hand_computed_scores():
    assert auc([3, 4], [1, 2]) == 1.0 and auc([1, 2], [3, 4]) == 0.0
    assert auc([1, 3], [2, 2]) == 0.5 and auc([2], [2]) == 0.5  # ties count one half
    others = list(range(100))  # threshold at 1 % FPR: the second-largest non-member score, 98
    assert tpr_at_fpr([99, 98.5, 50, 10], others, fpr=0.01) == 0.5
    assert null_auc_std(1000, 1000) == pytest.approx(math.sqrt(2001 / 12e6))


def test_auc_is_the_pairwise_share_exactly_with_many_ties():
    """The rank-sum AUC against its definition, the share of (member, non-member) pairs the member
    wins, ties counting one half: on small integer scores (ties in every group, runs of equal
    values at both ends) both are sums of halves far below 2**53, so they agree exactly."""
    rng = np.random.default_rng(0)
    for size in (1, 2, 7, 50):
        members, others = rng.integers(0, 5, size), rng.integers(0, 5, size + 3)
        wins = (members[:, None] > others[None, :]).sum() + (members[:, None] == others).sum() / 2
        assert auc(members, others) == wins / (members.size * others.size)


def _blobs(n, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 20, generator=generator), torch.randint(0, 4, (n,), generator=generator)


def test_loss_auc_is_high_for_an_overfitted_model_and_chance_for_an_unseen_one():
    members, nonmembers = _blobs(40, 1), _blobs(40, 2)  # random labels: only memorising helps
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(300):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(members[0]), members[1]).backward()
        optimizer.step()
    overfitted = loss_attack(model, members, nonmembers)
    assert overfitted["auc"] > 0.9 and overfitted["tpr_at_fpr"] > 0.2

    fresh = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    big_in, big_out = _blobs(2000, 3), _blobs(2000, 4)
    unseen = loss_attack(fresh, big_in, big_out)["auc"]
    assert abs(unseen - 0.5) < 4 * null_auc_std(2000, 2000)


def test_model_with_parameters_refuses_another_models_parameters():
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="parameter tensors"):
        model_with_parameters(model, [torch.zeros(2, 3)])
    copied = model_with_parameters(model, [torch.ones(2, 3), torch.zeros(2)])
    assert torch.equal(copied.weight, torch.ones(2, 3)) and not torch.equal(
        model.weight, copied.weight
    )


def test_the_class_prior_score_is_at_chance_on_a_heldout_split_not_on_test_samples():
    """The blind baseline: under a skewed shard the class-prior score separates the shard from
    uniform test samples, but not from a random held-out part of the same shard."""
    from gossip_powersgd.training.data import load_dataset

    split = make_split(SPLIT_DATA, 4, "dirichlet:0.3", seed=0, victims=[1], split_seed=0)
    data = load_dataset(SPLIT_DATA, 0)
    members, heldout = split.member_set(1)[1], split.heldout_set(1)[1]
    prior = lambda y: class_prior_scores(y, members, 4)  # noqa: E731
    band = null_band(prior(members), prior(heldout), permutations=200)
    assert band["auc"][0] <= auc(prior(members), prior(heldout)) <= band["auc"][1]
    test = data.y_test[: len(heldout)]
    assert auc(prior(members), prior(test)) > band["auc"][1]


def test_tpr_at_a_fixed_fpr_has_the_known_answer():
    # 1000 non-members 0..999; half the members above all of them: TPR at 0.1 % FPR is 1/2.
    others = np.arange(1000.0)
    members = np.r_[np.full(50, 2000.0), np.arange(50.0)]
    assert tpr_at_fpr(members, others, 0.001) == 0.5
    # Gaussians N(mu, 1) vs N(0, 1): TPR(f) = 1 - Phi(Phi^-1(1 - f) - mu). With 20 000 members,
    # the threshold's sampling error shifts it by ~sqrt(f(1-f)/k)/phi(z) and the member count adds
    # sqrt(p(1-p)/m): 5 combined standard errors bound it.
    from scipy.stats import norm

    rng = np.random.default_rng(0)
    k = m = 20000
    mu, f = 2.0, 0.01
    out, inside = rng.standard_normal(k), rng.standard_normal(m) + mu
    z = norm.ppf(1 - f)
    p = 1 - norm.cdf(z - mu)
    se = np.sqrt(p * (1 - p) / m) + norm.pdf(z - mu) * np.sqrt(f * (1 - f) / k) / norm.pdf(z)
    assert abs(tpr_at_fpr(inside, out, f) - p) < 5 * se
    report = attack_report(inside, out, np.zeros(m), np.zeros(k))
    assert report["tpr"][1] == tpr_at_fpr(inside, out, 0.01)
    assert report["auc"] == pytest.approx(norm.cdf(mu / np.sqrt(2)), abs=5 * null_auc_std(m, k))
    fpr, tpr = roc_curve([3, 2], [1, 2])
    assert fpr.tolist() == [0, 0, 0.5, 1] and tpr.tolist() == [0, 0.5, 1, 1]
    assert per_class_auc([3, 0], [1, 1], [0, 1], [0, 1]) == {0: 1.0, 1: 0.0}


def test_non_finite_attack_scores_are_refused_naming_the_count():
    from gossip_powersgd.privacy import auc, loss_attack
    from gossip_powersgd.privacy.membership import tpr_at_fpr

    nan = float("nan")
    with pytest.raises(
        ValueError,
        match=r"^3 of 3 member scores are not finite \(NaN or infinite\): "
        r"the model has likely diverged",
    ):
        auc([nan] * 3, [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"^1 of 2 non-member scores are not finite"):
        tpr_at_fpr([0.0, 1.0], [float("inf"), 1.0])
    model = torch.nn.Linear(4, 3)
    with torch.no_grad():
        model.weight[0, 0] = nan  # every sample's logits, hence every loss, become NaN
    x, y = torch.ones(5, 4), torch.zeros(5, dtype=torch.long)
    with pytest.raises(ValueError) as info:
        loss_attack(model, (x, y), (x, y))
    assert str(info.value) == (
        "5 of 5 member scores are not finite (NaN or infinite): the model "
        "has likely diverged (check its parameters for NaN/inf); no attack "
        "score is meaningful for it"
    )
