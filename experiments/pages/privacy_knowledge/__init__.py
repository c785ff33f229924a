"""`python -m experiments privacy_knowledge`: the knowledge-matrix attack (El Mrini, Cyffers and
Bellet, ICML 2024) on exact gossip and PowerGossip: its structure on graphs, and attacked runs."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

from experiments.engine import Page, Run
from experiments.pages import register
from experiments.pages.privacy_knowledge.page import render

#: The structural grid: topologies, and per updates mode the (tie, steps) pairs.
_GRAPHS = "ring:8 torus:3x3 exponential:8 ring:16 torus:4x4 exponential:16".split()
_MODES = [("once", 1, t) for t in (1, 2, 4, 8, 16)] + [("every_step", 1, t) for t in (4, 8)]
STRUCTURE = {
    False: dict(topologies=_GRAPHS, modes=_MODES + [("every_step", 4, t) for t in (8, 16)]),
    True: dict(topologies=("ring:4", "ring:6"), modes=[("once", 1, 1), ("once", 1, 3)]),
}
STRUCTURE[True]["modes"] += [("every_step", 1, 4), ("every_step", 4, 4)]
#: The largest colluder set the searches try (the 16-peer graphs: pairs).
MOST = {8: 3, 9: 3, 16: 2}

#: The attack runs' training recipe: a small linear classifier, trained to a useful accuracy.
_RECIPE = dict(model="logreg", lr=0.5, momentum=0.0, weight_decay=0.0, warmup_epochs=0.0)
_RECIPE.update(eval_every=1, log_every=0)
TRAIN = {
    False: dict(_RECIPE, dataset="synthetic_logreg:d=20,classes=4,n=2000", batch_size=25),
    True: dict(_RECIPE, dataset="synthetic_logreg:d=8,classes=3,n=400", batch_size=40),
}
#: (topology, local steps of an epoch, averaging epochs, D-SGD epochs, tie, colluder sets).
ATTACK = {
    False: ("ring:8", 8, 10, 3, 8, [[0], [0, 4], [0, 3]]),
    True: ("ring:6", 2, 4, 2, 2, [[0], [0, 3]]),
}
ALGORITHMS = {
    "exact": ("exact", "exact gossip"),
    "pg-r1": ("powergossip:rank=1,min_compression_rate=0", "PowerGossip r1"),
    "pg-r2": ("powergossip:rank=2,min_compression_rate=0", "PowerGossip r2"),
}


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    """The structural grid, then the attack runs."""
    from gossip_powersgd.privacy.knowledge import distances

    grid = STRUCTURE[quick]
    runs = []
    for spec in grid["topologies"]:
        size = len(distances(spec))
        for updates, tie, steps in grid["modes"]:
            config = dict(kind="structure", topology=spec, updates=updates, tie=tie, steps=steps)
            config["most"] = MOST.get(size, 2)
            key = f"structure/{spec}/{updates}/tie={tie}/T={steps}"
            runs.append(Run(key=key, config=config, cost=size * steps / 16))
    topology, epoch_steps, avg_epochs, dsgd_epochs, tie, colluders = ATTACK[quick]
    for regime, epochs in (("averaging", avg_epochs), ("dsgd", dsgd_epochs)):
        for name in ("exact", "pg-r1") if quick else ("exact", "pg-r1", "pg-r2"):
            spec, label = ALGORITHMS[name]
            config = dict(kind="attack", regime=regime, algorithm=spec, label=label)
            config.update(topology=topology, epoch_steps=epoch_steps, tie=tie)
            config.update(colluder_sets=colluders, train=dict(TRAIN[quick], epochs=epochs))
            runs.append(Run(key=f"attack/{regime}/{name}", config=config, seed=0, cost=4.0))
    return runs


def row(run: Run) -> Dict[str, Any]:
    """A structural row, or one attack run (`knowledge_attack.attack_run`) of its regime."""
    from gossip_powersgd.privacy.knowledge import structure_report

    config = dict(run.config)
    if config["kind"] == "structure":
        mode = {k: config[k] for k in ("updates", "tie", "most")}
        return dict(structure_report(config["topology"], config["steps"], **mode), kind="structure")
    from gossip_powersgd.privacy.knowledge_attack import attack_run

    train = dict(config["train"], seed=run.seed, backend="local", quiet=True)
    train.update(algorithm=config["algorithm"], topology=config["topology"])
    out = {k: config[k] for k in ("regime", "algorithm", "label", "topology")}
    mode = dict(tie=config["tie"], epoch_steps=config["epoch_steps"])
    out.update(attack_run(train, config["regime"], config["colluder_sets"], **mode))
    return dict(out, kind="attack")


TITLE = (
    "Knowledge-matrix attack (El Mrini et al. 2024): who colluders reconstruct, "
    "exact gossip vs PowerGossip"
)
PAGE = register(Page(name="privacy_knowledge", title=TITLE, plan=plan, row=row, render=render))
