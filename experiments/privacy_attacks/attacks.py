"""The attacks of one run, on the membership protocol's candidates: LOSS, calibrated and
class-conditional LOSS, LiRA offline and online, each through several models (the victim's own,
the observer's reconstructions, the observer's own, the average), with the blind baselines (the
class-prior score; the same attacks with a model that never saw the victims) and a null band.

Reference models (LiRA, calibrated LOSS) and the blind model depend only on the seed's split, not
on the algorithm: `References.build` trains them once per seed, in-process (no gossip): each
reference model on a random half of the candidate pool (the victims' members and held-out
records, each candidate in half of them) plus the observer's own shard, which stands in for the
rest of the network's data; the blind model on the observer's own shard alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Sequence

import numpy as np
import torch

from gossip_powersgd.privacy.heldout import HeldOutSplit
from gossip_powersgd.privacy.lira import (
    calibrated_loss_scores,
    class_conditional_loss_scores,
    inclusion_masks,
    lira_scores,
    logit_confidence,
    train_classifier,
)
from gossip_powersgd.privacy.membership import (
    LOW_FPRS,
    attack_report,
    class_prior_scores,
    loss_scores,
    null_band,
)

#: The attacks, as the page names them.
ATTACKS = ("LOSS", "LOSS calibrated", "LOSS class-conditional", "LiRA offline", "LiRA online")


@dataclasses.dataclass
class Candidates:
    """The victims' members and held-out records, pooled: x, y, is_member, victim of each."""

    x: torch.Tensor
    y: torch.Tensor
    member: np.ndarray
    victim: np.ndarray

    @classmethod
    def of(cls, split: HeldOutSplit, victims=None) -> "Candidates":
        """`victims`: the peers whose records are candidates (default: every victim of the
        split; a split may hold records out on more peers than are attacked)."""
        xs, ys, member, victim = [], [], [], []
        for v in split.victims if victims is None else victims:
            for inside, (x, y) in ((True, split.member_set(v)), (False, split.heldout_set(v))):
                xs.append(x)
                ys.append(y)
                member.append(np.full(len(y), inside))
                victim.append(np.full(len(y), v))
        return cls(torch.cat(xs), torch.cat(ys), np.concatenate(member), np.concatenate(victim))


@dataclasses.dataclass
class References:
    masks: np.ndarray  # (models, candidates)
    phi: np.ndarray  # (models, candidates)
    loss: np.ndarray  # (models, candidates)
    blind: torch.nn.Module
    seconds: float

    @classmethod
    def build(
        cls,
        split: HeldOutSplit,
        candidates: Candidates,
        observer: int,
        make_model,
        count: int,
        recipe: Dict[str, Any],
        seed: int,
    ) -> "References":
        import time

        started = time.process_time()
        own_x, own_y = split.member_set(observer)
        masks = inclusion_masks(len(candidates.y), count, seed=seed)
        models = []
        for k in range(count):
            pick = torch.from_numpy(masks[k])
            torch.manual_seed(1000 * seed + k)
            models.append(
                train_classifier(
                    make_model,
                    torch.cat([candidates.x[pick], own_x]),
                    torch.cat([candidates.y[pick], own_y]),
                    seed=1000 * seed + k,
                    **recipe,
                )
            )
        torch.manual_seed(1000 * seed + count)
        blind = train_classifier(make_model, own_x, own_y, seed=1000 * seed + count, **recipe)
        x, y = candidates.x, candidates.y
        phi = np.stack([logit_confidence(m, x, y) for m in models])
        loss = np.stack([-loss_scores(m, x, y) for m in models])
        bad = [
            k for k in range(count) if not np.isfinite(phi[k]).all() & np.isfinite(loss[k]).all()
        ]
        if bad:
            raise ValueError(
                f"reference models {bad} of seed {seed} give non-finite scores (their logits "
                f"overflow: the recipe {recipe} diverges); lower lr or warm up longer"
            )
        return cls(
            masks=masks,
            phi=phi,
            loss=loss,
            blind=blind,
            seconds=time.process_time() - started,
        )


def _target(model, candidates: Candidates):
    """(loss, phi) of every candidate under `model`, or under its victim's model when `model`
    maps victims to models."""
    x, y = candidates.x, candidates.y
    if not isinstance(model, dict):
        return -loss_scores(model, x, y), logit_confidence(model, x, y)
    loss, phi = np.empty(len(y)), np.empty(len(y))
    for v, m in model.items():
        where = candidates.victim == v
        index = torch.from_numpy(np.flatnonzero(where))
        loss[where] = -loss_scores(m, x[index], y[index])
        phi[where] = logit_confidence(m, x[index], y[index])
    return loss, phi


def scores(model, candidates: Candidates, refs: References) -> Dict[str, np.ndarray]:
    """Every attack's score of every candidate with `model` (or a model per victim) as target."""
    y = candidates.y
    loss, phi = _target(model, candidates)
    return {
        "LOSS": -loss,
        "LOSS calibrated": calibrated_loss_scores(loss, refs.loss, refs.masks),
        "LOSS class-conditional": class_conditional_loss_scores(
            loss, y.numpy(), refs.loss, refs.masks
        ),
        "LiRA offline": lira_scores(phi, refs.phi, refs.masks),
        "LiRA online": lira_scores(phi, refs.phi, refs.masks, online=True),
    }


def report(
    values: np.ndarray, candidates: Candidates, roc: bool = False, per_class: bool = False
) -> Dict[str, Any]:
    m = candidates.member
    y = candidates.y.numpy()
    out = attack_report(
        values[m], values[~m], y[m] if per_class else None, y[~m] if per_class else None
    )
    if not roc:
        out.pop("roc")
    return out


def evaluate(
    models: Dict[str, Any],
    candidates: Candidates,
    refs: References,
    split: HeldOutSplit,
    roc_models: Sequence[str] = (),
) -> Dict[str, Any]:
    """{model: {attack: report}}, the blind baselines, and the null band."""
    out: Dict[str, Any] = {"models": {}}
    for name, model in models.items():
        out["models"][name] = {
            a: report(s, candidates, roc=name in roc_models, per_class=(a == "LiRA offline"))
            for a, s in scores(model, candidates, refs).items()
        }
    blind = scores(refs.blind, candidates, refs)
    out["blind_model"] = {a: report(s, candidates) for a, s in blind.items()}
    y = candidates.y.numpy()
    # The victims' whole shards (members and held-out): fitted on the members alone, the
    # frequencies would favour them.
    prior = class_prior_scores(y, y, int(y.max()) + 1)
    out["class_prior"] = report(prior, candidates)
    m = candidates.member
    # A continuous score (no ties; LOSS ties at a loss of 0): the band depends on the counts only.
    out["null_band"] = null_band(blind["LiRA offline"][m], blind["LiRA offline"][~m])
    out["fprs"] = list(LOW_FPRS)
    return out


def flat(evaluation: Dict[str, Any]) -> Dict[str, float]:
    """The row's numbers as flat keys: auc|tpr0.1|tpr1 / model / attack."""
    out: Dict[str, float] = {}

    def put(prefix: str, rep: Dict[str, Any]) -> None:
        out[f"auc/{prefix}"] = rep["auc"]
        out[f"tpr0.1/{prefix}"] = rep["tpr"][0]
        out[f"tpr1/{prefix}"] = rep["tpr"][1]

    for name, attacks in evaluation["models"].items():
        for attack, rep in attacks.items():
            put(f"{name}/{attack}", rep)
    for attack, rep in evaluation["blind_model"].items():
        put(f"blind model/{attack}", rep)
    put("class prior", evaluation["class_prior"])
    return out


def per_class(evaluation: Dict[str, Any], model: str) -> List[float]:
    rep = evaluation["models"][model]["LiRA offline"]
    return [rep["per_class_auc"][c] for c in sorted(rep["per_class_auc"])]
