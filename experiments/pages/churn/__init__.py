"""`python -m experiments churn`: training through churn, in-process (backend local, every peer a
thread of one process, the changes from a churn schedule). Two sections, one page:

* the grid: accuracy (averaged model, local mean and min), consensus distance and the shift of
  the members' average at the changes against the churn rate (0, 1, 5, 10 % of peers per epoch,
  random churn), for exact gossip, PowerGossip r1 and r4 and Choco sign, on ring:16 and
  exponential:16, 3 seeds each;
* rejoining: one peer leaves and comes back, handed its state as its neighbours' average or one
  neighbour's copy (`churn_join`): the shift at the join, the joiner's accuracy and distance to the
  members' average some steps later, next to the others'.
* the soak (full page only; root): the emulated cluster of `python -m gossip_powersgd.cluster`,
  one torch process per host, random kills, stops and link cuts of single hosts, each host back
  with `--rejoin` (`gossip_powersgd.cluster.soak.soak` of experiments/configs/tiny.yaml): one
  row, made after the in-process runs.

Modules: `measure` (the rows: one `gossip_powersgd.run` each), `tables` (the renderer's tables,
plot; `text`: the prose and the page's files, from the rows alone)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping

from experiments.engine import Outputs, Page, Rows, Run
from experiments.pages import register
from experiments.suite.runs import BASE, QUICK_BASE

#: (label, algorithm spec): the grid's rows, in the table's order. Choco sign's γ = 1 is the one
#: the training page's γ sweep chose (ring:8, 10 epochs, of 0.5 / 1 / 1.3), not tuned again here.
ALGORITHMS = (
    ("exact gossip", "exact"),
    ("PowerGossip r1", "powergossip:rank=1,iters=1"),
    ("PowerGossip r4", "powergossip:rank=4,iters=1"),
    ("Choco sign", "choco:compressor=sign,gamma=1.0"),
)
#: Churn rates: the share of the peers that leave per epoch (the per-step `rate` is this / the
#: steps per epoch).
RATES = (0.0, 0.01, 0.05, 0.10)
#: The full page's recipe over BASE (MNIST-1D): a narrower CNN and 24 epochs, what makes the
#: 112 runs fit ~35 minutes on 2 shared cores; --quick: the synthetic logistic problem, 4 peers.
FULL = dict(
    topologies=("ring:16", "exponential:16"),
    algorithms=ALGORITHMS,
    rates=RATES,
    seeds=(0, 1, 2),
    model="cnn1d:channels=16",
    epochs=24,
    eval_every=8,
    steps_per_epoch=8,  # ceil(4000 training samples / (16 peers x batch 32))
    down_epochs=2,
    join_topology="ring:16",
    joiner=5,
    leave_epoch=8,
    join_epoch=16,
)
QUICK = dict(
    topologies=("ring:4", "exponential:4"),
    algorithms=ALGORITHMS,
    rates=(0.0, 0.5),
    seeds=(0,),
    model="logreg",
    epochs=3,
    eval_every=1,
    steps_per_epoch=13,  # ceil(1600 training samples / (4 peers x batch 32))
    down_epochs=0.5,
    join_topology="ring:4",
    joiner=1,
    leave_epoch=0.5,
    join_epoch=2,
)
JOIN_MODES = ("average", "copy")
#: The soak (full page only): about 20 minutes of training on 6 hosts with 50 faults.
SOAK = dict(section="soak", minutes=20.0, faults=50, hosts=6)
#: The soak's training config (the hosts' ring and the fault handling on top: `cluster.soak`).
TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"


def setting(quick: bool) -> Dict[str, Any]:
    """The page's plan parameters (its JSON's "setting"), with the derived steps."""
    s = dict(QUICK if quick else FULL, quick=quick)
    spe = s["steps_per_epoch"]
    s["down_steps"] = int(round(s["down_epochs"] * spe))
    s["leave_step"] = int(round(s["leave_epoch"] * spe))
    s["join_step"] = s["join_epoch"] * spe - 1  # its epoch's last step: evaluated 1 step later
    return s


def per_step_rate(per_epoch: float, steps_per_epoch: int) -> float:
    """The churn schedule's `rate` (probability that a live peer leaves at a step) for a share
    `per_epoch` of the peers leaving per epoch: per_epoch / steps_per_epoch (to first order: the
    chance of leaving within an epoch is 1 - (1 - rate)^spe ~= per_epoch)."""
    return per_epoch / steps_per_epoch


def _train(s: Dict[str, Any], topology: str, spec: str, eval_every: int) -> Dict[str, Any]:
    train = dict(QUICK_BASE if s["quick"] else BASE, topology=topology, partition="iid")
    train.update(model=s["model"], epochs=s["epochs"], eval_every=eval_every, algorithm=spec)
    train.update(on_peer_loss="continue", comm_timeout=600.0)  # a loaded machine stalls threads
    train.pop("seed")  # the run's own (`Run.seed`)
    return train


def _cost(topology: str, spec: str) -> float:
    return (3.0 if spec.startswith("choco") else 1.0) * (2.0 if "exponential" in topology else 1.0)


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    """The grid (topology, algorithm, rate, seed), then the rejoin runs (algorithm, mode, seed)."""
    s = setting(quick)
    spe, runs = s["steps_per_epoch"], []
    for topology in s["topologies"]:
        for label, spec in s["algorithms"]:
            for rate in s["rates"]:
                for seed in s["seeds"]:
                    train = _train(s, topology, spec, s["eval_every"])
                    step_rate = per_step_rate(rate, spe)
                    train["churn"] = f"rate={step_rate!r},down={s['down_steps']},seed={seed}"
                    config = dict(section="grid", label=label, rate_per_epoch=rate, train=train)
                    config.update(steps_per_epoch=spe, topology=topology)
                    key = f"grid/{topology}/{label}/rate={rate:g}/seed{seed}"
                    runs.append(Run(key, config, seed, cost=_cost(topology, spec)))
    topology, joiner = s["join_topology"], s["joiner"]
    assert joiner != 0  # peer 0 stays: its evaluations bracket the join
    for label, spec in s["algorithms"]:
        for mode in JOIN_MODES:
            for seed in s["seeds"]:
                train = _train(s, topology, spec, 1)
                train.update(churn_join=mode)
                train["churn"] = f"leave:{joiner}@{s['leave_step']},join:{joiner}@{s['join_step']}"
                config = dict(section="join", label=label, mode=mode, train=train)
                config.update(joiner=joiner, join_step=s["join_step"], topology=topology)
                key = f"join/{topology}/{label}/{mode}/seed{seed}"
                runs.append(Run(key, config, seed, cost=1.2 * _cost(topology, spec)))
    if not quick and len(rows) >= len(runs):  # alone, after the rest: its rows are timings
        runs.append(Run(f"soak/cluster:{SOAK['hosts']}/seed0", dict(SOAK), 0, cost=0.0))
    return runs


def row(run: Run) -> Dict[str, Any]:
    """A grid run's or a rejoin run's row (`measure`)."""
    from gossip_powersgd.cluster.soak import soak

    from .measure import grid_row, join_row

    if run.config["section"] == "soak":
        c = run.config
        return soak(TINY, c["minutes"], c["faults"], run.seed, hosts=c["hosts"])
    if run.config["section"] == "grid":
        return grid_row(dict(run.config), run.seed)
    return join_row(dict(run.config), run.seed)


def render(rows: Rows) -> Outputs:
    """churn.md, churn.json and churn.png from the rows alone."""
    from .text import render_page

    return render_page(rows, setting(rows.quick))


PAGE = register(
    Page(
        name="churn",
        title="training through churn in-process: accuracy, consensus and average shift vs churn "
        "rate, 16 peers; rejoining by average vs copy",
        plan=plan,
        row=row,
        render=render,
    )
)
