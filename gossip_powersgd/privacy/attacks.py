"""A curious neighbour's membership attacks on the membership protocol's candidates, with their
blind baselines and null band, ready to call from Python:

    split = make_split(dataset, peers, partition, seed, victims=[1, 7], fraction=0.5)
    candidates = Candidates.of(split)              # the victims' members and held-out records
    refs = References.build(split, candidates, observer=0, make_model=..., count=8,
                            recipe=dict(epochs=15, lr=0.1, batch=128), seed=0)
    evaluation = evaluate({"victim": {1: model_1, 7: model_7}}, candidates, refs)
    flat(evaluation)["auc/victim/LiRA offline"], evaluation["null_band"]

The attacks (`ATTACKS`): LOSS, calibrated and class-conditional LOSS, LiRA offline and online
(`lira`), each through every model given (a model, or a model per victim scoring that victim's
candidates). Beside them, always: the class-prior score (never looks at a model) and the same
attacks through a *blind* model that never saw a victim (trained on the observer's own shard), and
the permutation null band of the counts (`null_band_of`).

`References.build` is LiRA's orchestration: `count` reference models, each on a random half of the
candidate pool (every candidate in exactly half of them: `lira.inclusion_masks`) plus the
observer's own shard, which stands in for the rest of the network's data, trained in-process
without gossip; and the blind model on the observer's shard alone. They depend on the split and
the seed only, not on the algorithm attacked: build them once per seed.

A whole attacked run (training with an observer, then these attacks through every model the
observer can form of its neighbours, at several rounds): `attack_run`.

`Snapshots` is a training hook that keeps a peer's parameters at chosen fractions of the run (the
victims' own models: the truth an attack is judged against).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

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
from gossip_powersgd.training.hooks import SetupContext, TrainingHooks

__all__ = [
    "ATTACKS",
    "Candidates",
    "References",
    "Snapshots",
    "attack_scores",
    "evaluate",
    "flat",
    "null_band_of",
    "per_class",
]

#: The attacks, by the names reports and pages use.
ATTACKS = ("LOSS", "LOSS calibrated", "LOSS class-conditional", "LiRA offline", "LiRA online")


@dataclasses.dataclass
class Candidates:
    """The victims' members and held-out records, pooled: x, y, is_member, victim of each."""

    x: torch.Tensor
    y: torch.Tensor
    member: np.ndarray
    victim: np.ndarray

    @classmethod
    def of(cls, split: HeldOutSplit, victims: Optional[Sequence[int]] = None) -> "Candidates":
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
    """LiRA's reference statistics of every candidate (`count` models) and the blind model."""

    masks: np.ndarray  #: (models, candidates): model k trained on candidate i
    phi: np.ndarray  #: (models, candidates): logit-scaled confidence
    loss: np.ndarray  #: (models, candidates)
    blind: torch.nn.Module  #: trained on the observer's shard alone
    seconds: float  #: CPU seconds the models took

    @classmethod
    def build(
        cls,
        split: HeldOutSplit,
        candidates: Candidates,
        observer: int,
        make_model: Callable[[], torch.nn.Module],
        count: int,
        recipe: Dict[str, Any],
        seed: int,
    ) -> "References":
        """Train the reference models and the blind model (`recipe`: `lira.train_classifier`'s
        epochs, lr, batch and optional momentum, warmup_epochs); see the module docstring."""
        started = time.process_time()
        own_x, own_y = split.member_set(observer)
        masks = inclusion_masks(len(candidates.y), count, seed=seed)
        models = []
        for k in range(count):
            pick = torch.from_numpy(masks[k])
            torch.manual_seed(1000 * seed + k)
            x = torch.cat([candidates.x[pick], own_x])
            y = torch.cat([candidates.y[pick], own_y])
            models.append(train_classifier(make_model, x, y, seed=1000 * seed + k, **recipe))
        torch.manual_seed(1000 * seed + count)
        blind = train_classifier(make_model, own_x, own_y, seed=1000 * seed + count, **recipe)
        x, y = candidates.x, candidates.y
        phi = np.stack([logit_confidence(m, x, y) for m in models])
        loss = np.stack([-loss_scores(m, x, y) for m in models])
        bad = [
            k for k in range(count) if not (np.isfinite(phi[k]).all() & np.isfinite(loss[k]).all())
        ]
        if bad:
            raise ValueError(
                f"reference models {bad} of seed {seed} give non-finite scores (their logits "
                f"overflow: the recipe {recipe} diverges); lower lr or warm up longer"
            )
        return cls(masks, phi, loss, blind, time.process_time() - started)


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


def attack_scores(model, candidates: Candidates, refs: References) -> Dict[str, np.ndarray]:
    """Every attack's score of every candidate with `model` (or a model per victim) as target."""
    loss, phi = _target(model, candidates)
    return {
        "LOSS": -loss,
        "LOSS calibrated": calibrated_loss_scores(loss, refs.loss, refs.masks),
        "LOSS class-conditional": class_conditional_loss_scores(
            loss, candidates.y.numpy(), refs.loss, refs.masks
        ),
        "LiRA offline": lira_scores(phi, refs.phi, refs.masks),
        "LiRA online": lira_scores(phi, refs.phi, refs.masks, online=True),
    }


def _report(values: np.ndarray, candidates: Candidates, roc=False, per_class_auc=False) -> Dict:
    m, y = candidates.member, candidates.y.numpy()
    labels = (y[m], y[~m]) if per_class_auc else (None, None)
    out = attack_report(values[m], values[~m], *labels)
    if not roc:
        out.pop("roc")
    return out


def evaluate(
    models: Dict[str, Any],
    candidates: Candidates,
    refs: References,
    roc_models: Sequence[str] = (),
) -> Dict[str, Any]:
    """{"models": {model: {attack: report}}, "blind_model": {attack: report}, "class_prior":
    report, "null_band": ..., "fprs": ...}: every attack through every model of `models` (a
    model, or {victim: model}), the two blind baselines and the null band. Reports hold the AUC
    and TPR at `membership.LOW_FPRS`; the ROC for `roc_models`; LiRA offline's per-class AUC."""
    out: Dict[str, Any] = {"models": {}}
    for name, model in models.items():
        out["models"][name] = {
            a: _report(s, candidates, name in roc_models, a == "LiRA offline")
            for a, s in attack_scores(model, candidates, refs).items()
        }
    blind = attack_scores(refs.blind, candidates, refs)
    out["blind_model"] = {a: _report(s, candidates) for a, s in blind.items()}
    y = candidates.y.numpy()
    # The victims' whole shards (members and held-out): fitted on the members alone, the
    # frequencies would favour them.
    out["class_prior"] = _report(class_prior_scores(y, y, int(y.max()) + 1), candidates)
    m = candidates.member
    # A continuous score (no ties; LOSS ties at a loss of 0): the band depends on the counts only.
    out["null_band"] = null_band(blind["LiRA offline"][m], blind["LiRA offline"][~m])
    out["fprs"] = list(LOW_FPRS)
    return out


def flat(evaluation: Dict[str, Any]) -> Dict[str, float]:
    """An evaluation's numbers as flat keys "auc|tpr0.1|tpr1/MODEL/ATTACK" (the blind model as
    MODEL "blind model"; the class prior as "auc|tpr0.1|tpr1/class prior")."""
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
    """LiRA offline's AUC per class through `model`, in class order."""
    rep = evaluation["models"][model]["LiRA offline"]
    return [rep["per_class_auc"][c] for c in sorted(rep["per_class_auc"])]


_BANDS: Dict[tuple, Dict[str, list]] = {}


def null_band_of(members: int, nonmembers: int, permutations: int = 400) -> Dict[str, list]:
    """The permutation null band (`membership.null_band`) of a continuous score (no ties) for
    these counts: it depends on the counts only, so it is computed once from Gaussian scores."""
    key = (members, nonmembers, permutations)
    if key not in _BANDS:
        rng = np.random.default_rng(0)
        scores = rng.standard_normal(members), rng.standard_normal(nonmembers)
        _BANDS[key] = null_band(*scores, permutations=permutations)
    return _BANDS[key]


class Snapshots(TrainingHooks):
    """This peer's parameters when the steps at `fractions` of the run start their gossip (the
    instant of a recorded view's `own`: no algorithm changes the parameters before a step's first
    exchange): `parameters[step]`, for each step of `steps`. Steps are gossip steps, numbered as
    a view numbers them: with ``local_steps`` H, gossip step g follows optimizer step
    (g + 1) H - 1 (a gradient averager gossips in every optimizer step)."""

    name = "snapshots"

    def __init__(self, fractions: Sequence[float]):
        self.fractions = fractions
        self.context: Optional[SetupContext] = None
        self.every = 1  #: optimizer steps per gossip step
        self.steps: List[int] = []
        self.parameters: Dict[int, List[torch.Tensor]] = {}

    def setup(self, context: SetupContext) -> None:
        self.context = context
        mixes_parameters = getattr(context.algorithm, "acts_on", "parameters") == "parameters"
        self.every = context.config.local_steps if mixes_parameters else 1
        total = context.config.epochs * context.steps_per_epoch // self.every
        self.steps = sorted({max(0, round(f * total) - 1) for f in self.fractions})

    def after_optimizer_step(self, step: int) -> None:
        if (step + 1) % self.every:
            return  # no gossip after this optimizer step
        gossip_step = (step + 1) // self.every - 1
        if gossip_step in self.steps:
            self.parameters[gossip_step] = [
                p.detach().cpu().clone() for p in self.context.algorithm.params
            ]
