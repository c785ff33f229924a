"""What a private run reports, and where: each figure labelled with the bound it is.

Every epsilon is shown with its label (`accounting.epsilon_label`): the bound (``local DP-SGD``:
against anyone who sees all of the peer's messages), the adjacency (add/remove while the shard
sizes are private; replace-one where they are released) and the accountant. Muffliato's and
ZIP-DL's network figures are named `accounting.NETWORK_LABEL` and never reported as the epsilon.

Where each figure goes:

* a peer's own epsilons, rate and sigma: its own ``peers/rank-K.json`` and metrics file only
  (`DifferentialPrivacy.peer_fields`); rank 0's are rank 0's own, printed nowhere;
* the summary, the progress lines and the trackers: public figures (sigma, C, delta, the
  accountant, the adjacency, where the randomness comes from, the tuning note), and the peers'
  epsilons and rates only with ``release_peer_statistics: true``.

What a private run measured, as numbers (`dp_measurements`, from a `gossip_powersgd.run` result
with the peers' figures released): the extremes of the peers' epsilons and rates, sigma, and
where the run got to (the averaged model at ¾ of the run, the consensus distance over time).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, List

from gossip_powersgd.privacy.accounting import ADJACENCY_SHORT, LOCAL_BOUND, NETWORK_LABEL

if TYPE_CHECKING:
    from gossip_powersgd.runner import RunResult

__all__ = [
    "ABSENT_NOTE",
    "TUNING_NOTE",
    "NETWORK_NOTE",
    "dp_measurements",
    "dp_summary_rows",
    "eval_text",
    "json_number",
    "from_json_number",
    "peers_named",
    "peer_epsilons",
]

#: The summary's ``dp_tuning`` field: what the reported budget leaves out.
TUNING_NOTE = (
    "the privacy budget reported covers this run alone: every run tried on the same data to "
    "choose its hyper-parameters (sigma, C, learning rate, epochs, the target itself) spends "
    "privacy too and is not counted; count it (e.g. Papernot & Steinke, ICLR 2022, "
    "hyper-parameter tuning with Renyi DP) or tune on public data"
)

#: The summary's ``dp_network_bound`` field for Muffliato and ZIP-DL.
NETWORK_NOTE = (
    "not a guarantee for training, not computed for this run: it assumes gradients that do not "
    "depend on the noisy models and ignores the evaluation's all-reduce of the average model to "
    "every peer (privacy.mechanisms.muffliato computes it for comparison only)"
)


#: The summary's ``dp_peers_absent`` field: whose figures the per-peer lists hold as null.
ABSENT_NOTE = (
    "not members at the end of the run (on_peer_loss: continue), so not in the summary's "
    "gathers: {}; null in every per-peer list (each one's figures are in its own "
    "peers/rank-K.json)"
)


def peers_named(ids) -> str:
    """ "peer 3" or "peers 1, 3"."""
    ids = [str(k) for k in ids]
    return ("peer " if len(ids) == 1 else "peers ") + ", ".join(ids)


def json_number(value: float):
    """``value``, or the string "inf" (JSON has no infinity; sigma = 0 spends an infinite epsilon)."""
    return value if math.isfinite(value) else "inf"


def from_json_number(value) -> float:
    """The inverse of `json_number`."""
    return math.inf if value == "inf" else float(value)


def _span(values) -> str:
    """[min, max] of the peers' figures; the peers absent from the summary (null) named apart."""
    numbers = [from_json_number(v) for v in values if v is not None]
    absent = [k for k, v in enumerate(values) if v is None]
    span = f"[{min(numbers):.4g}, {max(numbers):.4g}]" if numbers else "none"
    return span + (f" (without {peers_named(absent)}: not members at the end)" if absent else "")


def dp_summary_rows(summary: Dict[str, Any]) -> List[tuple]:
    """The summary table's rows of differential privacy; none for a run without it."""
    if "dp_adjacency" not in summary:
        return []
    sigma = summary["noise_multiplier"]
    adjacency = ADJACENCY_SHORT[summary["dp_adjacency"]]
    rows = [
        (
            "DP noise multiplier σ / clip norm C",
            f"{'per peer' if sigma is None else f'{sigma:.4g}'} / {summary['max_grad_norm']}",
        ),
        ("DP δ", f"{summary['delta']:g}"),
        ("DP adjacency", summary["dp_adjacency"]),
        ("DP randomness", summary["dp_randomness_note"]),
    ]
    if summary.get("dp_epsilon_note"):
        rows.append(("DP ε is", summary["dp_epsilon_note"]))
    if summary.get("dp_exchanged_subspace"):
        rows.append(
            (
                "DP update",
                "kept in the subspace PowerGossip's next messages read (post-processing: "
                "the same privacy budget)",
            )
        )
    if "epsilon" not in summary:
        rows.append(
            (
                f"ε ({LOCAL_BOUND}, {adjacency}), sampling rate",
                "private: " + summary["epsilon_per_peer"],
            )
        )
    else:
        labels = summary["epsilon_labels"]
        rows.append(("DP sampling rate q [min, max]", _span(summary["sample_rate"])))
        rows += [
            (f"{labels[key]} at δ [min, max]", _span(summary[key]))
            for key in ("epsilon", "epsilon_add_remove", "epsilon_pld")
            if key in summary
        ]
    if "dp_network_bound" in summary:
        rows.append(
            (
                NETWORK_LABEL,
                f"{summary['dp_network_bound']}; the guarantee is ε ({LOCAL_BOUND}, {adjacency})",
            )
        )
    rows.append(("DP hyper-parameter tuning", summary["dp_tuning"]))
    return rows


def eval_text(record: Dict[str, Any]) -> str:
    """The progress line's privacy figure: the worst peer's epsilon where the peers' figures are
    released; nothing otherwise (a peer's own epsilon is its own: rank 0's too)."""
    worst = record.get("epsilon_max")
    if worst is None:
        return ""
    text = worst if worst == "inf" else f"{worst:.3g}"
    return f"  worst {record.get('epsilon_bound', 'ε')} {text}"


def peer_epsilons(summary: Dict[str, Any]) -> List[float]:
    """Every peer's epsilon in a run's summary (there with ``release_peer_statistics``; inf for
    sigma = 0), or [inf] where it holds none (no DP, or the figures kept private: no guarantee
    to report); inf too for a peer the summary holds none for (null: not a member at the end)."""
    return [
        math.inf if e is None else from_json_number(e) for e in summary.get("epsilon", [math.inf])
    ]


def dp_measurements(result: "RunResult") -> Dict[str, Any]:
    """A private run's figures (`gossip_powersgd.run`'s result): the averaged model's test
    accuracy at the last evaluation at ¾ of the run (``acc_3q``, None without one: a flat last
    quarter under a cosine schedule says nothing of a plateau, this says where the run was
    before it), the consensus distance at every evaluation (``consensus_history``, (epoch,
    distance)) and at the end, the peers' smallest and largest epsilon and sampling rate, sigma
    and delta (None for a run without DP)."""
    summary, evals, epochs = result.summary, result.evals, result.config.epochs
    epsilons = peer_epsilons(summary)
    three = [e["test_acc_avg_model"] for e in evals if round(4 * e["epoch"] / epochs) == 3]
    history = [(e["epoch"], e.get("consensus_distance")) for e in evals]
    rates = [q for q in summary.get("sample_rate", [math.nan]) if q is not None] or [math.nan]
    return dict(
        acc_3q=three[-1] if three else None,
        consensus_history=[(e, c) for e, c in history if c is not None],
        consensus=summary.get("final_consensus_distance"),
        eps_min=min(epsilons),
        eps_max=max(epsilons),
        sigma=summary.get("noise_multiplier"),
        delta=summary.get("delta"),
        q_min=min(rates),
        q_max=max(rates),
    )
