"""`python -m experiments privacy_mechanisms`: the mechanisms at equal ε in the attack pages'
regime, trained, attacked and audited as privacy_attacks.md's runs are."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Dict, List, Mapping

from gossip_powersgd.privacy.attack_run import MOVING, READ_OFF

from experiments.engine import Outputs, Rows, Run
from experiments.pages._markdown import table_rows, template
from experiments.pages._privacy import membership_split, quarters
from experiments.pages.privacy_attacks import regimes
from experiments.pages.privacy_attacks import tables as attack_tables
from experiments.pages.privacy_attacks import runs as attack_runs

from . import page
from .page import NAMES, PRIVATE
from .runs import DECOR_RATIO, RATIOS, noise_config, reuses_local

ALGORITHMS = (("exact gossip", "exact"), ("PowerGossip r1", "powergossip:rank=1"))
#: The target epsilon against a direct neighbour: the one the regime's DP recipe was chosen at.
TARGET = 8.0
RECEIVED = {"exact": READ_OFF, "powergossip": MOVING}
#: The attacks a row keeps of each model.
ATTACKS = ("LOSS", "LiRA offline", "LiRA online")


def calibration_setting(quick: bool) -> Dict[str, Any]:
    """What the calibration needs, from the regime's DP recipe and its split's public sizes."""
    r = regimes.regime("privacy_attacks", quick)
    setting, dp = r["setting"], r["setting"]["dp"]
    keys = ("topology", "dataset", "partition", "schedule")
    return dict({k: setting[k] for k in keys}, seeds=list(r["seeds"]), **dp)


def calibrate(c: Mapping[str, Any]) -> Dict[str, Any]:
    """{mechanism: noise and epsilons} at the victims' rate for the run's steps, public sizes."""
    from gossip_powersgd.privacy.mechanisms.calibration import calibrate as solve

    import topologies

    split_config = dict(c, fraction=regimes.FRACTION, observer=regimes.OBSERVER)
    split = membership_split(split_config, 0)
    total, peers = split.data().num_train, topologies.parse(c["topology"]).size
    members = len(split.member_set(split.victims[0])[1])
    steps = c["epochs"] * math.ceil(total / (peers * c["batch_size"]))
    recipe = (c["topology"], c["batch_size"], members, c["epochs"], c["lr"], c["schedule"])
    dp = dict(delta=c["dp_delta"], clip=c["dp_max_grad_norm"], steps=steps, **RATIOS)
    noises = solve(*recipe, target=TARGET, **dp)
    return dict(noises, public=dict(train_size=total, members=members, peers=peers))


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    r = regimes.regime("privacy_attacks", quick)
    split, train, reference = attack_runs.configs(r)
    runs = [Run("calibration", dict(kind="calibration", setting=calibration_setting(quick)))]
    runs += [Run(f"split/seed{s}", dict(kind="split", split=split), s) for s in r["seeds"]]
    noises = rows.get("calibration")
    if noises is None:
        return runs
    canaries = min(r["canaries"], 32) if quick else r["canaries"]
    base = dict(kind="attack", split=split, reference=reference, references=r["references"])
    mechanisms = [m for m in ("none",) + PRIVATE if m != "muffliato" or not reuses_local(noises)]
    for wave in r.get("seed_waves", (r["seeds"],)):
        for seed in (s for s in wave if s in r["seeds"]):
            for (label, spec), mechanism in itertools.product(ALGORITHMS, mechanisms):
                mine = dict(train, algorithm=spec)
                if mechanism != "none":  # the DP recipe, no peer statistic released
                    mine.update(r["setting"]["dp"], release_peer_statistics=False)
                    mine.update(noise_config(mechanism, noises[mechanism]))
                    mine["public_train_size"] = noises["public"]["train_size"]
                mine["eval_every"] = max(1, mine["epochs"] // 4)  # quarters: the plateau check
                config = dict(base, spec=spec, target=None, train=mine, canaries=canaries)
                config.update(mechanism=mechanism, label=label)
                runs.append(Run(f"{mechanism}/{label}/seed{seed}", config, seed))
    # --jobs starts the costliest first: the cost is the plan's order (seed 0's runs first)
    return [dataclasses.replace(run, cost=len(runs) - n) for n, run in enumerate(runs)]


def row(run: Run) -> Dict[str, Any]:
    """A calibration, a split, or an attacked run in the mechanisms pages' row format."""
    import os

    kind = run.config["kind"]
    if kind == "calibration":
        return calibrate(run.config["setting"])
    if kind == "split":
        return attack_runs.row(run)
    c, start = run.config, os.getloadavg()[0]
    split = membership_split(c["split"], run.seed)
    out = attack_runs.attacked(c, run.seed, split)
    return dict(mechanism_row(out, c), load=[start, out["load"]], nice=os.nice(0))


def mechanism_row(out: Dict[str, Any], c: Mapping[str, Any]) -> Dict[str, Any]:
    """An attacked run's row (`attack_runs.attacked`) in the mechanisms pages' format."""
    last = out["rounds"][str(out["last"])]
    flat, band = last["flat"], last["evaluation"]["null_band"]
    models = {"received": RECEIVED[c["spec"].split(":")[0]], "victim's own": "victim"}
    models["blind model"] = "blind model"
    m = dict(mechanism=c["mechanism"], algorithm=c["label"], topology=c["split"]["topology"])
    m.update({k: out[k] for k in ("seed", "steps", "epochs", "acc_avg", "acc_victim")})
    m.update(quarters(out["evals"], out["epochs"]), mb_per_peer=out["mb_sent_per_peer"])
    m.update({k: out["evals"][-1][k] for k in ("acc_local_mean", "acc_local_min")})
    m.update({k: out[k] for k in ("run_seconds", "members", "nonmembers", "sigma")})
    for x in ("auc", "tpr1", "tpr0.1"):
        for attack, (name, model) in itertools.product(ATTACKS, models.items()):
            m[f"{x}/{name}/{attack}"] = flat[f"{x}/{model}/{attack}"]
        m[f"{x}/class prior"] = flat[f"{x}/class prior"]
    m.update({"null/auc": band["auc"], "null/tpr0.1": band["tpr"][0], "null/tpr1": band["tpr"][1]})
    audit = out["audit"]
    m["audit"] = {k: v for k, v in audit.items() if k not in ("included",)}
    for name in ("observer", "victim", "blind model"):
        m["audit"][name] = {k: v for k, v in audit[name].items() if k != "scores"}
    return m


def render(rows: Rows) -> Outputs:
    """The page (audited.md) and its CSV: the one topology's section, the audit, the regime."""
    (calibrated,) = [r for r in rows.records if r.config["kind"] == "calibration"]
    runs = [r.row for r in rows.records if r.config["kind"] == "attack"]
    noises = {k: v for k, v in calibrated.row.items() if k in PRIVATE}
    section = dict(setting=calibrated.config["setting"], noises=noises, rows=runs)
    section["reuse_muffliato"] = reuses_local(calibrated.row)
    c = dict(target=TARGET, algorithms=[a for a, _ in ALGORITHMS])
    regime = regimes.regime("privacy_attacks", rows.records[0].quick)
    s, public = regime["setting"], calibrated.row["public"]
    fields = dict(regime=regime, s=s, dp=s["dp"], public=public, local=calibrated.row["local"])
    fields.update(data=s["dataset"].split(":")[0], records=public["train_size"] // public["peers"])
    fields.update(seeds=", ".join(map(str, regime["seeds"])), ratio=DECOR_RATIO)
    fields.update(observer=regimes.OBSERVER, audit=audit_lines(section, c))
    fields["audit_answers"] = audit_answers(section)
    load = [(runs[0]["load"][0], runs[-1]["load"][1])]  # the first run's start, the last's end
    nice = [all(r["nice"] for r in runs)]
    text = template(__file__, "audited.md")
    return page.outputs("privacy_mechanisms", text, rows, [section], c, load, nice, **fields)


def audit_lines(section, c) -> List[str]:
    """The claim and the audit's bounds per (mechanism, algorithm), a value per seed."""
    out = []
    for name, algorithm, group in page.groups(section["rows"], c["algorithms"]):
        n = section["noises"].get(name)
        claim = f"{n['neighbour']:.2f} / {n['neighbour_pld']:.2f}" if n else "∞ (no DP)"
        bounds = [attack_tables.bounds(group, s) for s in ("observer", "victim", "blind model")]
        out.append([NAMES[name], algorithm, claim, *bounds, attack_tables.right(group)])
    return table_rows(out)


def audit_answers(section) -> List[str]:
    """The audit's answers, and whether the blind baseline stays at chance."""
    rows, noises = section["rows"], section["noises"]
    private = [r for r in rows if r["mechanism"] != "none"]
    claims = [noises[r["mechanism"]]["neighbour"] for r in private]
    plain = [r for r in rows if r["mechanism"] == "none"]
    blind = max(r["audit"]["blind model"]["epsilon"] for r in rows)
    end = " (chance: 0 expected)." if blind == 0 else "."
    return attack_tables.audit_words(private, claims, plain, share=False) + [
        page.WORDS["blind"].format(blind) + end
    ]
