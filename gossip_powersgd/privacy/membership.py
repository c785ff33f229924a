"""Membership inference with the LOSS attack (Yeom, Giacomelli, Fredrikson, Jha, CSF 2018), and the
metrics and blind baselines of the membership protocol.

The attacker scores a sample by -loss(sample) under some model and calls it a member when the
score is high. Members and non-members must come from the same distribution: with non-IID shards
use `heldout.make_split` (a random held-out part of the victim's own shard that no peer trains on);
`membership_samples` (the victim's shard against test samples) is right only for iid shards. `loss_attack`
reports the AUC of the scores and the TPR at 1 % FPR; `membership_inference` does so for several
models at once, e.g. (a) the victim's true model, (b) an observer's reconstruction of it
(`reconstruction.reconstruct` loaded with `model_with_parameters`), (c) the observer's own model,
(d) the average of all models.

Under the null hypothesis (the model does not depend on which samples are members) the AUC of
m members and k non-members has mean 1/2 and standard deviation sqrt((m + k + 1) / (12 m k))
(`null_auc_std`, Mann-Whitney without ties): an AUC within a few of those of 1/2 is chance.
"""

from __future__ import annotations

import copy
import math
from typing import Dict, Mapping, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "DEFAULT_FPR",
    "LOW_FPRS",
    "attack_report",
    "auc",
    "class_prior_scores",
    "loss_attack",
    "loss_scores",
    "membership_inference",
    "membership_samples",
    "model_with_parameters",
    "null_auc_std",
    "null_band",
    "per_class_auc",
    "roc_curve",
    "tpr_at_fpr",
]

#: The false-positive rate at which `loss_attack` reports the true-positive rate.
DEFAULT_FPR = 0.01
#: The low false-positive rates every attack is reported at (Carlini et al. 2022).
LOW_FPRS = (0.001, 0.01)


@torch.no_grad()
def loss_scores(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 1024
) -> np.ndarray:
    """The LOSS attack's score of every sample: -cross-entropy under `model` (in eval mode)."""
    was_training = model.training
    model.eval()
    try:
        scores = [
            -F.cross_entropy(model(x[k : k + batch]), y[k : k + batch], reduction="none")
            for k in range(0, len(x), batch)
        ]
    finally:
        model.train(was_training)
    return torch.cat(scores).double().cpu().numpy()


def _scores(name: str, values) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).ravel()
    if array.size == 0:
        raise ValueError(
            f"no {name} scores: the attack needs at least one member and one non-member"
        )
    bad = int(np.count_nonzero(~np.isfinite(array)))
    if bad:
        # NaN compares false with everything, so a rank or threshold of it would be a confident lie
        raise ValueError(
            f"{bad} of {array.size} {name} scores are not finite (NaN or infinite): "
            "the model has likely diverged (check its parameters for NaN/inf); no "
            "attack score is meaningful for it"
        )
    return array


def auc(member_scores, nonmember_scores) -> float:
    """P(member score > non-member score) + P(equal) / 2: the ROC AUC (Mann-Whitney U)."""
    members, others = _scores("member", member_scores), _scores("non-member", nonmember_scores)
    ranks = _average_ranks(np.concatenate([members, others]))
    u = ranks[: members.size].sum() - members.size * (members.size + 1) / 2
    return float(u / (members.size * others.size))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their average rank (a tie group at sorted places start..stop,
    0-based, ranks (start + stop) / 2 + 1)."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    first = np.ones(values.size, dtype=bool)  # where each group of equal values starts
    first[1:] = sorted_values[1:] != sorted_values[:-1]
    starts = np.flatnonzero(first)
    stops = np.append(starts[1:], values.size) - 1
    ranks = np.empty(values.size)
    ranks[order] = ((starts + stops) / 2 + 1)[np.cumsum(first) - 1]
    return ranks


def tpr_at_fpr(member_scores, nonmember_scores, fpr: float = DEFAULT_FPR) -> float:
    """The share of members scored strictly above a threshold that at most `fpr` of the
    non-members exceed (the strictest such threshold from the non-members' own scores)."""
    if not 0 <= fpr < 1:
        raise ValueError(f"fpr must lie in [0, 1), got {fpr}")
    members, others = _scores("member", member_scores), _scores("non-member", nonmember_scores)
    allowed = int(math.floor(fpr * others.size))  # non-members that may lie above the threshold
    threshold = np.sort(others)[::-1][allowed]
    return float((members > threshold).mean())


def null_auc_std(members: int, nonmembers: int) -> float:
    """Standard deviation of the AUC of a model that ignores membership (see the module docstring)."""
    return math.sqrt((members + nonmembers + 1) / (12.0 * members * nonmembers))


def loss_attack(
    model: torch.nn.Module,
    members: Tuple[torch.Tensor, torch.Tensor],
    nonmembers: Tuple[torch.Tensor, torch.Tensor],
    fpr: float = DEFAULT_FPR,
) -> Dict[str, float]:
    """{"auc", "tpr_at_fpr", "fpr"} of the LOSS attack with `model` on (x, y) members and
    non-members."""
    inside, outside = loss_scores(model, *members), loss_scores(model, *nonmembers)
    return {"auc": auc(inside, outside), "tpr_at_fpr": tpr_at_fpr(inside, outside, fpr), "fpr": fpr}


def membership_inference(
    models: Mapping[str, torch.nn.Module], members, nonmembers, fpr: float = DEFAULT_FPR
) -> Dict[str, Dict[str, float]]:
    """`loss_attack` with each named model, on the same members and non-members."""
    return {name: loss_attack(model, members, nonmembers, fpr) for name, model in models.items()}


def membership_samples(
    dataset,
    rank: int,
    num_peers: int,
    partition: str = "iid",
    seed: int = 0,
) -> Tuple[Tuple[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]:
    """(members, non-members) for victim `rank`: its training shard, as `train` splits it, and as
    many test samples (drawn without replacement with `seed`; all of them if there are fewer)."""
    from gossip_powersgd.training.data import peer_shard

    x_in, y_in = peer_shard(dataset, rank, num_peers, partition, seed)
    count = min(len(x_in), len(dataset.x_test))
    pick = torch.randperm(len(dataset.x_test), generator=torch.Generator().manual_seed(seed))[
        :count
    ]
    if count < len(x_in):
        keep = torch.randperm(len(x_in), generator=torch.Generator().manual_seed(seed))[:count]
        x_in, y_in = x_in[keep], y_in[keep]
    return (x_in, y_in), (dataset.x_test[pick], dataset.y_test[pick])


def model_with_parameters(
    model: torch.nn.Module, parameters: Sequence[torch.Tensor]
) -> torch.nn.Module:
    """A copy of `model` whose parameters (in `model.parameters()` order) are `parameters`."""
    copied = copy.deepcopy(model)
    own = list(copied.parameters())
    if len(own) != len(parameters):
        raise ValueError(
            f"the model has {len(own)} parameter tensors but {len(parameters)} were "
            "given: reconstruct with the same model the run trained"
        )
    with torch.no_grad():
        for target, value in zip(own, parameters):
            if tuple(target.shape) != tuple(value.shape):
                raise ValueError(
                    f"parameter of shape {tuple(target.shape)} given a tensor of shape "
                    f"{tuple(value.shape)}: reconstruct with the run's model"
                )
            target.copy_(value)
    return copied


def roc_curve(member_scores, nonmember_scores) -> Tuple[np.ndarray, np.ndarray]:
    """(FPR, TPR) of every threshold, from (0, 0) to (1, 1), ties taken together."""
    members, others = _scores("member", member_scores), _scores("non-member", nonmember_scores)
    values = np.concatenate([members, others])
    is_member = np.concatenate([np.ones(members.size), np.zeros(others.size)])
    order = np.argsort(-values, kind="stable")
    values, is_member = values[order], is_member[order]
    last = np.r_[np.flatnonzero(np.diff(values)), values.size - 1]  # end of each tie group
    tp, fp = np.cumsum(is_member)[last], np.cumsum(1 - is_member)[last]
    return np.r_[0.0, fp / others.size], np.r_[0.0, tp / members.size]


def per_class_auc(
    member_scores, nonmember_scores, member_labels, nonmember_labels
) -> Dict[int, float]:
    """The AUC among the samples of each class that has both members and non-members."""
    members, others = np.asarray(member_scores, float), np.asarray(nonmember_scores, float)
    a, b = np.asarray(member_labels), np.asarray(nonmember_labels)
    return {
        int(c): auc(members[a == c], others[b == c])
        for c in np.union1d(a, b)
        if (a == c).any() and (b == c).any()
    }


def class_prior_scores(labels, reference_labels, num_classes: int) -> np.ndarray:
    """The blind class-prior score: each sample's label's frequency in `reference_labels` (e.g.
    the victim's training shard). It never looks at a model: on members and non-members drawn
    from one distribution its AUC is chance."""
    counts = np.bincount(np.asarray(reference_labels, dtype=np.int64), minlength=num_classes)
    return counts[np.asarray(labels, dtype=np.int64)] / max(1, counts.sum())


def null_band(
    member_scores,
    nonmember_scores,
    fprs: Sequence[float] = LOW_FPRS,
    permutations: int = 200,
    seed: int = 0,
    level: float = 0.95,
) -> Dict[str, list]:
    """The central `level` range of AUC and TPR at each FPR when membership is independent of the
    score: the same scores with member / non-member labels permuted at random."""
    members, others = _scores("member", member_scores), _scores("non-member", nonmember_scores)
    values = np.concatenate([members, others])
    rng = np.random.default_rng(seed)
    aucs, tprs = [], []
    for _ in range(permutations):
        order = rng.permutation(values.size)
        inside, outside = values[order[: members.size]], values[order[members.size :]]
        aucs.append(auc(inside, outside))
        tprs.append([tpr_at_fpr(inside, outside, f) for f in fprs])
    lo, hi = (1 - level) / 2, 1 - (1 - level) / 2
    tprs = np.array(tprs)
    return {
        "auc": [float(np.quantile(aucs, lo)), float(np.quantile(aucs, hi))],
        "tpr": [
            [float(np.quantile(tprs[:, k], lo)), float(np.quantile(tprs[:, k], hi))]
            for k in range(len(fprs))
        ],
    }


def attack_report(
    member_scores,
    nonmember_scores,
    member_labels=None,
    nonmember_labels=None,
    fprs: Sequence[float] = LOW_FPRS,
) -> Dict[str, object]:
    """AUC, TPR at each FPR, the ROC curve (thinned to <= 400 points) and, with labels, the AUC
    per class. Equal member and non-member counts make the AUC balanced; the AUC is in any case
    the probability that a random member outscores a random non-member, whatever the counts."""
    members, others = _scores("member", member_scores), _scores("non-member", nonmember_scores)
    fpr, tpr = roc_curve(members, others)
    keep = np.unique(
        np.r_[
            np.searchsorted(fpr, np.geomspace(1e-4, 1, 300)).clip(0, fpr.size - 1), 0, fpr.size - 1
        ]
    )
    out: Dict[str, object] = {
        "auc": auc(members, others),
        "fprs": list(fprs),
        "tpr": [tpr_at_fpr(members, others, f) for f in fprs],
        "members": int(members.size),
        "nonmembers": int(others.size),
        "roc": [fpr[keep].tolist(), tpr[keep].tolist()],
    }
    if member_labels is not None and nonmember_labels is not None:
        out["per_class_auc"] = per_class_auc(members, others, member_labels, nonmember_labels)
    return out
