"""`python -m experiments privacy_mechanisms_logreg`: DP-SGD, Muffliato, ZIP-DL and DECOR at equal
ε, calibrated then attacked by a neighbour on three topologies of a linear problem (`runs`, `page`);
`privacy_mechanisms`: the same in the attack pages' regime, audited too (`audited`)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

from experiments.engine import Outputs, Page, Rows, Run
from experiments.pages import register
from experiments.pages._markdown import template

from . import audited, page
from .runs import CLIP, DELTA, NETWORK_STEPS, OBSERVER, TARGET, plan_runs, reuses_local, row

ALGORITHMS = (("exact gossip", "exact"), ("PowerGossip r1", "powergossip:rank=1,iters=1"))
MECHANISMS = page.PRIVATE
TOPOLOGIES = ("ring:8", "ring:16", "exponential:16")
#: The run setting of every topology (per peer: `shard` members and as many held out;
#: synthetic_logreg keeps 80 % of n for training), and its LiRA reference models per seed. 512
#: epochs under the cosine schedule: the budget page's plateau on ring:8 and ring:16 is 256, on
#: exponential:16 512.
SETTING = dict(data="synthetic_logreg:d=20,classes=10,n={n}", model="logreg", batch_size=64)
SETTING.update(lr=0.5, epochs=512, seeds=(0, 1, 2), shard=1000, schedule="cosine", references=8)
#: --quick: a seconds-long smoke run on ring:4 (constant lr: the network bounds are computed).
QUICK_SETTING = dict(SETTING, data=SETTING["data"].replace("10", "4"), batch_size=32, epochs=4)
QUICK_SETTING.update(seeds=(0,), shard=200, schedule="constant", references=2)
QUICK_TOPOLOGIES = ("ring:4",)


def setting_of(topology: str, quick: bool, epochs=None) -> Dict[str, Any]:
    """The run setting on `topology` (`epochs`: another budget than the page's)."""
    import topologies

    setting = dict(QUICK_SETTING if quick else SETTING)
    peers = topologies.parse(topology).size
    n = peers * setting["shard"] * 2 * 5 // 4  # 80 % training: 2 * shard per peer
    setting.update(topology=topology, peers=peers, dataset=setting.pop("data").format(n=n))
    return dict(setting, epochs=epochs or setting["epochs"])


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    """Per topology, its calibration, then (once calibrated) its attacked runs."""
    runs = []
    for topology in QUICK_TOPOLOGIES if quick else TOPOLOGIES:
        setting = setting_of(topology, quick)
        runs += plan_runs("", setting, ALGORITHMS, MECHANISMS, rows, attack=True)
    return runs


def sections(rows: Rows) -> List[Dict[str, Any]]:
    """Per topology (plan order): setting, calibration, rows, and whether Muffliato reuses local."""
    out = []
    for record in rows.records:
        setting = record.config["setting"]
        if record.config["kind"] == "calibration":
            reuse = reuses_local(record.row)
            out.append(dict(setting=setting, noises=record.row, reuse_muffliato=reuse, rows=[]))
        else:
            next(s for s in out if s["setting"] == setting)["rows"].append(record.row)
    return out


def render(rows: Rows) -> Outputs:
    """privacy_mechanisms_logreg.md (page.md beside this file) and its CSV."""
    found = sections(rows)
    runs, setting = [r for s in found for r in s["rows"]], found[0]["setting"]
    origin = rows.records[0].origin or {}
    if "load" in origin:  # the runs of the old program: one (start, end) pair per command
        load, nice = [tuple(pair) for pair in origin["load"]], origin["nice"]
    else:  # this sweep's first and last runs
        load, nice = [(runs[0]["load"][0], runs[-1]["load"][1])], [runs[0]["nice"]]
    plain = sorted({r["seed"] for r in found[0]["rows"] if r["mechanism"] == "none"})
    schedule, seeds = setting.get("schedule", "constant"), setting["seeds"]
    kind = "constant" if schedule == "constant" else "decaying"
    fields = {f"{k}_text": page.WORDS[f"{k} {kind}"] for k in ("lr", "shrinks")}
    fields = {k: v.format(lr=setting["lr"], schedule=schedule) for k, v in fields.items()}
    fields.update(delta=DELTA, clip=CLIP, observer=OBSERVER, network_steps=NETWORK_STEPS)
    fields.update(setting=setting, noise=next(iter(found[0]["noises"].values())))
    fields.update(records=2 * setting["shard"], seed_count=len(seeds))
    fields["topologies"] = ", ".join(s["setting"]["topology"] for s in found)
    fields["classes"] = setting["dataset"].split("classes=")[1].split(",")[0]
    fields.update(seeds=", ".join(map(str, seeds)), plain=", ".join(map(str, plain)))
    fields.update(plural="s" if len(plain) > 1 else "", topology_count=len(found))
    fields.update(runs="one run" if len(load) == 1 else f"{len(load)} runs")
    fields["network"] = page.WORDS["network"].format(schedule=schedule)
    c = dict(target=TARGET, algorithms=[a for a, _ in ALGORITHMS])
    text = template(__file__)
    return page.outputs("privacy_mechanisms_logreg", text, rows, found, c, load, nice, **fields)


TITLE = "DP-SGD, Muffliato, ZIP-DL, DECOR at equal ε in the attack regime, attacked and audited"
LOGREG = "DP-SGD, Muffliato, ZIP-DL, DECOR at equal ε on a linear problem, three topologies"
PAGES = [
    register(Page("privacy_mechanisms", TITLE, audited.plan, audited.row, audited.render)),
    register(Page("privacy_mechanisms_logreg", LOGREG, plan, row, render)),
]
