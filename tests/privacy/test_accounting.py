"""The reported epsilon against Google's dp-accounting, an accountant independent of Opacus.

The peers report Opacus' RDP epsilon (``DPSGD.epsilon``) and, beside it, dp-accounting's PLD
(``pld_epsilon``). Here both are checked against what they should equal: dp-accounting's RDP on a
grid of (q, sigma, T, delta), and the closed form of the Gaussian mechanism where there is one.
"""

from __future__ import annotations

import logging
import math

import pytest

from gossip_powersgd.privacy import DPSGD
from gossip_powersgd.privacy.accounting import epsilon, pld_epsilon

pytest.importorskip("opacus")
dp_accounting = pytest.importorskip("dp_accounting")
from dp_accounting.rdp import rdp_privacy_accountant  # noqa: E402
from opacus.accountants import RDPAccountant  # noqa: E402
from scipy import optimize, stats  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha"),
    pytest.mark.filterwarnings("ignore:Optimal order is the smallest alpha"),
]

#: (q, sigma, T, delta): rates of small to large shards, epsilons from 0.2 to about 40.
GRID = [
    (0.01, 0.8, 200, 1e-5),
    (0.01, 1.0, 2000, 1e-5),
    (0.01, 2.0, 10, 1e-3),
    (0.064, 0.8, 10, 1e-5),
    (0.064, 1.0, 200, 1e-5),
    (0.064, 1.0, 200, 1e-3),
    (0.064, 2.0, 2000, 1e-5),
    (0.3, 1.0, 10, 1e-5),
    (0.3, 2.0, 200, 1e-5),
    (0.3, 2.0, 200, 1e-3),
    (0.5, 5.0, 100, 1e-6),
]


def reported(q, sigma, steps, delta):
    """The epsilon a peer reports after `steps` steps at rate q (no gradient work: the accountant
    is what privatize steps, once per step)."""
    dp = DPSGD(sigma, 1.0, sample_rate=q, shard_size=1000)
    dp.accountant.history = [(sigma, q, steps)]
    return dp.epsilon(delta)


def dp_accounting_rdp(q, sigma, steps, delta, orders):
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    accountant = rdp_privacy_accountant.RdpAccountant(orders=list(orders))
    accountant.compose(event, steps)
    logging.disable(logging.WARNING)  # its notes on fractional orders it skips
    try:
        return accountant.get_epsilon(delta)
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.parametrize("q, sigma, steps, delta", GRID)
def test_reported_epsilon_agrees_with_dp_accounting(q, sigma, steps, delta):
    orders = RDPAccountant.DEFAULT_ALPHAS
    integers = [a for a in orders if float(a).is_integer()]
    mine = reported(q, sigma, steps, delta)
    # 1. At integer orders the RDP of the subsampled Gaussian is a finite binomial sum, which both
    # libraries evaluate in float64 log space, and both convert RDP to (eps, delta) with the same
    # formula (Balle et al. 2020): restricted to those orders they agree to rounding (measured
    # 1e-13 relative on this grid; 1e-9 leaves room for another summation order).
    opacus_integers = RDPAccountant()
    opacus_integers.history = [(sigma, q, steps)]
    on_integers = opacus_integers.get_privacy_spent(delta=delta, alphas=integers)[0]
    assert on_integers == pytest.approx(
        dp_accounting_rdp(q, sigma, steps, delta, integers), rel=1e-9
    )
    # 2. Over all of Opacus' orders the reported value is the minimum over a superset of the
    # integers, and dp-accounting, which skips fractional orders below 2 where its series does
    # not converge, minimises over a subset of Opacus' orders: reported <= both, up to rounding.
    assert mine <= on_integers * (1 + 1e-9)
    assert mine <= dp_accounting_rdp(q, sigma, steps, delta, orders) * (1 + 1e-9)
    # 3. RDP is an upper bound on the mechanism's epsilon; the pessimistic PLD the peers report
    # is one too, above the true value by at most its discretisation (each step's privacy loss
    # rounded up by at most the grid step 1e-3, so <= T x 1e-3): the reported epsilon is never
    # below the PLD less that slack (it is above it: by 8-21 % at epsilon 1-10, 3x at 0.07).
    pld = pld_epsilon([(sigma, q, steps)], delta)
    assert pld - steps * 1e-3 <= mine


#: Accountant histories [(sigma, q, steps), ...]: one entry, a sigma changed mid-run (resumed with
#: other settings), the rate of a full batch (q = 1), no noise at all (epsilon inf).
HISTORIES = [
    [(1.0, 0.064, 200)],
    [(0.8, 0.01, 200), (2.0, 0.01, 10), (0.8, 0.01, 7)],
    [(5.0, 1.0, 100)],
    [(0.0, 0.3, 10)],
]


@pytest.mark.parametrize("history", HISTORIES)
@pytest.mark.parametrize("delta", [1e-5, 1e-3])
def test_epsilon_is_exactly_what_opacus_rdp_accountant_returns(history, delta):
    """`epsilon` computes each (sigma, q)'s one-step RDP once per process (it is asked again at
    every evaluation); the figure must be Opacus' own to the last bit, asked once or again."""
    accountant = RDPAccountant()
    accountant.history = list(history)
    expected = accountant.get_epsilon(delta=delta)
    assert epsilon(accountant, delta) == expected
    assert epsilon(accountant, delta) == expected  # from the cache
    accountant.history = [(s, q, 3 * n) for s, q, n in history]  # same entries, longer
    assert epsilon(accountant, delta) == accountant.get_epsilon(delta=delta)


def gaussian_epsilon(mu, delta):
    """The exact epsilon at `delta` of a Gaussian mechanism with sensitivity / sigma = mu
    (Balle & Wang 2018): delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""

    def excess(eps):
        return (
            stats.norm.cdf(-eps / mu + mu / 2)
            - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
            - delta
        )

    return optimize.brentq(excess, 0.0, 100.0, xtol=1e-12)


@pytest.mark.parametrize("sigma, steps", [(1.0, 1), (2.0, 4), (5.0, 10)])
def test_pld_without_subsampling_is_the_gaussian_mechanism_under_both_adjacencies(sigma, steps):
    # q = 1: every step is the Gaussian mechanism; T of them compose to one with mu = sqrt(T) x
    # sensitivity / sigma. Add/remove one record moves the clipped sum by at most C (mu =
    # sqrt(T) / sigma), replacing one by at most 2C (twice that mu). The pessimistic PLD rounds
    # each step's privacy loss up by at most its grid step (1e-3), so it lies in
    # [exact, exact + T x 1e-3].
    delta = 1e-5
    for sensitivity, replace in ((1.0, False), (2.0, True)):
        exact = gaussian_epsilon(sensitivity * math.sqrt(steps) / sigma, delta)
        pld = pld_epsilon([(sigma, 1.0, steps)], delta, replace_one=replace)
        assert exact - 1e-9 <= pld <= exact + steps * 1e-3, (sensitivity, exact, pld)


def test_pld_edge_cases():
    assert pld_epsilon([], 1e-5) == 0.0
    assert pld_epsilon([(0.0, 0.1, 5)], 1e-5) == math.inf
    # two history entries compose: the same as one entry of the summed steps
    assert pld_epsilon([(1.0, 0.1, 30), (1.0, 0.1, 20)], 1e-5) == pytest.approx(
        pld_epsilon([(1.0, 0.1, 50)], 1e-5), rel=1e-6
    )
