"""`python -m experiments privacy_mechanisms`: local DP-SGD, Muffliato, ZIP-DL and DECOR in the
attack pages' regime (privacy_regime.md's choice: the attacks work without DP, DP learns), at
equal epsilon against a neighbour, on exact gossip and PowerGossip r1, each run attacked and
audited in one run.

The plan: the calibration (each mechanism's noise for epsilon = TARGET against a direct neighbour,
solved before any run with that mechanism's own accountant, at the victims' sampling rate and
the run's number of steps), the membership split of each seed, then every (algorithm,
mechanism, seed) as privacy_attacks.md trains and attacks a run (`privacy_attacks.runs.attacked`:
observer 0 records, LOSS and LiRA with references trained by gossip, the blind baselines, the
one-run audit's canaries in the victims' data, scored also through the blind model). The private
runs release no peer statistic (the shard sizes stay secret: add/remove adjacency is the claim's,
and every peer samples at its own rate); their claimed epsilon is the calibration's, at the
victims' members alone, an upper bound for victims whose data also holds included canaries. The
non-private runs have privacy_attacks.md's config (run again: the canaries' coins are fresh). Row format: the logreg page's
(`runs.row`), so both render with `page`."""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Dict, List, Mapping

from gossip_powersgd.privacy.attack_run import MOVING, READ_OFF

from experiments.engine import Outputs, Rows, Run, made_by
from experiments.pages.privacy_attacks import regimes
from experiments.pages.privacy_attacks import runs as attack_runs

from . import calibration, page

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
    split = attack_runs._split(dict(c, fraction=regimes.FRACTION, observer=regimes.OBSERVER), 0)
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
    split = attack_runs._split(c["split"], run.seed)
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
    from . import audited_page

    found = sections(rows)
    runs = found[0]["rows"]
    per_step = statistics.fmean(r["run_seconds"] / r["steps"] for r in runs)
    c = dict(target=TARGET, algorithms=[a for a, _ in ALGORITHMS], per_step=per_step)
    c.update(observer=regimes.OBSERVER, ratio=calibration.DECOR_RATIO)
    c.update(load=[tuple(r["load"]) for r in runs], nice=[r["nice"] for r in runs])
    c["calibration"] = next(r.row for r in rows.records if r.config["kind"] == "calibration")
    regime = _regime(rows.records[0].quick)
    text = audited_page.render_page(found, made_by(rows), rows.command, c, regime)
    return {"privacy_mechanisms.md": text, "privacy_mechanisms.csv": page.csv_text(runs)}
