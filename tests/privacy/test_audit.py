"""The one-run privacy audit (`privacy.audit`, Steinke, Nasr, Jagielski, NeurIPS 2023).

Known answers: (c) the theorem's bound against values computed by hand and against scipy's
binomial; (b) a correct mechanism's lower bound stays below its claimed epsilon (randomized
response, where the bound is also nearly tight; DP-SGD with secret noise), and the bound's
confidence holds over many independent audits; (a) a mechanism with a known leak (DP-SGD whose
noise is public: the observer regenerates and subtracts it) gives a lower bound above its claim.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from gossip_powersgd.privacy.audit import (
    audit,
    audit_ceiling,
    audit_counts,
    best_audit,
    draw_inclusion,
    epsilon_lower_bound,
    guesses,
    p_value,
)
from gossip_powersgd.privacy.seeds import NOISE_STREAM, Randomness

pytest.importorskip("opacus")


def expit(epsilon):
    return 1.0 / (1.0 + math.exp(-epsilon))


# ---- (c) the bound itself --------------------------------------------------------------------------


def test_p_value_equals_hand_computed_values():
    # r = v = 2, m = 2: f(2) = q^2, max((f(1) - f(2)) / 1, (f(0) - f(2)) / 2)
    #                              = max(2 q (1 - q), (1 - q^2) / 2)
    for epsilon in (0.0, 1.0, 3.0):
        q = expit(epsilon)
        alpha = max(2 * q * (1 - q), (1 - q * q) / 2)
        assert p_value(2, 2, 2, epsilon, 0.01) == pytest.approx(q * q + 2 * 2 * 0.01 * alpha)
    assert p_value(2, 2, 2, 0.0, 0.01) == pytest.approx(0.27, abs=1e-15)  # 1/4 + 0.04 x 1/2
    # delta = 0: the binomial tail alone; r = 3, v = 2: 3 q^2 (1 - q) + q^3
    q = expit(0.7)
    assert p_value(5, 3, 2, 0.7, 0.0) == pytest.approx(3 * q * q * (1 - q) + q**3, rel=1e-12)
    assert p_value(5, 3, 0, 0.7, 0.5) == 1.0  # no right guess: nothing refuted
    # the bound is capped at 1
    assert p_value(1000, 10, 5, 0.0, 0.5) == 1.0


def test_lower_bound_equals_the_closed_form_with_every_guess_right():
    """delta = 0 and v = r: p = q^r, so the bound solves q^r = 1 - confidence:
    epsilon = log(q / (1 - q)) with q = 0.05^(1/r)."""
    for r in (5, 50, 500):
        q = 0.05 ** (1 / r)
        assert epsilon_lower_bound(r, r, r, 0.0) == pytest.approx(math.log(q / (1 - q)), abs=1e-6)
    assert epsilon_lower_bound(1, 1, 1, 0.0) == 0.0  # one right guess refutes nothing at 95 %
    assert epsilon_lower_bound(100, 100, 50, 1e-5) == 0.0  # chance level
    # more right guesses never lower the bound; delta only lowers it
    bounds = [epsilon_lower_bound(400, 200, v, 1e-5) for v in range(100, 201, 20)]
    assert bounds == sorted(bounds) and bounds[-1] > bounds[0]
    assert epsilon_lower_bound(400, 200, 190, 1e-3) < epsilon_lower_bound(400, 200, 190, 0.0)


def test_p_value_agrees_with_scipys_binomial():
    from scipy import stats

    rng = np.random.default_rng(3)
    for _ in range(40):
        m = int(rng.integers(1, 400))
        r = int(rng.integers(0, m + 1))
        v = int(rng.integers(0, r + 1))
        epsilon, delta = float(rng.uniform(0, 6)), float(rng.choice([0.0, 1e-5, 1e-3]))
        q = expit(epsilon)
        tail = stats.binom.sf(v - 1, r, q)
        alpha = max(
            [
                (stats.binom.cdf(v - 1, r, q) - stats.binom.cdf(v - i - 1, r, q)) / i
                for i in range(1, v + 1)
            ],
            default=0.0,
        )
        expected = min(1.0, tail + (2 * m * delta * alpha if delta and v else 0.0))
        assert p_value(m, r, v, epsilon, delta) == pytest.approx(expected, rel=1e-9, abs=1e-14)


def test_guesses_and_bad_inputs():
    scores = [0.5, 2.0, -1.0, 2.0, 0.0]
    assert guesses(scores, 2, 1).tolist() == [0, 1, -1, 1, 0]  # ties: the first index first
    for bad, match in (
        (lambda: guesses(scores, 4, 2), r"guesses for 5 canaries: .*\(lower k_pos or k_neg"),
        (lambda: guesses([1.0, float("nan")], 1), "NaN"),
        (lambda: p_value(3, 4, 1, 1.0, 0.0), "v <= r <= m"),
        (lambda: p_value(3, 2, 1, -1.0, 0.0), "epsilon must be"),
        (lambda: epsilon_lower_bound(3, 2, 1, 0.0, confidence=1.0), "confidence"),
        (lambda: audit([1.0, 2.0], [True], 0.0, k_pos=1), "one bool"),
        (lambda: best_audit([1.0], [True], 0.0, []), "at least one"),
    ):
        with pytest.raises(ValueError, match=match):
            bad()


def test_inclusion_is_a_fair_coin_per_canary_from_the_victims_key():
    key = Randomness(bytes(range(32)), "os")
    first = draw_inclusion(key, 4000)
    assert torch.equal(first, draw_inclusion(Randomness(bytes(range(32)), "os"), 4000))
    assert not torch.equal(first, draw_inclusion(Randomness.os_entropy(), 4000))
    # 4000 fair coins: mean 2000, std 31.6; 5 std either way
    assert abs(int(first.sum()) - 2000) < 160


# ---- (b) a correct mechanism: the bound stays below the claim --------------------------------------


def randomized_response(included: torch.Tensor, epsilon: float, seed: int) -> np.ndarray:
    """Each canary's bit, reported truthfully with probability e^eps / (1 + e^eps): the output
    for canary i depends on canary i alone, so the whole mechanism is eps-DP in each canary."""
    rng = np.random.default_rng(seed)
    truth = np.where(included.numpy(), 1.0, -1.0)
    flip = rng.random(len(truth)) >= expit(epsilon)
    return np.where(flip, -truth, truth)


def test_the_counts_are_fixed_fractions_of_the_canaries_half_in_half_out():
    assert audit_counts(200) == [(2, 2), (5, 5), (10, 10), (20, 20), (50, 50)]
    assert audit_counts(10) == [(1, 1), (2, 2)]  # at least one guess each way, each count once
    assert audit_counts(64) == [(1, 1), (3, 3), (6, 6), (16, 16)]  # the quick pages' 2 x 32
    assert audit_counts(100, fractions=(0.5,)) == [(25, 25)]


def test_a_count_given_twice_is_tried_and_paid_for_once():
    """The Bonferroni split is over the distinct counts: a repeated (k_pos, k_neg) tries nothing
    new, so it must not lower the bound (before: 5 ways for 4 distinct counts at m = 64, 1.446
    instead of 1.491) nor the ceiling."""
    rng = np.random.default_rng(0)
    truth = rng.random(64) < 0.5
    scores = truth + rng.normal(0, 0.5, 64)
    distinct = [(1, 1), (3, 3), (6, 6), (16, 16)]
    repeated = [(1, 1)] + distinct
    once, twice = (
        best_audit(scores, truth, 1e-5, distinct),
        best_audit(scores, truth, 1e-5, repeated),
    )
    assert twice == once and twice.tried == 4 and twice.epsilon > 1.0
    assert audit_ceiling(64, repeated, 1e-5) == audit_ceiling(64, distinct, 1e-5)


def test_the_ceiling_is_what_best_audit_gives_when_every_guess_is_right():
    """Scores that rank every included canary above every excluded one: each count's guesses are
    all right, so `best_audit` reaches exactly the ceiling; noisy scores stay below it."""
    rng = np.random.default_rng(1)
    truth = rng.random(400) < 0.5
    counts = audit_counts(400)
    ceiling = audit_ceiling(400, counts, 1e-5)
    assert best_audit(truth * 1.0, truth, 1e-5, counts).epsilon == ceiling > 0
    noisy = truth + rng.standard_normal(400)
    assert best_audit(noisy, truth, 1e-5, counts).epsilon < ceiling


def test_randomized_response_bound_is_below_its_epsilon_and_nearly_tight():
    """With every canary guessed, the theorem's bound on randomized response tends to epsilon as
    m grows (the paper's tightness example): at m = 10000, within 10 % of it, and below."""
    included = draw_inclusion(Randomness(b"\x01" * 32, "os"), 10000)
    scores = randomized_response(included, 2.0, seed=0)
    result = audit(scores, included, 0.0, k_pos=5000, k_neg=5000)
    assert 0.9 * 2.0 < result.epsilon <= 2.0, result


def test_the_bound_exceeds_the_true_epsilon_at_most_as_often_as_its_confidence_allows():
    """200 independent audits of 1-DP randomized response, 200 canaries each, every one guessed,
    at 95 % confidence: each bound exceeds 1 with probability <= 5 %, so more than 22 of 200 (the
    Binomial(200, 0.05) quantile at 1 - 1e-3) would mean the bound is not valid."""
    above = 0
    for seed in range(200):
        included = draw_inclusion(Randomness(seed.to_bytes(32, "little"), "os"), 200)
        scores = randomized_response(included, 1.0, seed)
        result = audit(
            scores, included, 0.0, k_pos=int((scores > 0).sum()), k_neg=int((scores < 0).sum())
        )
        above += result.epsilon > 1.0
    assert above <= 22, above


# ---- DP-SGD, white box: each canary's gradient a coordinate of its own -------------------------------

M, CLIP, STEPS = 2000, 1.0, 1


def white_box_scores(randomness: Randomness, included: torch.Tensor, sigma: float, public=None):
    """DP-SGD on a linear model whose m canaries each have the gradient -C e_i (their own
    coordinate: the paper's Dirac canaries), batch = every included canary (rate 1), `STEPS`
    steps; the observer sees each step's private gradient and scores canary i by its coordinate.
    With `public` (the key the observer can compute) it regenerates the noise and removes it."""
    from gossip_powersgd.privacy.dpsgd import DPSGD

    dp = DPSGD(sigma, CLIP, 1.0, M, randomness=randomness, divisor=1.0)
    model = dp.wrap(nn.Linear(M, 1, bias=False))
    x = CLIP * torch.eye(M)[included]
    seen = torch.zeros(M, dtype=torch.float64)
    for step in range(STEPS):
        model.zero_grad(set_to_none=True)
        (-model(x).mean()).backward()
        dp.privatize(model, len(x))
        gradient = next(model.parameters()).grad.reshape(-1).double()
        if public is not None:
            gradient = gradient - sigma * CLIP * public.normals(NOISE_STREAM, step, 0, n=M)
        seen -= gradient
    return seen.numpy()


def claimed(sigma: float, delta: float) -> float:
    """The accountant's epsilon (Opacus RDP), checked against dp-accounting's PLD (tighter)."""
    from gossip_powersgd.privacy.accounting import epsilon, make_accountant, pld_epsilon

    accountant = make_accountant("rdp")
    accountant.history = [(sigma, 1.0, STEPS)]
    value = epsilon(accountant, delta)
    assert pld_epsilon([(sigma, 1.0, STEPS)], delta) <= value
    return value


COUNTS = [(250, 250), (500, 500), (1000, 1000)]


@pytest.mark.parametrize("sigma", [1.0, 2.0])
def test_dp_sgd_with_secret_noise_audits_below_its_claim(sigma):
    key = Randomness(b"\x07" * 32, "os")
    included = draw_inclusion(key, M)
    scores = white_box_scores(key, included, sigma)
    result = best_audit(scores, included, 1e-5, COUNTS)
    claim = claimed(sigma, 1e-5)
    assert 0 < result.epsilon < claim, (result, claim)


def test_dp_sgd_with_public_noise_audits_above_its_claim():
    """dp_public_randomness's key is a function of (seed, rank): the observer regenerates the
    victim's noise, and every guess is right."""
    sigma = 2.0
    public = Randomness.public(seed=0, rank=1)
    included = draw_inclusion(Randomness(b"\x07" * 32, "os"), M)
    scores = white_box_scores(public, included, sigma, public=Randomness.public(seed=0, rank=1))
    result = best_audit(scores, included, 1e-5, COUNTS)
    assert result.correct == result.guesses
    assert result.epsilon > claimed(sigma, 1e-5) + 2, result


# ---- in a gossip run: canaries in the victim's shard, scored by its neighbour ------------------------


def audited_run(tmp_path, **changes):
    """ring:4, exact gossip, 200 canaries (random inputs, random labels: records a model can only
    memorise) offered to peer 1; peer 0 records what it receives and scores each canary by how
    much lower its loss is under the victim's last message than under the common initial model."""
    import topologies
    from gossip_powersgd import LocalCluster
    from gossip_powersgd.privacy import load_view
    from gossip_powersgd.privacy.canaries import Canaries, loss_drop_scores, observed_model
    from gossip_powersgd.training.config import TrainConfig
    from gossip_powersgd.training.data import load_dataset
    from gossip_powersgd.training.models import build_model
    from gossip_powersgd.training.trainer import train

    config = TrainConfig(
        topology="ring:4",
        dataset="synthetic_logreg:d=400,classes=4,n=2000",
        model="logreg",
        lr=1.0,
        batch_size=32,
        epochs=10,
        quiet=True,
        checkpoint_every=0,
        algorithm="exact",
        partition="iid",
        observers=[0],
        out_dir=str(tmp_path / "run"),
    ).replace(**changes)
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(200, 400, generator=generator)
    y = torch.randint(0, 4, (200,), generator=generator)
    canaries = Canaries(1, x, y, Randomness(b"\x05" * 32, "os"))
    summaries = LocalCluster(topologies.parse("ring:4"), timeout=300).run(
        train, config, hooks=[canaries]
    )
    dataset = load_dataset(config.dataset, config.seed)
    initial = build_model(config.model, dataset.input_shape, dataset.num_classes, config.seed)
    view = load_view(tmp_path / "run" / "observed" / "rank-0")
    scores = loss_drop_scores(observed_model(view, 1, initial), initial, x, y)
    result = best_audit(scores, canaries.included, 1e-5, [(25, 25), (50, 50), (100, 100)])
    return summaries, canaries, result


def test_a_neighbour_finds_canaries_without_dp_and_no_more_than_the_claim_with_it(tmp_path):
    summaries, canaries, plain = audited_run(tmp_path / "plain")
    base = summaries[0]["peer"]["shard_size"]  # iid: peer 0's shard, as large as peer 1's was
    assert summaries[1]["peer"]["shard_size"] == base + int(canaries.included.sum())
    assert plain.epsilon > 0.5, plain
    summaries, _, private = audited_run(
        tmp_path / "dp", epochs=2, dp_noise_multiplier=1.0, dp_max_grad_norm=1.0
    )
    claim = summaries[1]["peer"]["epsilon"]  # the victim's own, by Opacus' RDP
    assert private.epsilon <= min(claim, summaries[1]["peer"]["epsilon_pld"]), (private, claim)
