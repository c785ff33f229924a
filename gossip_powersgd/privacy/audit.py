"""Empirical privacy auditing in one training run: an epsilon lower bound from canaries.

Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023. A claimed
(epsilon, delta) is an upper bound; an audit measures a lower bound, so a lower bound above the
claim proves the claim wrong (a bug, a leak outside the mechanism), and one close below it says
the claim is nearly tight. The one-run scheme:

1. m canaries (records the auditor makes) are each included in the victim's data independently
   with probability 1/2: S_i = +1 (in) or -1 (out), drawn from the victim's own secret keystream
   (`draw_inclusion`; the observer must not know S);
2. the run trains once;
3. the observer scores every canary from what it sees (the messages it received, a model it
   reconstructs, or, as a white-box bound, the victim's own model: `privacy.canaries`), guesses
   T_i = +1 for the `k_pos` highest scores, T_i = -1 for the `k_neg` lowest, and abstains on the
   rest (`guesses`): r = k_pos + k_neg guesses, v of them right;
4. `epsilon_lower_bound` turns (m, r, v) into the largest epsilon the result refutes.

The theorem (their Theorem 3, from the connection between DP and generalisation; no group
privacy, so m canaries cost nothing in epsilon): if the training run is (epsilon, delta)-DP in each
canary, then for every v,

    P[W >= v] <= f(v) + 2 m delta max_{i = 1..v} (f(v - i) - f(v)) / i,
    f(v) = P[Binomial(r, e^epsilon / (1 + e^epsilon)) >= v],

W the number of right guesses: at most as many as randomized response with epsilon gets, plus
delta's share. `p_value` is the right-hand side; an observed v with `p_value` below 1 - confidence
rejects epsilon at that confidence, and `epsilon_lower_bound` is the largest epsilon rejected
(bisection; the p-value increases with epsilon). The abstention counts must not be chosen after
looking at the scores unless the choice is paid for: `best_audit` tries a fixed list of
(k_pos, k_neg) and splits the significance between them (Bonferroni).

The binomial tail is computed here from log-factorials in float64 (no scipy); the tests compare
it with scipy's. Adjacency: each canary is one record added or removed, so the bound is for
add/remove adjacency of one record of the victim's data, the adjacency of the claim it is set
beside (`accounting.ADD_REMOVE`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from gossip_powersgd.privacy.seeds import Randomness

__all__ = [
    "AUDIT_STREAM",
    "AuditResult",
    "COUNT_FRACTIONS",
    "MIN_CANARIES",
    "audit",
    "audit_ceiling",
    "audit_counts",
    "best_audit",
    "check_canary_count",
    "draw_inclusion",
    "epsilon_lower_bound",
    "guesses",
    "p_value",
]

#: The keystream tag of the canaries' inclusion draws (apart from the noise and the masks).
AUDIT_STREAM = 0xA0D17
#: The default confidence of a lower bound (the paper's: 95 %).
CONFIDENCE = 0.95
#: Bisection ends when the bracket is this narrow (in epsilon).
_TOLERANCE = 1e-7
_EPS_CAP = 1000.0  # q = 1 - e^-1000: no finite r tells this from 1


def draw_inclusion(randomness: Randomness, m: int, counter: int = 0) -> torch.Tensor:
    """m independent fair coins (True: canary i is in the victim's data) from `randomness`, the
    victim's secret keystream, at the label (AUDIT_STREAM, counter)."""
    m = _count("m", m, minimum=1)
    return randomness.uniforms(AUDIT_STREAM, int(counter), n=m) < 0.5


def _count(name: str, value, minimum: int = 0) -> int:
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _binomial_pmf(r: int, q: float) -> np.ndarray:
    """P[Binomial(r, q) = j] for j = 0..r, from log-factorials (float64)."""
    j = np.arange(r + 1, dtype=np.float64)
    log_factorial = np.array([math.lgamma(k + 1.0) for k in range(r + 1)])
    log_choose = log_factorial[r] - log_factorial - log_factorial[::-1]
    if q >= 1.0:
        return (j == r).astype(np.float64)
    return np.exp(log_choose + j * math.log(q) + (r - j) * math.log1p(-q))


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """The theorem's bound on P[W >= v] for an (epsilon, delta)-DP run (see the module docstring):
    m canaries, r guesses, v of them right."""
    m, r, v = _count("m", m, 1), _count("r", r), _count("v", v)
    if not v <= r <= m:
        raise ValueError(
            f"need 0 <= v <= r <= m (right guesses, guesses, canaries), got {v}, {r}, {m}"
        )
    if not (isinstance(epsilon, (int, float)) and epsilon >= 0 and not math.isnan(epsilon)):
        raise ValueError(f"epsilon must be a number >= 0, got {epsilon!r}")
    if not (isinstance(delta, (int, float)) and 0 <= delta <= 1):
        raise ValueError(f"delta must lie in [0, 1], got {delta!r}")
    q = 1.0 / (1.0 + math.exp(-min(float(epsilon), _EPS_CAP)))  # randomized response's accuracy
    pmf = _binomial_pmf(r, q)
    tail = float(pmf[v:].sum())  # f(v)
    if delta == 0 or v == 0:
        return min(1.0, tail)
    # (f(v - i) - f(v)) / i = P[v - i <= Binomial < v] / i, for i = 1..v
    below = np.cumsum(pmf[v - 1 :: -1]) / np.arange(1, v + 1)
    return min(1.0, tail + 2.0 * m * float(delta) * float(below.max()))


def epsilon_lower_bound(
    m: int, r: int, v: int, delta: float, confidence: float = CONFIDENCE
) -> float:
    """The largest epsilon that v right guesses out of r (m canaries) refute at `confidence`: the
    run is not (epsilon, delta)-DP for any smaller epsilon, with that confidence. 0.0 when the
    guesses refute nothing."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence!r}")
    alpha = 1.0 - float(confidence)
    if p_value(m, r, v, 0.0, delta) >= alpha:
        return 0.0
    low, high = 0.0, 1.0
    while p_value(m, r, v, high, delta) < alpha:  # refuted at high too: look further
        low, high = high, 2.0 * high
        if high > _EPS_CAP:
            return math.inf
    while high - low > _TOLERANCE:
        middle = 0.5 * (low + high)
        if p_value(m, r, v, middle, delta) < alpha:
            low = middle
        else:
            high = middle
    return low


def guesses(scores, k_pos: int, k_neg: int = 0) -> np.ndarray:
    """+1 for the `k_pos` highest scores, -1 for the `k_neg` lowest, 0 (abstain) for the rest; ties
    broken by index (a function of the scores alone)."""
    values = np.asarray(scores, dtype=np.float64).ravel()
    k_pos, k_neg = _count("k_pos", k_pos), _count("k_neg", k_neg)
    if k_pos + k_neg > len(values):
        raise ValueError(
            f"k_pos + k_neg = {k_pos + k_neg} guesses for {len(values)} canaries: guess at most "
            "as many canaries as were scored (lower k_pos or k_neg, or score more canaries)"
        )
    if np.isnan(values).any():
        raise ValueError("a canary's score is NaN: score every canary with a number")
    order = np.argsort(-values, kind="stable")
    out = np.zeros(len(values), dtype=np.int64)
    out[order[:k_pos]] = 1
    if k_neg:
        out[order[len(values) - k_neg :]] = -1
    return out


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """An audit's outcome: `epsilon` is the lower bound at `confidence` (add/remove one record)."""

    epsilon: float
    m: int
    guesses: int
    correct: int
    k_pos: int
    k_neg: int
    delta: float
    confidence: float
    tried: int = (
        1  #: how many (k_pos, k_neg) were tried (the significance was split that many ways)
    )


def audit(
    scores,
    included,
    delta: float,
    *,
    k_pos: int,
    k_neg: int = 0,
    confidence: float = CONFIDENCE,
) -> AuditResult:
    """Guess from `scores` (higher: more likely included), count the right guesses against
    `included` (the truth: bools, or +-1), and bound epsilon from below."""
    scores = np.asarray(scores, dtype=np.float64).ravel()
    truth = np.asarray(included).ravel()
    if truth.dtype == bool:
        truth = np.where(truth, 1, -1)
    if len(truth) != len(scores) or not np.isin(truth, (-1, 1)).all():
        raise ValueError("included must hold one bool (or +-1) per scored canary")
    t = guesses(scores, k_pos, k_neg)
    correct = int(np.maximum(0, t * truth).sum())
    m, r = len(scores), int(k_pos + k_neg)
    bound = epsilon_lower_bound(m, r, correct, delta, confidence)
    return AuditResult(bound, m, r, correct, int(k_pos), int(k_neg), float(delta), confidence)


def best_audit(
    scores,
    included,
    delta: float,
    counts: Sequence[Tuple[int, int]],
    confidence: float = CONFIDENCE,
) -> AuditResult:
    """The largest bound over the (k_pos, k_neg) of `counts`, fixed before the scores are seen,
    each at significance (1 - confidence) / (the number of distinct counts), so the best holds at
    `confidence` (a count given twice is tried, and paid for, once)."""
    counts = _distinct(counts)
    if not counts:
        raise ValueError("give at least one (k_pos, k_neg)")
    split = 1.0 - (1.0 - float(confidence)) / len(counts)
    best: Optional[AuditResult] = None
    for k_pos, k_neg in counts:
        result = audit(scores, included, delta, k_pos=k_pos, k_neg=k_neg, confidence=split)
        if best is None or result.epsilon > best.epsilon:
            best = result
    return dataclasses.replace(best, confidence=float(confidence), tried=len(counts))


#: The (k_pos, k_neg) `audit_counts` offers `best_audit`, as fractions of the canaries.
COUNT_FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.5)


#: The fewest canaries an audit can guess on: one guessed in and one guessed out.
MIN_CANARIES = 2


def check_canary_count(m: int) -> None:
    """Refuse in one line an audit of fewer than `MIN_CANARIES` canaries (m in all, every victim's
    together): before, one canary got the counts (1, 1) and the audit failed only after the
    training, with "2 guesses for 1 canaries"."""
    if int(m) < MIN_CANARIES:
        raise ValueError(
            f"the one-run audit needs at least {MIN_CANARIES} canaries in all (one guessed in, "
            f"one out), got {int(m)}: give more canaries"
        )


def _distinct(counts: Sequence[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """`counts` without repeats, in their order: trying a count twice gains nothing but would
    split the significance one way more."""
    return list(dict.fromkeys((int(a), int(b)) for a, b in counts))


def audit_counts(m: int, fractions: Sequence[float] = COUNT_FRACTIONS) -> List[Tuple[int, int]]:
    """The distinct (k_pos, k_neg) to try for m canaries, fixed before any score is seen: for each
    fraction f, f m guesses, half in and half out (at least one each; fractions that give the same
    count give it once); m is at least `MIN_CANARIES`."""
    check_canary_count(m)
    return _distinct([(max(1, int(f * m) // 2), max(1, int(f * m) // 2)) for f in fractions])


def audit_ceiling(
    m: int, counts: Sequence[Tuple[int, int]], delta: float, confidence: float = CONFIDENCE
) -> float:
    """The largest bound `best_audit` can give with m canaries and these counts: every guess
    right, at the best count (with the significance split over the distinct counts)."""
    counts = _distinct(counts)
    level = 1 - (1 - confidence) / len(counts)
    return max(epsilon_lower_bound(m, a + b, a + b, delta, level) for a, b in counts)
