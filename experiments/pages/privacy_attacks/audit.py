"""The attack pages' one-run audit and their gossip-trained LiRA reference models.

Audit (`privacy.audit`, Steinke, Nasr and Jagielski 2023): every attacked run carries
`regimes.CANARIES_PER_VICTIM` canaries per victim (`privacy.canaries.Canaries`), each in the
victim's data with probability 1/2 from a keystream secret to the victim (fresh OS entropy: the run's seed,
which the neighbour knows, says nothing of it). The canaries themselves are public (drawn from
the run's seed): Gaussian inputs at the data's scale with a uniformly random label, records
unlike any real one, the auditor's usual choice. After training each canary is scored by how
much lower its loss is under a model than under the initial model every peer knows
(`canaries.loss_drop_scores`), through the observer's reconstruction of the victim
(`canaries.observed_model`) and, as the white-box bound, the victim's own model; the two
victims' canaries are pooled (each canary's inclusion changes one record of one victim's data:
the run is (ε, δ)-DP in each at the victims' ε) and `audit.best_audit` turns the guesses into an
ε lower bound at 95 % confidence over COUNTS, fixed here before any score is seen.

References (`gossip_references`): LiRA's reference models trained the way the victim is: each is
a whole gossip run of the row's non-private recipe on the same topology (exact gossip), in which
each victim trains on a random half of its candidates (members and held-out records: every
candidate in exactly half of the references, `lira.inclusion_masks`), as many records as it
trains on in the attacked run, and every other peer on its own shard (population data from the
same distribution, never a candidate: LiRA's shadow-model assumption). A reference's model of a
candidate is that candidate's victim's final model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

import numpy as np
import torch

#: (k_pos, k_neg) tried by the audit (Bonferroni over them), as fractions of the canaries.
COUNT_FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.5)
CONFIDENCE = 0.95
#: The keystream-independent (public) generator of the canaries: a function of the run's seed.
CANARY_SEED = 0xCA7A


def counts(m: int) -> List[tuple]:
    """The (k_pos, k_neg) the audit tries for m canaries: half guesses in, half out."""
    return [(max(1, int(f * m) // 2), max(1, int(f * m) // 2)) for f in COUNT_FRACTIONS]


def make_canaries(data, m: int, victim: int, seed: int):
    """m public canaries for `victim`: Gaussian inputs with the training inputs' mean and
    standard deviation, labels uniform over the classes."""
    g = torch.Generator().manual_seed(CANARY_SEED * 1000 + 100 * int(seed) + int(victim))
    x_train = data.x_train.float()
    x = torch.randn((m, *x_train.shape[1:]), generator=g) * x_train.std() + x_train.mean()
    y = torch.randint(0, data.num_classes, (m,), generator=g, dtype=data.y_train.dtype)
    return x.to(data.x_train.dtype), y


def canary_hooks(victims: Sequence[int], data, m: int, seed: int) -> List[Any]:
    """One `Canaries` hook per victim, each with its own secret (OS-entropy) inclusion coins."""
    from gossip_powersgd.privacy.canaries import Canaries

    hooks = [Canaries(v, *make_canaries(data, m, v, seed)) for v in victims]
    for hook in hooks:
        hook.name = f"canaries of peer {hook.victim}"  # checkpoint state is keyed by name
    return hooks


def audit_report(hooks, observed, make, initial, delta: float) -> Dict[str, Any]:
    """{"model": {"epsilon", "guesses", "correct", "k_pos", "k_neg"}, for "observer" (its
    reconstruction of each victim) and "victim" (its own model), plus the scores and the truth
    (so the figure can be checked from the row: `audit.best_audit` on them)."""
    from gossip_powersgd.privacy.audit import best_audit
    from gossip_powersgd.privacy.canaries import loss_drop_scores, observed_model
    from gossip_powersgd.privacy.membership import model_with_parameters

    last = observed.steps[-1]
    truth = torch.cat([h.included for h in hooks]).numpy()
    out: Dict[str, Any] = dict(included=truth.astype(int).tolist(), delta=delta, m=len(truth))
    out.update(confidence=CONFIDENCE, counts=counts(len(truth)))
    models = {
        "observer": lambda v: observed_model(observed.view, v, make()),
        "victim": lambda v: model_with_parameters(make(), observed.snapshots[v][last]),
    }
    for name, model_of in models.items():
        scores = np.concatenate(
            [loss_drop_scores(model_of(h.victim), initial, h.x, h.y) for h in hooks]
        )
        result = best_audit(scores, truth, delta, counts(len(truth)), CONFIDENCE)
        out[name] = dict(dataclasses.asdict(result), scores=scores.tolist())
    return out


def check(audit: Mapping[str, Any], source: str) -> float:
    """The audit's bound recomputed from the row's stored scores and truth."""
    from gossip_powersgd.privacy.audit import best_audit

    scores, truth = np.array(audit[source]["scores"]), np.array(audit["included"]).astype(bool)
    counts_ = [tuple(c) for c in audit["counts"]]
    return best_audit(scores, truth, audit["delta"], counts_, audit["confidence"]).epsilon


def _cache(split, train: Mapping[str, Any], count: int, seed: int, k: int) -> Path:
    """Where reference k's statistics wait for the other runs of this plan (a function of what
    determines them: the split, the recipe, the count and the seed)."""
    text = json.dumps([split.key(), dict(train), count, seed, k], sort_keys=True)
    name = hashlib.sha256(text.encode()).hexdigest()[:24]
    return Path(tempfile.gettempdir()) / "gossip_powersgd_lira" / f"{name}.pt"


@contextlib.contextmanager
def _locked(path: Path):
    """Hold an exclusive lock beside `path`: a second process waits while the first builds it."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def reference_stats(split, candidates, train, count: int, seed: int, observer: int, k: int):
    """(phi, loss) of every candidate under reference run k (`gossip_references`), built once:
    a process that needs it while another builds it waits, then reads it (cached on disk)."""
    from gossip_powersgd.privacy.attack_run import observe
    from gossip_powersgd.privacy.lira import inclusion_masks, logit_confidence
    from gossip_powersgd.privacy.membership import loss_scores, model_with_parameters
    from gossip_powersgd.training.models import build_model

    path = _cache(split, train, count, seed, k)
    with _locked(path):
        if path.exists():
            saved = torch.load(path, weights_only=True)
            return saved["phi"].numpy(), saved["loss"].numpy()
        base, mask = split.data(), inclusion_masks(len(candidates.y), count, seed=seed)[k]
        index = np.concatenate([np.r_[split.members[v], split.heldout[v]] for v in split.victims])
        members = dict(split.members)
        for v in split.victims:
            members[v] = np.sort(index[(candidates.victim == v) & mask])
        reference = dataclasses.replace(split, members=members)
        ran = observe(dict(train, seed=1000 * seed + k), reference, observer, (1.0,))
        phi, loss = np.empty(len(index)), np.empty(len(index))
        for v in split.victims:
            model = build_model(train["model"], base.input_shape, base.num_classes, 0)
            model = model_with_parameters(model, ran.snapshots[v][ran.steps[-1]])
            where = np.flatnonzero(candidates.victim == v)
            x, y = candidates.x[torch.from_numpy(where)], candidates.y[torch.from_numpy(where)]
            phi[where], loss[where] = logit_confidence(model, x, y), -loss_scores(model, x, y)
        partial = path.with_suffix(".part")
        torch.save({"phi": torch.from_numpy(phi), "loss": torch.from_numpy(loss)}, partial)
        os.replace(partial, path)
        return phi, loss


def gossip_references(
    split, candidates, train: Mapping[str, Any], count: int, seed: int, observer: int
):
    """`count` reference runs by gossip (module docstring) and the blind model (trained alone on
    the observer's shard, as `References.build` does): a `privacy.attacks.References`."""
    from gossip_powersgd.privacy.attacks import References
    from gossip_powersgd.privacy.lira import inclusion_masks, train_classifier
    from gossip_powersgd.training.models import build_model

    started, base = time.process_time(), split.data()
    stats = [
        reference_stats(split, candidates, train, count, seed, observer, k) for k in range(count)
    ]
    phi, loss = np.stack([p for p, _ in stats]), np.stack([q for _, q in stats])

    def make():
        return build_model(train["model"], base.input_shape, base.num_classes, 0)

    own_x, own_y = split.member_set(observer)
    recipe = dict(epochs=train["epochs"], lr=train["lr"], batch=train["batch_size"])
    recipe.update(momentum=train["momentum"], warmup_epochs=train["warmup_epochs"])
    torch.manual_seed(1000 * seed + count)
    blind = train_classifier(make, own_x, own_y, seed=1000 * seed + count, **recipe)
    masks = inclusion_masks(len(candidates.y), count, seed=seed)
    return References(masks, phi, loss, blind, time.process_time() - started)


def _bounds(group, source: str) -> str:
    return " / ".join(f"{r['audit'][source]['epsilon']:.2f}" for r in group)


def audit_section(groups) -> str:
    """The one-run audit beside the claim, per (algorithm, ε) of the rows that carry canaries."""
    from .tables import _dp, label

    lines = []
    for g in groups:
        if not all("audit" in r for r in g):
            continue
        claimed = [max(r["eps_victims"] or [r["eps_max"]]) for r in g]
        best = [(r["audit"]["victim"]["correct"], r["audit"]["victim"]["guesses"]) for r in g]
        lines.append(
            f"| {label(g[0]['spec'])} | {_dp(g)} | "
            + (" / ".join(f"{e:.2f}" for e in claimed) if g[0]["target"] else "∞ (no DP)")
            + f" | {_bounds(g, 'observer')} | {_bounds(g, 'victim')} | {g[0]['audit']['m']} | "
            + " / ".join(f"{c}/{n}" for c, n in best)
            + " |"
        )
    if not lines:
        return ""
    r = next(r for g in groups for r in g if "audit" in r)["audit"]
    return (
        "## One-run audit: claimed and audited ε\n\n"
        f"Steinke, Nasr and Jagielski's one-run audit (`gossip_powersgd.privacy.audit`): each "
        f"victim's data carries {r['m'] // 2} public canaries (Gaussian inputs at the data's "
        "scale, a random label), each included with probability ½ by coins from the victim's "
        "own secret keystream (never the run's seed, which the neighbour knows); the two "
        f"victims' {r['m']} canaries are pooled. Each canary is scored by how much lower its "
        "loss is under a model than under the initial model every peer knows, through the "
        "observer's reconstruction of the victim at the end (what the neighbour can do: exact "
        "gossip's model as sent, PowerGossip's moving least squares of reconstruction.py, "
        "Choco's public copy) and through the "
        "victim's own model (the white-box bound: every message is post-processing of it); the "
        f"audit guesses in / out for the k highest / lowest scores, k over {len(r['counts'])} "
        "counts fixed before the run (Bonferroni), and reports the largest ε its right guesses "
        f"refute at {100 * r['confidence']:.0f} % confidence, δ = {r['delta']:g}, add/remove "
        "adjacency of one record (the claim's). A lower bound above the claim would prove the "
        "claim wrong; one far below it says only that this audit does not come close (with "
        f"these canaries even every guess right would show no more than {ceiling(r):.2f}). One "
        "value per seed.\n\n"
        "| algorithm | DP | claimed ε (victims', per seed) | audited ε ≥, observer's "
        "reconstruction | audited ε ≥, victim's own model | canaries | right / guesses (victim's "
        "model, best count) |\n|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n\n"
    )


def ceiling(audit: Mapping[str, Any]) -> float:
    """The largest bound this audit can give (every guess right, at the best count)."""
    from gossip_powersgd.privacy.audit import epsilon_lower_bound

    level = 1 - (1 - audit["confidence"]) / len(audit["counts"])
    return max(
        epsilon_lower_bound(audit["m"], a + b, a + b, audit["delta"], level)
        for a, b in audit["counts"]
    )


def audit_answers(groups) -> List[str]:
    """Is any claim refuted? How close does the audit come to it? (from the rows)"""
    rows = [r for g in groups for r in g if "audit" in r]
    private = [r for r in rows if r["target"] is not None]
    plain = [r for r in rows if r["target"] is None]
    out = []
    if private:
        claims = [max(r["eps_victims"] or [r["eps_max"]]) for r in private]
        bounds = [max(r["audit"][s]["epsilon"] for s in ("observer", "victim")) for r in private]
        refuted = sum(b > c for b, c in zip(bounds, claims))
        out.append(
            f"- Does the one-run audit refute a claimed ε? In {refuted} of {len(private)} private "
            f"runs its lower bound exceeds the claim; the highest bound is {max(bounds):.2f} "
            f"(claims {min(claims):.2f}–{max(claims):.2f}), the bound's share of the claim at "
            f"most {max(b / c for b, c in zip(bounds, claims)):.2f}."
        )
    if plain:
        best = max(r["audit"]["victim"]["epsilon"] for r in plain)
        seen = max(r["audit"]["observer"]["epsilon"] for r in plain)
        out.append(
            f"- Without DP the same audit proves ε ≥ {best:.2f} from the victims' own models and "
            f"≥ {seen:.2f} from the observer's reconstructions; every guess right would show "
            f"{ceiling(plain[0]['audit']):.2f} with these {plain[0]['audit']['m']} canaries."
        )
    return out
