"""Privacy accounting: Opacus accountants, epsilon, the noise for a target epsilon, default delta,
and an independent second opinion from Google's dp-accounting (`pld_epsilon`).

Each peer owns one accountant and steps it once per optimizer step with its own (sigma, q). Peers
have different shard sizes, hence different sampling rates q and different epsilons: each peer's
epsilon is its own (written to its own file; see `privacy.training`).

Adjacency: with the shard sizes private, the reported epsilons are for add/remove one record of
the peer's shard (`ADD_REMOVE`): the guarantee a peer's record gets whether or not it is in the
shard, the shard's size secret. Where the user makes the sizes public
(``release_peer_statistics: true``), add/remove's neighbouring datasets differ in a size that is
published, so the relation a record gets is replace-one (`REPLACE_ONE`, same size, one record
changed): the reported epsilon is then dp-accounting's PLD under replace-one
(`pld_epsilon(..., replace_one=True)`; Opacus has no replace-one accountant), and a target
epsilon is met under it (`noise_for_target(..., replace_one=True)`). Every epsilon is shown with
its label (`epsilon_label`): the bound, the adjacency, the accountant.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Sequence

from gossip_powersgd.privacy.dependency import import_opacus

__all__ = [
    "ACCOUNTANT_NAMES",
    "REFUSED_ACCOUNTANTS",
    "make_accountant",
    "epsilon",
    "noise_for_target",
    "default_delta",
    "TARGET_TOLERANCE",
    "ADD_REMOVE",
    "REPLACE_ONE",
    "ADJACENCY_SHORT",
    "LOCAL_BOUND",
    "NETWORK_LABEL",
    "epsilon_label",
    "PLD_DISCRETIZATION",
    "pld_epsilon",
]

#: The adjacency of every epsilon the accountants report, in words (summary and per-peer files).
ADD_REMOVE = "add/remove one record of the peer's shard"
#: The adjacency of the epsilon reported where the shard sizes are made public.
REPLACE_ONE = "replace one record of the peer's shard (its size public)"
#: How every epsilon label names its adjacency.
ADJACENCY_SHORT = {ADD_REMOVE: "add/remove", REPLACE_ONE: "replace-one"}
#: The bound DP-SGD's accounting gives: against anyone who sees all of the peer's messages.
LOCAL_BOUND = "local DP-SGD"
#: What Muffliato's and ZIP-DL's per-pair network figures are (`privacy.mechanisms.muffliato`).
NETWORK_LABEL = "network bound (not valid for adaptive training)"
#: How each accountant is named in a label.
ACCOUNTANT_LABELS = {"rdp": "Opacus RDP", "prv": "Opacus PRV", "pld": "dp-accounting PLD"}


def epsilon_label(adjacency: str, accountant: str, bound: str = LOCAL_BOUND) -> str:
    """How an epsilon is named wherever it is shown: ``ε (local DP-SGD, add/remove; Opacus RDP)``:
    the bound it is, its adjacency (`ADD_REMOVE` or `REPLACE_ONE`), the accountant."""
    return f"ε ({bound}, {ADJACENCY_SHORT[adjacency]}; {ACCOUNTANT_LABELS[accountant]})"


#: dp-accounting's PLD grid step (its default is 1e-4). The pessimistic PLD is an upper bound on
#: epsilon at any grid step; 1e-3 is within 0.05 % of 1e-4 at sigma >= 0.6, q <= 0.5, up to 4000
#: steps, at a tenth of the time (0.1-0.2 s per peer instead of 1-3 s).
PLD_DISCRETIZATION = 1e-3

#: Accountants whose epsilon is an upper bound: Opacus' Renyi DP (default) and privacy random
#: variables. Opacus' third, Gaussian DP ("gdp"), is a central-limit approximation that can
#: understate epsilon (Opacus warns so itself): on this project's runs it reported 1.135 where
#: dp-accounting's PLD, an upper bound, gives 1.791. It is refused (`REFUSED_ACCOUNTANTS`).
ACCOUNTANT_NAMES = ("rdp", "prv")
#: Accountants refused as the source of a guarantee, with the reason (one line each).
REFUSED_ACCOUNTANTS = {
    "gdp": "Opacus' Gaussian-DP accountant is a central-limit approximation that can understate "
    "epsilon (1.135 where an upper bound gives 1.791 on a real run), so its figure is no "
    "guarantee",
}

#: noise_for_target's sigma ends the worst peer at an epsilon in [(1 - this) * target, target].
TARGET_TOLERANCE = 0.01

# The search brackets: Opacus' get_noise_multiplier starts at 10 and gives up past 1e6.
_FIRST_SIGMA = 5.0
_MAX_SIGMA = 1e6
_MAX_HALVINGS = 100


def check_accountant_name(name) -> str:
    """``name`` if it names an accountant, else a one-line ValueError listing the valid ones."""
    if name in REFUSED_ACCOUNTANTS:
        raise ValueError(
            f"dp_accountant: {name} is refused: {REFUSED_ACCOUNTANTS[name]}; use "
            f"{' or '.join(ACCOUNTANT_NAMES)} (dp-accounting's PLD is reported beside either)"
        )
    if name not in ACCOUNTANT_NAMES:
        raise ValueError(
            f"dp_accountant must be one of {', '.join(ACCOUNTANT_NAMES)}, got {name!r}"
        )
    return name


def make_accountant(name: str = "rdp"):
    """A fresh Opacus accountant: ``"rdp"`` or ``"prv"`` (``"gdp"`` is refused, see
    `ACCOUNTANT_NAMES`); nothing it warns is hidden."""
    check_accountant_name(name)
    accountants = import_opacus("opacus.accountants")
    return accountants.create_accountant(mechanism=name)


def epsilon(accountant, delta: float) -> float:
    """The epsilon ``accountant`` has spent so far at ``delta`` (0.0 before the first step).

    Uses each accountant's default precision, so the number equals what any fresh Opacus
    accountant with the same history reports.
    """
    if len(accountant.history) == 0:  # GDP and PRV cannot evaluate an empty history
        return 0.0
    rdp = import_opacus("opacus.accountants.rdp")
    if type(accountant) is not rdp.RDPAccountant:
        return float(accountant.get_epsilon(delta=float(delta)))
    # RDPAccountant.get_privacy_spent at its default orders, with each (sigma, q)'s RDP of one step
    # computed once per process: a run asks for its epsilon at every evaluation and a calibration
    # asks again for every run, and the series at Opacus' 99 fractional orders costs ~0.3 s per
    # call. compute_rdp(..., steps) is that one-step vector times steps, so every value is the
    # same float Opacus returns (tests/privacy/test_accounting.py compares them with ==).
    spent = sum([_rdp_of_one_step(float(s), float(q)) * n for s, q, n in accountant.history])
    value, _ = rdp.privacy_analysis.get_privacy_spent(
        orders=rdp.RDPAccountant.DEFAULT_ALPHAS, rdp=spent, delta=float(delta)
    )
    return float(value)


@functools.lru_cache(maxsize=4096)
def _rdp_of_one_step(sigma: float, q: float):
    """Opacus' RDP of one subsampled Gaussian step at its accountant's default orders (a pure
    function of sigma and q; the array is never modified: `epsilon` multiplies it into a new one)."""
    rdp = import_opacus("opacus.accountants.rdp")
    orders = rdp.RDPAccountant.DEFAULT_ALPHAS
    return rdp.privacy_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=orders)


def noise_for_target(
    target_epsilon: float,
    delta: float,
    sample_rates: Sequence[float],
    steps: int,
    accountant: str = "rdp",
    *,
    replace_one: bool = False,
) -> float:
    """The noise multiplier sigma that ends the peer with the largest sampling rate at the target.

    All peers take the same number of ``steps`` with the same sigma, so the peer with the largest
    rate spends the most: solving for it makes every peer end at epsilon <= ``target_epsilon``,
    and the worst one within ``TARGET_TOLERANCE`` (1 %) of it, by ``accountant`` (add/remove), or
    with ``replace_one`` by dp-accounting's PLD under replace-one. Raises a one-line ValueError when
    no sigma reaches the target (too small a target for that rate, delta and number of steps).
    """
    rates = [float(q) for q in sample_rates]
    if not rates:
        raise ValueError("noise_for_target needs at least one peer's sample rate")
    if any(not 0 < q <= 1 for q in rates):
        raise ValueError(f"sample rates must lie in (0, 1], got {rates}")
    if isinstance(steps, bool) or int(steps) != steps or steps < 1:
        raise ValueError(f"the number of steps must be a positive integer, got {steps!r}")
    if isinstance(target_epsilon, bool) or not 0 < float(target_epsilon) < math.inf:
        raise ValueError(f"dp_target_epsilon must be a finite number > 0, got {target_epsilon!r}")
    if isinstance(delta, bool) or not 0 < float(delta) < 1:
        raise ValueError(f"dp_delta must lie strictly between 0 and 1, got {delta!r}")
    check_accountant_name(accountant)
    rate, steps, delta = max(rates), int(steps), float(delta)
    unreachable = (
        f"dp_target_epsilon={target_epsilon:g} is unreachable with delta={delta:g}, "
        f"sample rate {rate:g} and {steps} steps: raise the target or delta, or lower "
        f"the batch size or the number of epochs"
    )
    check = make_accountant(accountant)

    def spent(sigma: float) -> float:
        if replace_one:
            return pld_epsilon([(sigma, rate, steps)], delta, replace_one=True)
        check.history = [(sigma, rate, steps)]
        try:
            with warnings.catch_warnings():  # RDP's "optimal order is the largest alpha" probes
                warnings.simplefilter("ignore", UserWarning)
                value = epsilon(check, delta)
        except (ValueError, ArithmeticError, RuntimeError):
            # an accountant that cannot evaluate so little noise: far too little noise
            return math.inf
        return value if math.isfinite(value) else math.inf

    # Opacus' get_noise_multiplier search (double sigma until the target is met, then bisect),
    # with the failures above read as "too little noise" instead of ending the search, and a
    # bounded number of halvings. Every candidate is evaluated with the accountant each peer
    # uses, at its default precision, so what is reported at the end is what is promised here.
    tolerance = TARGET_TOLERANCE * float(target_epsilon)
    low, high, spent_high = 0.0, _FIRST_SIGMA, math.inf
    while spent_high > target_epsilon:
        high *= 2
        if high > _MAX_SIGMA:
            raise ValueError(unreachable)
        spent_high = spent(high)
    for _ in range(_MAX_HALVINGS):
        if target_epsilon - spent_high <= tolerance:
            break
        middle = (low + high) / 2
        spent_middle = spent(middle)
        if spent_middle <= target_epsilon:
            high, spent_high = middle, spent_middle
        else:
            low = middle
    return float(high)


def default_delta(largest_shard: int) -> float:
    """The delta used when none is configured: the largest power of ten <= 1 / (10 n).

    ``n`` is the largest peer's shard size, or a public bound on it (the training set's size,
    where the peers' sizes are private). The usual rule asks delta < 1/n (a mechanism that
    publishes one random record outright has delta = 1/n); one more factor of ten keeps the
    default clearly below it, and a power of ten keeps it readable: n = 1000 gives 1e-4,
    n = 1500 or 10000 gives 1e-5.
    """
    if isinstance(largest_shard, bool) or int(largest_shard) != largest_shard or largest_shard < 1:
        raise ValueError(
            f"the largest shard size must be a positive integer, got {largest_shard!r}"
        )
    exponent = 1
    while 10**exponent < 10 * int(largest_shard):  # integers: no log10 rounding at 10**k
        exponent += 1
    return float(10.0**-exponent)


def pld_epsilon(
    history, delta: float, *, replace_one: bool = False, discretization: float = PLD_DISCRETIZATION
) -> float:
    """Epsilon at `delta` of an accountant `history` [(sigma, q, steps), ...] by dp-accounting's
    privacy-loss-distribution accountant, independent of Opacus.

    Each entry is `steps` compositions of the Poisson-subsampled Gaussian mechanism of noise
    multiplier sigma at rate q. Add/remove-one adjacency, or replace-one with ``replace_one``.
    The PLD is discretised pessimistically, so the value is an upper bound on the mechanism's
    epsilon (tighter than RDP's). 0.0 before the first step; ``math.inf`` without noise.
    """
    dp_accounting = import_opacus("dp_accounting")
    pld = import_opacus("dp_accounting.pld.pld_privacy_accountant")
    entries = [(float(s), float(q), int(n)) for s, q, n in history if int(n) > 0]
    if not entries:
        return 0.0
    if any(sigma == 0 for sigma, _, _ in entries):
        return math.inf
    relation = (
        dp_accounting.NeighboringRelation.REPLACE_ONE
        if replace_one
        else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    accountant = pld.PLDAccountant(relation, value_discretization_interval=discretization)
    for sigma, rate, steps in entries:
        event = dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma))
        accountant.compose(event, steps)
    return float(accountant.get_epsilon(float(delta)))
