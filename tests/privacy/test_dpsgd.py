"""Per-peer DP-SGD core: clipping, noise, accounting, resume (Poisson sampling: test_sampling.py;
model checks: test_model_check.py; Opacus on first use: test_dependency.py).

Per-example gradients are recomputed independently with torch.func, and epsilons with fresh Opacus
accountants, so the checks do not trust the code under test to grade itself.
"""

from __future__ import annotations

import math
import secrets

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from gossip_powersgd.privacy import (
    DPSGD,
    PoissonBatches,
    default_delta,
    epsilon,
    make_accountant,
    noise_for_target,
    poisson_rate,
    validate_dp_options,
)
from gossip_powersgd.privacy.seeds import NOISE_STREAM, SAMPLER_STREAM, Randomness
from dp_fixtures import backward, data, one_line_error, small_model, weights_only_round_trip

pytest.importorskip("opacus")
from opacus.accountants import PRVAccountant, RDPAccountant  # noqa: E402

# Opacus' hooks on a first layer whose input needs no gradient make torch warn once per backward;
# RDP warns when the best order is its largest. Neither is what these tests are about.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Full backward hook is firing"),
    pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha"),
]

OPACUS_ACCOUNTANTS = {"rdp": RDPAccountant, "prv": PRVAccountant}


def func_per_example_gradients(model: nn.Module, x, y) -> list[torch.Tensor]:
    """Per-example gradients of each example's own loss, with torch.func (not Opacus)."""
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss(p, xi, yi):
        out = torch.func.functional_call(model, p, (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0))

    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    return [grads[name] for name, _ in model.named_parameters()]


# --------------------------------------------------------------------------------------------------
# Clipping and noise
# --------------------------------------------------------------------------------------------------


def test_clipped_per_example_gradients_have_norm_at_most_c_and_match_torch_func():
    clip, batch = 0.05, 16
    reference = small_model()
    x, y = data(batch)
    independent = func_per_example_gradients(reference, x, y)
    norms = torch.stack([g.reshape(batch, -1).norm(dim=1) for g in independent], 1).norm(dim=1)
    assert (norms > clip).sum() >= batch // 2  # the bound must actually bite

    dp = DPSGD(0.0, clip, sample_rate=batch / 160, shard_size=160)
    model = dp.wrap(small_model())
    backward(model, x, y)
    recorded = dp.per_example_gradients(model, batch)
    for mine, theirs in zip(recorded, independent):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)

    factors = dp.clip_factors(recorded)
    clipped = [g * factors.view(-1, *[1] * (g.dim() - 1)) for g in independent]
    clipped_norms = torch.stack([g.reshape(batch, -1).norm(dim=1) for g in clipped], 1).norm(dim=1)
    assert torch.all(clipped_norms <= clip * (1 + 1e-5))
    unclipped = norms <= clip
    torch.testing.assert_close(clipped_norms[unclipped], norms[unclipped], rtol=1e-4, atol=0)

    dp.privatize(model, batch)  # sigma = 0: the update is exactly the clipped sum / expected batch
    for p, g in zip(model.parameters(), clipped):
        torch.testing.assert_close(p.grad, g.sum(0) / batch, rtol=1e-5, atol=1e-7)
        assert getattr(p, "grad_sample", None) is None


def test_sigma_zero_infinite_clip_reproduces_the_plain_gradient():
    batch, shard = 12, 48
    x, y = data(batch)
    plain = small_model()
    backward(plain, x, y)
    dp = DPSGD(0.0, math.inf, sample_rate=batch / shard, shard_size=shard)
    model = dp.wrap(small_model())
    backward(model, x, y)
    dp.privatize(model, batch)
    for mine, theirs in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("empty_batch", [False, True])
def test_zero_loss_update_is_gaussian_with_std_sigma_c_over_expected_batch(empty_batch):
    sigma, clip, q, shard = 1.3, 0.7, 0.1, 250  # expected batch 25
    dp = DPSGD(sigma, clip, sample_rate=q, shard_size=shard)  # a fresh OS-entropy key
    model = dp.wrap(nn.Linear(60, 50))
    if empty_batch:
        dp.privatize(model, 0)  # no forward for an empty Poisson batch: pure noise
    else:
        x = torch.randn(8, 60)
        model.zero_grad(set_to_none=True)
        (0.0 * model(x).sum()).backward()
        dp.privatize(model, 8)
    update = torch.cat([p.grad.flatten() for p in model.parameters()]).double()
    n = update.numel()  # 3050 independent draws
    expected = sigma * clip / (q * shard)
    # The sample std of n normals has relative standard error 1/sqrt(2(n-1)); allow 5 of them.
    assert abs(update.std().item() / expected - 1) < 5 / math.sqrt(2 * (n - 1))
    assert abs(update.mean().item()) < 5 * expected / math.sqrt(n)


def test_noise_is_a_function_of_the_key_and_fresh_keys_differ():
    def noise(randomness=None):
        dp = DPSGD(1.0, 1.0, sample_rate=0.5, shard_size=4, randomness=randomness)
        model = dp.wrap(nn.Linear(4, 4))
        dp.privatize(model, 0)
        return next(model.parameters()).grad.clone()

    key = secrets.token_bytes(32)
    assert torch.equal(noise(Randomness(key, "run_dir")), noise(Randomness(key, "run_dir")))
    assert not torch.equal(noise(), noise())  # two OS-entropy keys
    assert torch.equal(noise(Randomness.public(3, 1)), noise(Randomness.public(3, 1)))
    assert not torch.equal(noise(Randomness.public(3, 1)), noise(Randomness.public(3, 2)))
    assert "key=<secret>" in repr(Randomness(key, "os")) and key.hex() not in repr(
        Randomness(key, "os")
    )


def test_keystream_gaussians_and_uniforms_have_the_right_distribution():
    # A fixed key, so the check is deterministic; the bounds are what an exact sampler passes
    # with probability >= 1 - 3e-6 each (Kolmogorov: P(sqrt(n) D > 2.6) <= 2 exp(-2 * 2.6^2)).
    from scipy import stats

    randomness = Randomness(bytes(range(32)), "run_dir")
    n = 200_000
    z = randomness.normals(NOISE_STREAM, 0, 0, n=n).numpy()
    u = randomness.uniforms(SAMPLER_STREAM, 0, 0, n=n).numpy()
    assert math.sqrt(n) * stats.kstest(z, "norm").statistic < 2.6
    assert math.sqrt(n) * stats.kstest(u, "uniform").statistic < 2.6
    assert 0 < u.min() and u.max() < 1
    # Labels are independent streams: another step's, or the masks' stream, share no draws.
    other = randomness.normals(NOISE_STREAM, 1, 0, n=n).numpy()
    assert abs(float(np.corrcoef(z, other)[0, 1])) < 5 / math.sqrt(n)
    assert np.array_equal(randomness.normals(NOISE_STREAM, 0, 0, n=n).numpy(), z)


def test_a_draw_longer_than_chachas_block_counter_is_refused():
    """ChaCha20 counts 64-byte blocks in 32 bits: a longer draw would repeat its keystream."""
    from gossip_powersgd.privacy import seeds

    randomness = Randomness(bytes(range(32)), "run_dir")
    with pytest.raises(ValueError, match="at most 34359738368 numbers"):
        randomness._bytes(NOISE_STREAM, [0, 0], seeds._MAX_BYTES + 1)  # refused before drawing
    assert len(randomness._bytes(NOISE_STREAM, [0, 0], 64)) == 64


# --------------------------------------------------------------------------------------------------
# Accounting
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rdp", "prv"])
def test_each_peers_epsilon_equals_a_fresh_opacus_accountant(name):
    sigma, delta, steps = 1.1, 1e-5, 30
    shards = [200, 500]  # batch 10: rates 0.05 and 0.02
    epsilons = []
    for rank, shard in enumerate(shards):
        q = poisson_rate(10, shard)
        dp = DPSGD(sigma, 1.0, sample_rate=q, shard_size=shard, accountant=name)
        model = dp.wrap(nn.Linear(3, 2))
        for _ in range(steps):
            dp.privatize(model, 0)
        reference = OPACUS_ACCOUNTANTS[name]()
        for _ in range(steps):
            reference.step(noise_multiplier=sigma, sample_rate=q)
        assert dp.steps == steps
        assert dp.epsilon(delta) == reference.get_epsilon(delta=delta)
        epsilons.append(dp.epsilon(delta))
    assert epsilons[0] > epsilons[1] > 0  # the larger rate spends more


@pytest.mark.parametrize("name, target", [("rdp", 2.0), ("rdp", 1.0), ("prv", 3.0)])
def test_target_epsilon_ends_the_worst_peer_at_or_just_below_it(name, target):
    delta, steps, rates = 1e-5, 40, [0.02, 0.05, 0.03]
    sigma = noise_for_target(target, delta, rates, steps, name)
    finals = []
    for q in rates:
        accountant = make_accountant(name)
        for _ in range(steps):
            accountant.step(noise_multiplier=sigma, sample_rate=q)
        finals.append(epsilon(accountant, delta))
    assert max(finals) <= target
    assert max(finals) >= 0.95 * target
    assert finals[1] == max(finals)


def test_unreachable_target_is_one_line_naming_the_budget():
    text = one_line_error(
        noise_for_target, 0.05, 1e-5, [0.02, 0.1], 100, "rdp", match="unreachable"
    )
    for part in ("0.05", "1e-05", "0.1", "100 steps"):
        assert part in text


def test_default_delta_is_a_power_of_ten_below_one_over_the_largest_shard():
    assert default_delta(1000) == 1e-4
    assert default_delta(1001) == 1e-5
    assert default_delta(1) == 0.1
    for n in (1, 7, 999, 1000, 12345, 10**6):
        delta = default_delta(n)
        assert delta <= 1 / (10 * n) < 1 / n
        assert math.log10(delta) == round(math.log10(delta))
    one_line_error(default_delta, 0, match="positive integer")


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, match",
    [
        ({"noise_multiplier": -0.1, "max_grad_norm": 1.0}, "dp_noise_multiplier must be"),
        ({"noise_multiplier": 1.0, "max_grad_norm": 0.0}, "dp_max_grad_norm must be > 0"),
        ({"noise_multiplier": 1.0, "max_grad_norm": -2.0}, "dp_max_grad_norm must be > 0"),
        ({"noise_multiplier": 1.0, "max_grad_norm": math.inf}, "must be finite when noise"),
        ({"noise_multiplier": 1.0}, "needs dp_max_grad_norm"),
        ({"noise_multiplier": 1.0, "max_grad_norm": 1.0, "delta": 0.0}, "dp_delta must lie"),
        ({"noise_multiplier": 1.0, "max_grad_norm": 1.0, "delta": 1.0}, "dp_delta must lie"),
        ({"target_epsilon": 0.0, "max_grad_norm": 1.0}, "dp_target_epsilon must be"),
        ({"target_epsilon": -1.0, "max_grad_norm": 1.0}, "dp_target_epsilon must be"),
        ({"noise_multiplier": 1.0, "target_epsilon": 2.0, "max_grad_norm": 1.0}, "not both"),
        ({"noise_multiplier": 1.0, "max_grad_norm": 1.0, "accountant": "moments"}, "dp_accountant"),
        ({"noise_multiplier": "1", "max_grad_norm": 1.0}, "must be a number"),
    ],
)
def test_bad_options_are_one_line_errors(options, match):
    one_line_error(validate_dp_options, match=match, **options)


def test_good_options_pass_and_dp_off_needs_nothing():
    validate_dp_options()  # DP off
    validate_dp_options(noise_multiplier=0.0, max_grad_norm=math.inf)
    validate_dp_options(target_epsilon=3.0, max_grad_norm=1.0, delta=1e-5, accountant="prv")


def test_bad_sampler_and_step_arguments_are_one_line_errors():
    x, y = data(10)
    one_line_error(PoissonBatches, x, y, 0.0, match="sample rate")
    one_line_error(PoissonBatches, x, y, 1.5, match="sample rate")
    one_line_error(poisson_rate, 11, 10, match="lower batch_size")
    dp = DPSGD(1.0, 1.0, sample_rate=0.5, shard_size=20)
    model = dp.wrap(small_model())
    backward(model, x, y)
    one_line_error(dp.privatize, model, 9, match="pass len")
    one_line_error(dp.privatize, model, -1, match=">= 0")
    one_line_error(dp.wrap, small_model(), match="already wraps")
    assert dp.wrap(model) is model  # wrapping is done once
    one_line_error(DPSGD(1.0, 1.0, 0.5, 20).wrap, model, match="another DPSGD")
    one_line_error(noise_for_target, 0.0, 1e-5, [0.1], 10, match="dp_target_epsilon must be")
    one_line_error(noise_for_target, 1.0, 1.5, [0.1], 10, match="dp_delta must lie")


# --------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------


def test_noise_and_accountant_resume_bit_exact_through_weights_only_load():
    x, y = data(12)

    def peer():
        # Each peer starts with a key of its own: the resumed one gets the original's from the
        # checkpoint (a run-directory key is the one kind a checkpoint keeps).
        dp = DPSGD(
            0.9,
            0.5,
            sample_rate=0.3,
            shard_size=40,
            randomness=Randomness(secrets.token_bytes(32), "run_dir"),
        )
        return dp, dp.wrap(small_model())

    def step(dp, model):
        backward(model, x, y)
        dp.privatize(model, len(y))
        return [p.grad.clone() for p in model.parameters()]

    original, model = peer()
    for _ in range(3):
        step(original, model)
    state = weights_only_round_trip(original.state_dict())
    resumed, resumed_model = peer()
    resumed.load_state_dict(state)
    assert resumed.epsilon(1e-5) == original.epsilon(1e-5)
    for _ in range(2):
        for a, b in zip(step(original, model), step(resumed, resumed_model)):
            assert torch.equal(a, b)
    assert resumed.steps == original.steps == 5
    assert resumed.epsilon(1e-5) == original.epsilon(1e-5)


def test_privacy_state_holds_only_plain_values_and_refuses_a_mismatch():
    dp = DPSGD(1.0, 1.0, sample_rate=0.5, shard_size=4, accountant="prv")
    dp.privatize(dp.wrap(nn.Linear(2, 2)), 0)
    state = weights_only_round_trip(dp.state_dict())
    assert state["history"] == [[1.0, 0.5, 1]] and state["accountant"] == "prv"
    assert state["randomness"] == {"kind": "os"}  # an OS-entropy key is never written
    keyed = DPSGD(1.0, 1.0, 0.5, 4, randomness=Randomness(secrets.token_bytes(32), "run_dir"))
    keyed_state = weights_only_round_trip(keyed.state_dict())
    assert keyed_state["randomness"]["key"].dtype == torch.uint8
    one_line_error(
        DPSGD(1.0, 1.0, 0.5, 4, accountant="rdp").load_state_dict, state, match="dp_accountant: prv"
    )
    one_line_error(
        DPSGD(1.0, 1.0, 0.5, 4).load_state_dict,
        keyed_state,
        match="DP randomness is 'run_dir' but this run's is 'os'",
    )
    old = {k: v for k, v in state.items() if k != "randomness"}  # an older version's checkpoint
    one_line_error(
        DPSGD(1.0, 1.0, 0.5, 4, accountant="prv").load_state_dict,
        old,
        match="whose noise was public",
    )


def test_earlier_releases_count_in_epsilon_not_in_the_noise_label_and_survive_a_checkpoint():
    """A history that starts with releases of an earlier process (`privacy.releases`): epsilon
    composes them, but step t's noise is still drawn at label t, the same on every peer (DECOR's
    pairs draw alike at both ends), and a checkpoint keeps the count."""
    x, y = data(12)
    key = secrets.token_bytes(32)

    def peer():
        dp = DPSGD(0.9, 0.5, sample_rate=0.3, shard_size=40, randomness=Randomness(key, "run_dir"))
        return dp, dp.wrap(small_model())

    def step(dp, model):
        backward(model, x, y)
        dp.privatize(model, len(y))
        return [p.grad.clone() for p in model.parameters()]

    plain, plain_model = peer()
    carried, carried_model = peer()
    carried.accountant.history = [(0.9, 0.3, 7)]
    carried.earlier_releases = 7
    for _ in range(3):
        for a, b in zip(step(plain, plain_model), step(carried, carried_model)):
            assert torch.equal(a, b)
    assert (carried.steps, carried.own_steps, plain.steps) == (10, 3, 3)
    reference = RDPAccountant()
    for _ in range(10):
        reference.step(noise_multiplier=0.9, sample_rate=0.3)
    assert carried.epsilon(1e-5) == reference.get_epsilon(1e-5)
    assert "earlier_releases" not in plain.state_dict()  # a checkpoint without them is as before
    resumed, resumed_model = peer()
    resumed.load_state_dict(weights_only_round_trip(carried.state_dict()))
    assert (resumed.steps, resumed.earlier_releases) == (10, 7)
    for a, b in zip(step(plain, plain_model), step(resumed, resumed_model)):
        assert torch.equal(a, b)
