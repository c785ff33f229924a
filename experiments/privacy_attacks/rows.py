"""What the privacy-attacks pages share about their measured rows: the algorithms' labels, rows
grouped by (algorithm, epsilon), mean ± sd, each row's last round, the observer's strongest
reconstruction, and the permutation null band of a row's counts."""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Sequence

from .measure import ALGORITHMS

#: The attack the headline columns use (the strongest here on average; every attack is in the JSON).
HEADLINE = "LiRA offline"


def label(spec: str) -> str:
    return dict((s, name) for name, s in ALGORITHMS).get(spec, spec)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def groups(rows: Sequence[Dict[str, Any]]) -> List[List[Dict[str, Any]]]:
    """Rows of the same (algorithm, target epsilon), in plan order."""
    out: Dict[tuple, List[Dict[str, Any]]] = {}
    for r in rows:
        if "failure" not in r:
            out.setdefault((r["spec"], r["target"]), []).append(r)
    return list(out.values())


def _stat(values: Sequence[float], digits: int = 3, pct: bool = False) -> str:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not values:
        return "n/a"
    scale = 100 if pct else 1
    mean = statistics.fmean(values) * scale
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.stdev(values) * scale:.{digits}f}"


def _last(r: Dict[str, Any]) -> Dict[str, Any]:
    return r["rounds"][str(r["last"])]


def _reconstructions(r: Dict[str, Any]) -> List[str]:
    return [k for k in _last(r)["quality"] if k != "observer's own"]


def _strongest(group: Sequence[Dict[str, Any]]) -> str:
    """The observer's estimator with the highest mean headline AUC (the oracle excluded: it uses
    the truth)."""
    names = [n for n in _reconstructions(group[0]) if not n.startswith("oracle")]
    return max(
        names,
        key=lambda n: statistics.fmean(_last(r)["flat"][f"auc/{n}/{HEADLINE}"] for r in group),
    )


_BANDS: Dict[tuple, Dict[str, list]] = {}


def band_of(members: int, nonmembers: int) -> Dict[str, list]:
    """The permutation null band (`membership.null_band`) of a continuous score (no ties) for
    these counts: it depends on the counts only, so it is computed once from Gaussian scores."""
    import numpy as np

    from gossip_powersgd.privacy.membership import null_band

    key = (members, nonmembers)
    if key not in _BANDS:
        rng = np.random.default_rng(0)
        _BANDS[key] = null_band(
            rng.standard_normal(members), rng.standard_normal(nonmembers), permutations=400
        )
    return _BANDS[key]


def _band(r: Dict[str, Any]) -> Dict[str, list]:
    return band_of(r["members"], r["nonmembers"])


def budget_row(r: Dict[str, Any]) -> Dict[str, Any]:
    """A DP row reduced to what the budget check shows: its recipe, accuracy and headline
    leakage through the victim's own model."""
    flat = _last(r)["flat"]
    return dict(
        spec=r["spec"],
        target=r["target"],
        seed=r["seed"],
        epochs=r["epochs"],
        steps=r["steps"],
        sigma=r["sigma"],
        eps=min(r["eps_victims"]),
        acc_avg=r["acc_avg"],
        auc=flat["auc/victim/LiRA offline"],
        tpr=flat["tpr0.1/victim/LiRA offline"],
        commit=r.get("commit"),
    )
