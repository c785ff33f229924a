"""`python -m experiments privacy_mechanisms`: local DP-SGD, Muffliato, ZIP-DL and DECOR in the
attack pages' regime, at equal epsilon against a neighbour, on exact gossip and PowerGossip r1,
each run attacked and audited in one run.

The plan: the calibration (each mechanism's noise for TARGET against a direct neighbour, at the
victims' sampling rate and the run's steps), the membership split of each seed, then every
(algorithm, mechanism, seed) trained and attacked as privacy_attacks.md's runs are
(`privacy_attacks.runs.attacked`, canaries included). Private runs release no peer statistic
(add/remove adjacency, the claim's). Rows: the logreg page's format (`runs.row`), rendered with
`page`'s tables; the fixed text is audited.md beside this file.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Dict, List, Mapping

from gossip_powersgd.privacy.attack_run import MOVING, READ_OFF

from experiments.engine import Outputs, Rows, Run, made_by
from experiments.pages._markdown import fill, template
from experiments.pages._markdown import table as md_table
from experiments.pages.privacy_attacks import regimes
from experiments.pages.privacy_attacks import runs as attack_runs

from . import calibration, page
from .page import NAMES, PRIVATE

ALGORITHMS = (("exact gossip", "exact"), ("PowerGossip r1", "powergossip:rank=1"))
MECHANISMS = ("local", "muffliato", "zipdl", "decor")
#: The target epsilon against a direct neighbour: the one the regime's DP recipe was chosen at.
TARGET = 8.0
RECEIVED = {"exact": READ_OFF, "powergossip": MOVING}


def _regime(quick: bool) -> Dict[str, Any]:
    return regimes.regime("privacy_attacks", quick)


def calibration_setting(quick: bool) -> Dict[str, Any]:
    """What the calibration needs, from the regime's DP recipe and its split's public sizes."""
    r = _regime(quick)
    setting, dp = r["setting"], r["setting"]["dp"]
    keys = ("topology", "dataset", "partition", "schedule")
    return dict({k: setting[k] for k in keys}, seeds=list(r["seeds"]), **dp)


def calibrate(c: Mapping[str, Any]) -> Dict[str, Any]:
    """{mechanism: noise and epsilons}: the victims train on their members (a fraction of a
    shard) at q = batch / members, for the run's steps (an epoch: the public total over the
    peers); plus the public sizes the runs declare."""
    from gossip_powersgd.privacy.mechanisms.calibration import calibrate as solve

    import topologies

    peers = topologies.parse(c["topology"]).size
    split = attack_runs.membership_split(
        dict(c, fraction=regimes.FRACTION, observer=regimes.OBSERVER), 0
    )
    total = split.data().num_train
    members = len(split.member_set(split.victims[0])[1])
    steps = c["epochs"] * math.ceil(total / (peers * c["batch_size"]))
    noises = solve(
        c["topology"],
        c["batch_size"],
        members,
        c["epochs"],
        c["lr"],
        c["schedule"],
        target=TARGET,
        delta=c["dp_delta"],
        clip=c["dp_max_grad_norm"],
        decor_ratio=calibration.DECOR_RATIO,
        zipdl_ratio=calibration.ZIPDL_RATIO,
        steps=steps,
    )
    return dict(noises, public=dict(train_size=total, members=members, peers=peers))


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    r = _regime(quick)
    split, train, reference = attack_runs.configs(r)
    runs = [Run("calibration", dict(kind="calibration", setting=calibration_setting(quick)))]
    runs += [Run(f"split/seed{s}", dict(kind="split", split=split), s) for s in r["seeds"]]
    noises = rows.get("calibration")
    if noises is None:
        return runs
    reuse = abs(noises["muffliato"]["sigma"] - noises["local"]["sigma"]) < 1e-9
    canaries = min(r["canaries"], 32) if quick else r["canaries"]
    base = dict(kind="attack", split=split, reference=reference, references=r["references"])
    for wave in r.get("seed_waves", (r["seeds"],)):
        for seed in (s for s in wave if s in r["seeds"]):
            for label, spec in ALGORITHMS:
                for mechanism in ("none",) + MECHANISMS:
                    if mechanism == "muffliato" and reuse:
                        continue
                    mine = _train(train, r["setting"], spec, mechanism, noises)
                    config = dict(base, spec=spec, target=None, train=mine, canaries=canaries)
                    config.update(mechanism=mechanism, label=label)
                    runs.append(Run(f"{mechanism}/{label}/seed{seed}", config, seed))
    # --jobs starts the costliest first: the cost is the plan's order (seed 0's runs first)
    return [dataclasses.replace(run, cost=len(runs) - n) for n, run in enumerate(runs)]


def _train(train, setting, spec, mechanism, noises) -> Dict[str, Any]:
    """The run's config: the non-private one (privacy_attacks.md's), or the DP recipe with the
    mechanism's calibrated noise and no peer statistic released."""
    mine = dict(train, algorithm=spec)
    if mechanism != "none":
        noise, public = noises[mechanism], noises["public"]["train_size"]
        mine.update(setting["dp"], release_peer_statistics=False, dp_mechanism=mechanism)
        mine.update(dp_noise_multiplier=noise["sigma"], public_train_size=public)
        if mechanism == "zipdl":
            mine["dp_zipdl_sigma"] = noise["zipdl_sigma"]
        if mechanism == "decor":
            mine["dp_decor_sigma_cor"] = noise["sigma_cor"]
    mine["eval_every"] = max(1, mine["epochs"] // 4)  # quarters: the plateau check
    return mine


def row(run: Run) -> Dict[str, Any]:
    """A calibration, a split, or an attacked run in the mechanisms pages' row format."""
    import os

    kind = run.config["kind"]
    if kind == "calibration":
        return calibrate(run.config["setting"])
    if kind == "split":
        return attack_runs.row(run)
    c, start = run.config, os.getloadavg()[0]
    split = attack_runs.membership_split(c["split"], run.seed)
    out = attack_runs.attacked(c, run.seed, split)
    return dict(mechanism_row(out, c), load=[start, out["load"]], nice=os.nice(0))


def mechanism_row(out: Dict[str, Any], c: Mapping[str, Any]) -> Dict[str, Any]:
    """An attacked run's row (`privacy_attacks.runs.attacked`) as the mechanisms page reads it:
    accuracy at each quarter, the attacks through the received model (exact gossip: read off;
    PowerGossip: the moving reconstruction from the last 4 messages, as `attack_run.received_attack`
    forms it), the victim's own model and the blind baselines, the chance band, and the audit."""
    last = out["rounds"][str(out["last"])]
    flat, band = last["flat"], last["evaluation"]["null_band"]
    received = RECEIVED[c["spec"].split(":")[0]]
    m = dict(mechanism=c["mechanism"], algorithm=c["label"], seed=out["seed"])
    m.update(topology=c["split"]["topology"], steps=out["steps"], epochs=out["epochs"])
    evals, epochs = out["evals"], out["epochs"]
    at = {round(e["epoch"] * 4 / epochs): e["acc_avg"] for e in evals}
    m.update(acc_half=at.get(2, float("nan")), acc_3q=at.get(3, float("nan")))
    m.update(acc_avg=out["acc_avg"], acc_victim=out["acc_victim"])
    m.update(acc_local_mean=evals[-1]["acc_local_mean"], acc_local_min=evals[-1]["acc_local_min"])
    m.update(mb_per_peer=out["mb_sent_per_peer"], run_seconds=out["run_seconds"])
    m.update(members=out["members"], nonmembers=out["nonmembers"], sigma=out["sigma"])
    for x in ("auc", "tpr1", "tpr0.1"):
        for attack in ("LOSS", "LiRA offline", "LiRA online"):
            m[f"{x}/received/{attack}"] = flat[f"{x}/{received}/{attack}"]
            m[f"{x}/victim's own/{attack}"] = flat[f"{x}/victim/{attack}"]
            m[f"{x}/blind model/{attack}"] = flat[f"{x}/blind model/{attack}"]
        m[f"{x}/class prior"] = flat[f"{x}/class prior"]
    m.update({"null/auc": band["auc"], "null/tpr0.1": band["tpr"][0], "null/tpr1": band["tpr"][1]})
    audit = out["audit"]
    m["audit"] = {k: v for k, v in audit.items() if k not in ("included",)}
    for name in ("observer", "victim", "blind model"):
        m["audit"][name] = {k: v for k, v in audit[name].items() if k != "scores"}
    return m


def sections(rows: Rows) -> List[Dict[str, Any]]:
    """The one topology's section (as `page` reads it): its setting, calibration and rows."""
    noises = next(r.row for r in rows.records if r.config["kind"] == "calibration")
    c = next(r.config["setting"] for r in rows.records if r.config["kind"] == "calibration")
    found = [r.row for r in rows.records if r.config["kind"] == "attack"]
    reuse = abs(noises["muffliato"]["sigma"] - noises["local"]["sigma"]) < 1e-9
    noises = {k: v for k, v in noises.items() if k in MECHANISMS}
    return [dict(setting=c, noises=noises, reuse_muffliato=reuse, rows=found)]


def render(rows: Rows) -> Outputs:
    found = sections(rows)
    runs = found[0]["rows"]
    per_step = statistics.fmean(r["run_seconds"] / r["steps"] for r in runs)
    c = dict(target=TARGET, algorithms=[a for a, _ in ALGORITHMS], per_step=per_step)
    c.update(observer=regimes.OBSERVER, ratio=calibration.DECOR_RATIO)
    c.update(load=[tuple(r["load"]) for r in runs], nice=[r["nice"] for r in runs])
    c["calibration"] = next(r.row for r in rows.records if r.config["kind"] == "calibration")
    regime = _regime(rows.records[0].quick)
    text = render_page(found, made_by(rows), rows.command, c, regime)
    return {"privacy_mechanisms.md": text, "privacy_mechanisms.csv": page.csv_text(runs)}


AUDIT = (
    "mechanism | algorithm | claimed ε vs neighbour (RDP / PLD) | audited ε ≥, observer's "
    "reconstruction | audited ε ≥, victim's own model | audited ε ≥, blind model (baseline) | "
    "right / guesses (victim's model, best count)"
)


def _per_seed(group, source: str) -> str:
    return " / ".join(f"{r['audit'][source]['epsilon']:.2f}" for r in group)


def _ceiling(audit) -> float:
    from gossip_powersgd.privacy.audit import audit_ceiling

    return audit_ceiling(audit["m"], audit["counts"], audit["delta"], audit["confidence"])


def audit_lines(section, c) -> List[str]:
    """The audit per (mechanism, algorithm): the claim, and the lower bound through the
    observer's reconstruction, the victim's own model and the blind model, one value per seed."""
    rows, noises, out = section["rows"], section["noises"], []
    for name in ("none",) + PRIVATE:
        for algorithm in c["algorithms"]:
            group = [r for r in rows if r["mechanism"] == name and r["algorithm"] == algorithm]
            if not group:
                continue
            n = noises.get(name)
            claim = f"{n['neighbour']:.2f} / {n['neighbour_pld']:.2f}" if n else "∞ (no DP)"
            best = " / ".join(
                f"{r['audit']['victim']['correct']}/{r['audit']['victim']['guesses']}"
                for r in group
            )
            out.append(
                [NAMES[name], algorithm, claim]
                + [_per_seed(group, s) for s in ("observer", "victim", "blind model")]
                + [best]
            )
    return md_table(AUDIT, out, end=None)


def audit_answers(section) -> List[str]:
    """Is a claim refuted, how close the audit comes, what it proves without DP, and whether the
    blind baseline stays at chance."""
    rows, noises = section["rows"], section["noises"]
    private = [r for r in rows if r["mechanism"] != "none"]
    plain = [r for r in rows if r["mechanism"] == "none"]
    bounds = [max(r["audit"][s]["epsilon"] for s in ("observer", "victim")) for r in private]
    claims = [noises[r["mechanism"]]["neighbour"] for r in private]
    refuted = sum(b > c for b, c in zip(bounds, claims))
    blind = max(r["audit"]["blind model"]["epsilon"] for r in rows)
    audit = rows[0]["audit"]
    return [
        f"- Does the one-run audit refute a claimed ε? In {refuted} of {len(private)} private runs "
        f"its lower bound exceeds the claim; the highest bound is {max(bounds):.2f} (claims "
        f"{min(claims):.2f}–{max(claims):.2f}).",
        f"- Without DP the same audit proves ε ≥ "
        f"{max(r['audit']['victim']['epsilon'] for r in plain):.2f} from the victims' own models "
        f"and ≥ {max(r['audit']['observer']['epsilon'] for r in plain):.2f} from the observer's "
        f"reconstructions; every guess right would show {_ceiling(audit):.2f} with these "
        f"{audit['m']} canaries.",
        f"- The blind baseline (the same audit through a model that never saw a victim): at most "
        f"{blind:.2f} over every run" + (" (chance: 0 expected)." if blind == 0 else "."),
    ]


def _setting_fields(regime, calibration) -> Dict[str, Any]:
    s, dp, public = regime["setting"], regime["setting"]["dp"], calibration["public"]
    local = calibration["local"]
    fields = dict(topology=s["topology"], model=s["model"], peers=public["peers"])
    fields["data"] = s["dataset"].split(":")[0]
    fields.update(records=public["train_size"] // public["peers"], members=public["members"])
    fields.update(batch=s["batch_size"], lr=s["lr"], epochs=s["epochs"], momentum=s["momentum"])
    fields.update(dp_batch=dp["batch_size"], dp_lr=dp["lr"], dp_epochs=dp["epochs"])
    fields.update(clip=dp["dp_max_grad_norm"], delta=dp["dp_delta"], q=local["q"])
    fields.update(steps=local["steps"], references=regime["references"])
    return dict(fields, canaries=regime["canaries"], seeds=", ".join(map(str, regime["seeds"])))


def render_page(sections, generated, command, c, regime) -> str:
    """The page (its fixed text: audited.md beside this file): `sections` (one: the ring's
    setting, noises, rows), who made the rows, the command, `c` (target, algorithms, loads, the
    calibration row) and the regime it ran in."""
    section = sections[0]
    return fill(
        template(__file__, "audited.md"),
        generated=generated,
        command=command,
        how_run=page._how_run(dict(c, load=[_span(c["load"])], nice=[all(c["nice"])])),
        **{k: c[k] for k in ("target", "ratio", "observer", "per_step")},
        **page.shown(sections, c),
        audit=audit_lines(section, c),
        audit_answers=audit_answers(section),
        **_setting_fields(regime, c["calibration"]),
    )


def _span(loads) -> tuple:
    """The machine's load at the first run's start and the last run's end."""
    return (loads[0][0], loads[-1][1])
