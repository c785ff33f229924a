"""The design of the training page: the rows compared, the stages, and the plan (`plan`: the
runs, each a `gossip_powersgd.run` of the MNIST-1D recipe)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from experiments.engine import Run
from experiments.pages._suite_rows import spec_of, suite_run
from experiments.suite.runs import BASE, QUICK_BASE

from .convergence import NONIID_ROWS

EXACT, POWERGOSSIP = "exact gossip", "PowerGossip r1 (1 iter)"
ALLREDUCE, POWERGOSSIP_R4 = "all-reduce", "PowerGossip r4 (1 iter)"
CHOCO_SIGN, CHOCO_TOPK = "Choco sign", "Choco top-k 1%"
#: (label, spec, or a spec template with {gamma} for a swept γ); the order of the tables.
ROWS = [
    (ALLREDUCE, "allreduce"),
    (EXACT, "exact"),
    (POWERGOSSIP, "powergossip:rank=1,iters=1"),
    (POWERGOSSIP_R4, "powergossip:rank=4,iters=1"),
    (CHOCO_SIGN, "choco:compressor=sign,gamma={gamma}"),
    (CHOCO_TOPK, "choco:compressor=topk:0.01,gamma={gamma}"),
]
#: γ values swept (short runs, ring:8 iid, seed 0) for the algorithms whose γ must be tuned.
GAMMA_GRID = {CHOCO_SIGN: (0.5, 1.0, 1.3), CHOCO_TOPK: (0.05, 0.1, 0.2)}
#: The rows whose extra seeds are optional (`choco_seeds`): each costs ~4x an exact-gossip run here.
SLOW_ROWS = (CHOCO_SIGN, CHOCO_TOPK)
TOPOLOGY, IID, NONIID = "ring:8", "iid", "dirichlet:0.5"
#: A wider model, where PowerGossip's saving is larger (its matrices are 512x512).
WIDE_MODEL = "mlp:512,512"
#: exact gossip, PowerGossip r1, all-reduce and PowerGossip r1 with 2 iterations.
WIDE_ROWS = [ROWS[1], ROWS[2], ROWS[0], NONIID_ROWS[1]]
#: The reference runs (exact gossip, PowerGossip r1): the same recipe with the demo's 100 epochs,
#: to show how far `epochs` is.
REFERENCE_ROWS = ROWS[1:3]
STAGES = ("γ sweep", "iid, first seed", "Dirichlet and the non-IID grid", "wide model")
STAGES += ("iid, further seeds", "reference runs")
#: The state's lists of runs, in the CSV's order.
RUN_LISTS = ("sweeps", "iid", "noniid", "noniid_extra", "wide", "reference")
#: What the page runs: the rows, the γ grids, seeds of the iid rows (Choco: `choco_seeds`), epochs
#: of the CNN rows, of the γ sweep, of the wide model and of the reference runs, between evaluations.
FULL = dict(topology=TOPOLOGY, iid=IID, noniid=NONIID, rows=ROWS, grid=GAMMA_GRID, seeds=(0, 1, 2))
FULL.update(choco_seeds=1, noniid_rows=NONIID_ROWS, wide_rows=WIDE_ROWS, eval_every=2, epochs=60)
FULL.update(reference_rows=REFERENCE_ROWS, reference_epochs=100, sweep_epochs=10, wide_epochs=30)
#: --quick: ring:4, exact and PowerGossip r1, 1 epoch, nothing else.
QUICK = dict(FULL, topology="ring:4", rows=ROWS[1:3], grid={}, seeds=(0,), wide_rows=[])
QUICK.update(noniid_rows=NONIID_ROWS[:1], reference_rows=[], epochs=1, sweep_epochs=1)
QUICK.update(wide_epochs=1, reference_epochs=1, eval_every=1)


def settings(quick: bool) -> Dict[str, Any]:
    """What the page runs (`QUICK` or `FULL`), a copy."""
    return dict(QUICK if quick else FULL)


def chosen_gamma(label: str, sweeps: List[Dict[str, Any]]) -> Optional[float]:
    """The γ of `label`'s sweep row with the best averaged-model accuracy (the first row's when
    every run failed); None while the sweep has no row."""
    runs = [r for r in sweeps if r["label"] == label]
    good = [r for r in runs if "error" not in r and r.get("acc_avg") is not None]
    if not runs:
        return None
    return (max(good, key=lambda r: r["acc_avg"]) if good else runs[0])["gamma"]


def _run(s, kind, label, spec, partition, epochs, seed, gamma=None, **extra) -> Run:
    """One run of the plan `s` (`settings`): the recipe with this setting and algorithm (`spec`,
    with "{gamma}" where a swept γ goes)."""
    train = dict(QUICK_BASE if s["quick"] else BASE, topology=s["topology"])
    train.update(
        partition=partition, epochs=epochs, eval_every=max(1, min(s["eval_every"], epochs))
    )
    train.update(extra, algorithm=spec)
    train.pop("seed")  # the run's own (`Run.seed`)
    cost = epochs * (4 if spec.startswith("choco") else 1) * (3 if extra else 1)
    key = f"{kind}/{spec_of(spec, gamma)}/seed{seed}"
    return suite_run(key, label, train, seed, kind=kind, gamma=gamma, cost=cost)


def _main(s, label, template, chosen, partition, seed, kind) -> List[Run]:
    """A row of the main tables ([] while its γ sweep is unfinished)."""
    gamma = chosen.get(label)  # None for an algorithm that is not swept
    if "{gamma}" in template and gamma is None:
        return []
    return [_run(s, kind, label, template, partition, s["epochs"], seed, gamma=gamma)]


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    """The page's runs in its CSV's order (γ sweep, iid by seed, Dirichlet, the non-IID grid,
    wide model, reference). A swept algorithm's other runs join once its sweep's rows are in."""
    s = dict(settings(quick), quick=quick)
    runs: List[Run] = []
    chosen: Dict[str, Optional[float]] = {}
    for label, template in s["rows"]:
        if "{gamma}" in template:
            sweep = [
                _run(s, "sweep", label, template, s["iid"], s["sweep_epochs"], 0, g)
                for g in s["grid"][label]
            ]
            runs += sweep
            done = [rows[r.key] for r in sweep if r.key in rows]
            chosen[label] = chosen_gamma(label, done) if len(done) == len(sweep) else None
    for index, seed in enumerate(s["seeds"]):
        for label, template in s["rows"]:
            if not (index and label in SLOW_ROWS and index >= s["choco_seeds"]):
                runs += _main(s, label, template, chosen, s["iid"], seed, "iid")
    for label, template in s["rows"]:
        runs += _main(s, label, template, chosen, s["noniid"], s["seeds"][0], "noniid")
    main_specs = {template for _, template in s["rows"]}
    for label, spec in s["noniid_rows"]:
        if spec not in main_specs:
            runs.append(_run(s, "noniid", label, spec, s["noniid"], s["epochs"], s["seeds"][0]))
    for label, spec in s["wide_rows"]:
        wide = f"{label}, {WIDE_MODEL}"
        runs.append(_run(s, "wide", wide, spec, s["iid"], s["wide_epochs"], 0, model=WIDE_MODEL))
    if s["reference_epochs"] > s["epochs"]:
        for label, spec in s["reference_rows"]:
            runs.append(_run(s, "reference", label, spec, s["iid"], s["reference_epochs"], 0))
    return runs


def noniid_grid(state) -> List[Dict[str, Any]]:
    """The non-IID grid's rows, in NONIID_ROWS order, reusing the main Dirichlet runs."""
    by_spec = {r["spec"]: r for r in state["noniid"] + state["noniid_extra"]}
    return [
        dict(by_spec[spec], label=label)
        for label, spec in state["plan"]["noniid_rows"]
        if spec in by_spec
    ]
