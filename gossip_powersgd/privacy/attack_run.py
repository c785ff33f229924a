"""One attacked run, ready to call from Python: train a config on a membership split while an
observer records what it receives and every peer's parameters are kept at chosen fractions of
the run, then measure what the observer learns of its neighbours (the split's victims):

    split = make_split(dataset, 8, "iid", 0, victims=[1, 7], fraction=0.5, split_seed=seed)
    run = observe(config, split, observer=0, fractions=(0.25, 0.5, 0.75, 1.0))
    refs = References.build(split, Candidates.of(split), 0, make_model, 8, recipe, seed)
    rounds = neighbour_report(run, split, refs, make_model)   # {step: {"flat", "quality", ...}}

`reconstructions` gives every estimate the observer can form of a neighbour's model from its view
(`views.ObservedView`) at chosen steps: for PowerGossip the moving-M least squares of
`reconstruction.reconstruct`, least squares on the model difference (`estimators`, a static and a
drift-aware window) and, given the truth, the oracle ceiling; for other algorithms the model read
off the messages (exact gossip) or the public copy (Choco). `neighbour_report` judges each by what
it enables (every attack through it, `attacks.evaluate`, with the blind baselines and null band)
and by its agreement with the truth (`quality`), beside the victim's own model (the ceiling) and,
at the last step, the observer's own model and the average of all.

`own_model_loss_attack` is the white-box LOSS attack through each victim's own final model (the
ceiling of what its messages give away), with the victims' test accuracy: a cheap check that a
regime is attackable at all. `received_attack` is the neighbour's attack at the end of a run through the one estimate it reads
off (or reconstructs from) each victim's messages, beside the victims' own models.

`canary_audit` is the one-run audit of a run that carried canaries (`canaries.canary_hooks`
passed to `observe`): each canary scored by its loss drop from the public initial model through
the observer's reconstruction of its victim and through the victim's own model, the victims'
canaries pooled (each canary's inclusion changes one record of one victim's data), and
`audit.best_audit` over counts fixed before any score is seen; `recheck_audit` recomputes its
bound from the record it returns.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
import torch

from gossip_powersgd.privacy.attacks import Candidates, References, Snapshots, evaluate, flat
from gossip_powersgd.privacy.attacks import per_class

__all__ = [
    "ESTIMATORS",
    "ORACLE",
    "ObservedRun",
    "canary_audit",
    "neighbour_report",
    "observe",
    "own_model_loss_attack",
    "quality",
    "received_attack",
    "reconstructions",
    "recheck_audit",
    "victim_accuracy",
]


#: Least squares on the model difference D: (name, window in messages, forgetting factor).
ESTIMATORS = (
    ("LS on D, 64 msgs", 64, 1.0),
    ("LS on D drift-aware, 256 msgs, forget 0.97", 256, 0.97),
)
#: The oracle's name: the true D projected on the span of every factor seen (a ceiling).
ORACLE = "oracle: D on the span of all factors"
MOVING, READ_OFF = "moving M, 4 msgs (reconstruction.py)", "read off / public copy"


def reconstructions(
    view, victims: Sequence[int], steps: Sequence[int], truth: Optional[Dict] = None
) -> Dict[int, Dict[str, Dict[int, List[torch.Tensor]]]]:
    """{step: {estimator: {victim: parameters}}}: every estimate of each victim's parameters the
    observer forms from `view` at each of `steps` (see the module docstring). `truth`:
    {victim: {step: parameters}} for the oracle (PowerGossip only; None: no oracle)."""
    from gossip_powersgd.privacy.estimators import difference_estimates, oracle_estimates
    from gossip_powersgd.privacy.reconstruction import reconstruct

    powergossip = view.meta["algorithm"] == "powergossip"
    out: Dict[int, Dict[str, Dict[int, List[torch.Tensor]]]] = {s: {} for s in steps}
    for v in victims:
        moving = reconstruct(view, v, window=4)  # every step at once
        for step in steps:
            if not powergossip:
                out[step].setdefault(READ_OFF, {})[v] = moving[step]
                continue
            out[step].setdefault(MOVING, {})[v] = moving[step]
            for name, window, forget in ESTIMATORS:
                estimate = difference_estimates(view, v, [step], window=window, forget=forget)
                out[step].setdefault(name, {})[v] = estimate[step]
            if truth is not None:
                known = {step: truth[v][step]}
                estimate = oracle_estimates(view, v, known, [step], window=10**9)
                out[step].setdefault(ORACLE, {})[v] = estimate[step]
    return out


def quality(estimates: Dict[int, list], truth: Dict[int, list], model_of, x) -> Dict[str, float]:
    """Mean over the victims of the relative L2 error of `estimates` ({victim: parameters})
    against `truth`, and of the share of `x` on which their models (`model_of(parameters)`)
    predict the same class."""
    from gossip_powersgd.privacy.estimators import prediction_agreement
    from gossip_powersgd.privacy.reconstruction import relative_error

    victims = list(estimates)
    l2 = sum(relative_error(estimates[v], truth[v]) for v in victims) / len(victims)
    agree = [prediction_agreement(model_of(estimates[v]), model_of(truth[v]), x) for v in victims]
    return {"l2": l2, "agreement": sum(agree) / len(victims)}


@dataclasses.dataclass
class ObservedRun:
    """A run trained by `observe`: its result, the observer's view, every peer's parameters at the
    snapshot steps ({rank: {step: parameters}}), those steps, and the seconds training took."""

    result: Any  #: `gossip_powersgd.RunResult`
    view: Any  #: `views.ObservedView`
    snapshots: Dict[int, Dict[int, List[torch.Tensor]]]
    steps: List[int]
    observed_bytes: int
    seconds: float


def _hooks(
    kept: Dict[int, Dict[str, Any]], observer: int, fractions, first: Sequence[Any], rank: int
) -> List[Any]:
    from gossip_powersgd.privacy.observing import ObserverHooks

    mine = kept[rank] = {"observer": ObserverHooks([observer]), "snap": Snapshots(fractions)}
    return [*first, mine["observer"], mine["snap"]]


def observe(
    config: Dict[str, Any],
    split,
    observer: int,
    fractions: Sequence[float],
    hooks: Sequence[Any] = (),
) -> ObservedRun:
    """Train `config` (a `gossip_powersgd.run` config) on `split`'s data (``partition: local``:
    no peer can train on a held-out record) with `observer` recording its view and every peer's
    parameters kept at `fractions` of the run (`attacks.Snapshots`). `hooks`: training hooks
    every peer runs first (before the config's own: `privacy.canaries.Canaries`, for one)."""
    from gossip_powersgd import run
    from gossip_powersgd.privacy.views import ObservedView

    kept: Dict[int, Dict[str, Any]] = {}
    data = dict(config, dataset=split.spec(), partition="local")
    started = time.perf_counter()
    result = run(data, hooks=functools.partial(_hooks, kept, observer, fractions, tuple(hooks)))
    seconds = time.perf_counter() - started
    recorder = kept[observer]["observer"].recorder
    view = ObservedView(recorder.meta, recorder.records)
    snaps = {rank: hooks["snap"].parameters for rank, hooks in kept.items()}
    steps = kept[observer]["snap"].steps
    return ObservedRun(result, view, snaps, steps, recorder.bytes_recorded, seconds)


def neighbour_report(
    run: ObservedRun, split, observer: int, refs: References, make_model: Callable, x_test
) -> Dict[str, Any]:
    """{str(step): {"flat": every attack's AUC and TPRs through every model, "quality": each
    estimate's relative L2 error and prediction agreement on `x_test`}} at each snapshot step;
    the last step also holds the whole "evaluation" (ROC curves included) and LiRA offline's
    per-class AUC through the victim's model ("per_class_victim")."""
    from gossip_powersgd.privacy.membership import model_with_parameters

    def model(parameters):
        return model_with_parameters(make_model(), parameters)

    snaps, victims, last = run.snapshots, split.victims, run.steps[-1]
    candidates = Candidates.of(split)
    powergossip = run.view.meta["algorithm"] == "powergossip"
    estimates = reconstructions(run.view, victims, run.steps, snaps if powergossip else None)
    out: Dict[str, Any] = {}
    for step in run.steps:
        truth = {v: snaps[v][step] for v in victims}
        models = {"victim": {v: model(truth[v]) for v in victims}}
        for name, per in estimates[step].items():
            models[name] = {v: model(per[v]) for v in victims}
        if step == last:
            models["observer's own"] = {v: model(snaps[observer][step]) for v in victims}
            average = [torch.stack(ts).mean(0) for ts in zip(*(s[step] for s in snaps.values()))]
            models["average of all"] = {v: model(average) for v in victims}
        evaluation = evaluate(
            models, candidates, refs, roc_models=list(models) if step == last else ()
        )
        judged = {**estimates[step], "observer's own": {v: snaps[observer][step] for v in victims}}
        entry = {
            "flat": flat(evaluation),
            "quality": {name: quality(per, truth, model, x_test) for name, per in judged.items()},
        }
        if step == last:
            entry.update(evaluation=evaluation, per_class_victim=per_class(evaluation, "victim"))
        out[str(step)] = entry
    return out


def victim_accuracy(run: ObservedRun, victims: Sequence[int], make_model: Callable, x, y):
    """Each victim's own model's accuracy on (x, y) at `run`'s last snapshot step."""
    from gossip_powersgd.privacy.membership import model_with_parameters

    out = []
    for v in victims:
        model = model_with_parameters(make_model(), run.snapshots[v][run.steps[-1]])
        with torch.no_grad():
            out.append(float((model(x).argmax(1) == y).double().mean()))
    return out


def own_model_loss_attack(
    run: ObservedRun, split, make_model: Callable, fpr: float = 0.001
) -> Dict[str, Any]:
    """LOSS through each victim's own model at `run`'s last snapshot step, every candidate of
    `split` (`Candidates.of`) scored by its victim's model and pooled: {"auc", "tpr" (at `fpr`),
    "band" (`attacks.null_band_of` the counts), "members", "nonmembers", "accuracy" (each
    victim's test accuracy, in `split.victims` order)}."""
    from gossip_powersgd.privacy.attacks import null_band_of
    from gossip_powersgd.privacy.membership import auc, loss_scores, model_with_parameters
    from gossip_powersgd.privacy.membership import tpr_at_fpr

    base, last, candidates = split.data(), run.steps[-1], Candidates.of(split)
    scores = np.empty(len(candidates.y))
    for v in split.victims:
        model = model_with_parameters(make_model(), run.snapshots[v][last])
        where = candidates.victim == v
        index = torch.from_numpy(np.flatnonzero(where))
        scores[where] = loss_scores(model, candidates.x[index], candidates.y[index])
    m = candidates.member
    members, nonmembers = int(m.sum()), int((~m).sum())
    return dict(
        auc=auc(scores[m], scores[~m]),
        tpr=tpr_at_fpr(scores[m], scores[~m], fpr),
        band=null_band_of(members, nonmembers),
        members=members,
        nonmembers=nonmembers,
        accuracy=victim_accuracy(run, split.victims, make_model, base.x_test, base.y_test),
    )


def received_attack(
    view,
    snapshots: Mapping[int, Mapping[int, List[torch.Tensor]]],
    candidates: Candidates,
    refs: References,
    make_model: Callable,
    window: int = 4,
) -> Dict[str, Any]:
    """Every attack (`attacks.evaluate`, flat) on the victims of `candidates` at the last snapshot
    step, through the model the observer reads off their messages (exact gossip) or reconstructs
    from their last `window` messages (`reconstruction.reconstruct`: "received") and through each
    victim's own model ("victim's own", the ceiling), beside the blind baselines; plus the null
    band ("null/auc", "null/tpr0.1", "null/tpr1") and the candidates' counts. `snapshots`:
    {rank: {step: parameters}} (`ObservedRun.snapshots`)."""
    from gossip_powersgd.privacy.membership import model_with_parameters
    from gossip_powersgd.privacy.reconstruction import reconstruct

    victims = sorted({int(v) for v in candidates.victim})
    last = max(next(iter(snapshots.values())))
    received = {}
    for v in victims:
        estimates = reconstruct(view, v, window=window)
        at = max(k for k in estimates if k <= last)
        received[v] = model_with_parameters(make_model(), estimates[at])
    own = {v: model_with_parameters(make_model(), snapshots[v][last]) for v in victims}
    evaluation = evaluate({"received": received, "victim's own": own}, candidates, refs)
    band = evaluation["null_band"]
    out = flat(evaluation)
    out.update(
        {"null/auc": band["auc"], "null/tpr0.1": band["tpr"][0], "null/tpr1": band["tpr"][1]}
    )
    out.update(members=int(candidates.member.sum()), nonmembers=int((~candidates.member).sum()))
    return out


def canary_audit(
    hooks: Sequence[Any],
    run: ObservedRun,
    make_model: Callable,
    initial: torch.nn.Module,
    delta: float,
    counts: Optional[Sequence[tuple]] = None,
    confidence: Optional[float] = None,
    blind: Optional[torch.nn.Module] = None,
) -> Dict[str, Any]:
    """The one-run audit of `run`, trained with the `canaries.Canaries` `hooks` (one per victim):
    {"observer" (through its reconstruction of each victim at the end) and "victim" (its own
    final model): `audit.AuditResult` fields and the canaries' "scores"; "included" (the truth),
    "delta", "m", "confidence", "counts"}. `initial`: the public initial model; `counts`: the
    (k_pos, k_neg) tried (default `audit.audit_counts`), `confidence` default `audit.CONFIDENCE`.
    `blind`: a model that never saw a victim (`attacks.References.blind`): the same audit through
    it ("blind model") is the blind baseline, a bound that only chance can lift above 0."""
    from gossip_powersgd.privacy.audit import CONFIDENCE, audit_counts
    from gossip_powersgd.privacy.canaries import observed_model
    from gossip_powersgd.privacy.membership import model_with_parameters

    last = run.steps[-1]
    truth = torch.cat([h.included for h in hooks]).numpy()
    counts = audit_counts(len(truth)) if counts is None else [tuple(c) for c in counts]
    out: Dict[str, Any] = dict(included=truth.astype(int).tolist(), delta=delta, m=len(truth))
    out.update(confidence=CONFIDENCE if confidence is None else confidence, counts=counts)
    models = {
        "observer": lambda v: observed_model(run.view, v, make_model()),
        "victim": lambda v: model_with_parameters(make_model(), run.snapshots[v][last]),
    }
    if blind is not None:
        models["blind model"] = lambda v: blind
    for name, model_of in models.items():
        out[name] = _audited(hooks, model_of, initial, out)
    return out


def _audited(hooks, model_of, initial, record: Mapping[str, Any]) -> Dict[str, Any]:
    from gossip_powersgd.privacy.audit import best_audit
    from gossip_powersgd.privacy.canaries import loss_drop_scores

    scores = np.concatenate(
        [loss_drop_scores(model_of(h.victim), initial, h.x, h.y) for h in hooks]
    )
    truth = np.array(record["included"]).astype(bool)
    result = best_audit(scores, truth, record["delta"], record["counts"], record["confidence"])
    return dict(dataclasses.asdict(result), scores=scores.tolist())


def recheck_audit(record: Mapping[str, Any], source: str) -> float:
    """The bound of `record[source]` (a `canary_audit` record, e.g. read back from JSON)
    recomputed from its stored scores and truth: `best_audit` again, nothing trusted."""
    from gossip_powersgd.privacy.audit import best_audit

    scores, truth = np.array(record[source]["scores"]), np.array(record["included"]).astype(bool)
    counts = [tuple(c) for c in record["counts"]]
    return best_audit(scores, truth, record["delta"], counts, record["confidence"]).epsilon
