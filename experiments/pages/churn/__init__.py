"""`python -m experiments churn`: training through scheduled churn, in-process (backend local):
the grid (accuracy, consensus distance and the members' average shift against the churn rate, per
algorithm and topology), rejoining (handed the neighbours' average or one neighbour's copy) and,
full page only (root), a soak on the emulated cluster (`cluster.soak`). `tables`: the renderer."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping

from experiments.engine import Outputs, Page, Rows, Run
from experiments.pages import register
from experiments.suite.runs import BASE, QUICK_BASE

from .tables import render_page

#: (label, algorithm spec): the grid's rows, in the table's order. Choco sign's γ = 1 is the one
#: the training page's γ sweep chose (ring:8, 10 epochs, of 0.5 / 1 / 1.3), not tuned again here.
ALGORITHMS = (
    ("exact gossip", "exact"),
    ("PowerGossip r1", "powergossip:rank=1,iters=1"),
    ("PowerGossip r4", "powergossip:rank=4,iters=1"),
    ("Choco sign", "choco:compressor=sign,gamma=1.0"),
)
#: The plan's sizes, (full page, --quick). Full: BASE (MNIST-1D) with a narrower CNN and 24
#: epochs, what makes the 112 runs fit ~35 minutes on 2 shared cores; --quick: the synthetic
#: logistic problem, 4 peers. Rates: the share of the peers that leave per epoch.
SIZES = dict(
    topologies=(("ring:16", "exponential:16"), ("ring:4", "exponential:4")),
    algorithms=(ALGORITHMS, ALGORITHMS),
    rates=((0.0, 0.01, 0.05, 0.10), (0.0, 0.5)),
    seeds=((0, 1, 2), (0,)),
    model=("cnn1d:channels=16", "logreg"),
    epochs=(24, 3),
    eval_every=(8, 1),
    steps_per_epoch=(8, 13),  # ceil(training samples 4000 or 1600 / (peers x batch 32))
    down_epochs=(2, 0.5),
    join_topology=("ring:16", "ring:4"),
    joiner=(5, 1),
    leave_epoch=(8, 0.5),
    join_epoch=(16, 2),
)
FULL = {k: v[0] for k, v in SIZES.items()}
JOIN_MODES = ("average", "copy")
#: The soak (full page only): about 20 minutes of training on 6 hosts with 50 faults.
SOAK = dict(section="soak", minutes=20.0, faults=50, hosts=6)
#: The soak's training config (the hosts' ring and the fault handling on top: `cluster.soak`).
TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"


def setting(quick: bool) -> Dict[str, Any]:
    """The page's plan parameters (its JSON's "setting"), with the derived steps."""
    s = dict({k: v[quick] for k, v in SIZES.items()}, quick=quick)
    spe = s["steps_per_epoch"]
    s["down_steps"] = int(round(s["down_epochs"] * spe))
    s["leave_step"] = int(round(s["leave_epoch"] * spe))
    s["join_step"] = s["join_epoch"] * spe - 1  # its epoch's last step: evaluated 1 step later
    return s


def per_step_rate(per_epoch: float, steps_per_epoch: int) -> float:
    """The churn schedule's `rate` (probability that a live peer leaves at a step) for a share
    `per_epoch` of the peers leaving per epoch (to first order: 1 - (1 - rate)^spe ~= per_epoch)."""
    return per_epoch / steps_per_epoch


def _run(s, key: str, topology: str, spec: str, seed: int, config: Dict, **extra) -> Run:
    """A run of `spec` on `topology`: the recipe, `extra`, evaluations every epoch for a rejoin."""
    train = dict(QUICK_BASE if s["quick"] else BASE, topology=topology, partition="iid")
    every = s["eval_every"] if config["section"] == "grid" else 1
    train.update(model=s["model"], epochs=s["epochs"], eval_every=every, algorithm=spec)
    train.update(on_peer_loss="continue", comm_timeout=600.0)  # a loaded machine stalls threads
    train.pop("seed")  # the run's own (`Run.seed`)
    train.update(extra)
    cost = (3.0 if spec.startswith("choco") else 1.0) * (2.0 if "exponential" in topology else 1.0)
    cost *= 1.0 if config["section"] == "grid" else 1.2
    return Run(key, dict(config, train=train), seed, cost=cost)


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    """The grid (topology, algorithm, rate, seed), then the rejoin runs (algorithm, mode, seed)."""
    s = setting(quick)
    spe, runs = s["steps_per_epoch"], []
    for topology in s["topologies"]:
        for label, spec in s["algorithms"]:
            for rate, seed in ((r, x) for r in s["rates"] for x in s["seeds"]):
                churn = f"rate={per_step_rate(rate, spe)!r},down={s['down_steps']},seed={seed}"
                config = dict(section="grid", label=label, rate_per_epoch=rate)
                config.update(steps_per_epoch=spe, topology=topology)
                key = f"grid/{topology}/{label}/rate={rate:g}/seed{seed}"
                runs.append(_run(s, key, topology, spec, seed, config, churn=churn))
    topology, joiner = s["join_topology"], s["joiner"]
    assert joiner != 0  # peer 0 stays: its evaluations bracket the join
    churn = f"leave:{joiner}@{s['leave_step']},join:{joiner}@{s['join_step']}"
    for label, spec in s["algorithms"]:
        for mode, seed in ((m, x) for m in JOIN_MODES for x in s["seeds"]):
            config = dict(section="join", label=label, mode=mode, joiner=joiner, topology=topology)
            config["join_step"] = s["join_step"]
            key = f"join/{topology}/{label}/{mode}/seed{seed}"
            runs.append(_run(s, key, topology, spec, seed, config, churn_join=mode, churn=churn))
    if not quick and len(rows) >= len(runs):  # alone, after the rest: its rows are timings
        runs.append(Run(f"soak/cluster:{SOAK['hosts']}/seed0", dict(SOAK), 0, cost=0.0))
    return runs


#: Summary fields copied into a grid row (None where the run has none).
SUMMARY = dict(
    acc_avg="final_test_acc_avg_model",
    acc_local_mean="final_test_acc_local_mean",
    acc_local_min="final_test_acc_local_min",
    consensus_distance="final_consensus_distance",
    mb_per_peer="mb_sent_per_peer",
)
SUMMARY.update({k: k for k in ("average_shift_total", "membership_changes", "live_peers_at_end")})
SUMMARY.update({k: k for k in ("transfer_mb_sent", "steps", "parameters")})


def grid_row(config: Dict[str, Any], seed: int) -> Dict[str, Any]:
    """A grid run's row: its summary's figures and its schedule's (`schedule_figures`)."""
    from gossip_powersgd import run
    from gossip_powersgd.membership.churn import schedule_figures

    train = dict(config["train"], seed=seed)
    summary = run(train).summary
    row = {name: summary.get(key) for name, key in SUMMARY.items()}
    expected = train["epochs"] * config["steps_per_epoch"]
    if row["steps"] != expected:
        raise RuntimeError(
            f"the run made {row['steps']} steps, the page's per-step rate assumes {expected} "
            f"({config['steps_per_epoch']} per epoch): the recipe changed, fix STEPS_PER_EPOCH"
        )
    return dict(row, **schedule_figures(train["churn"], int(summary["peers"]), expected))


def row(run: Run) -> Dict[str, Any]:
    """A grid run's row, a rejoin run's (`training.churn_measure.rejoin_figures`) or the soak's."""
    from gossip_powersgd.cluster.soak import soak
    from gossip_powersgd.training.churn_measure import rejoin_figures

    c = run.config
    if c["section"] == "soak":
        return soak(TINY, c["minutes"], c["faults"], run.seed, hosts=c["hosts"])
    if c["section"] == "grid":
        return grid_row(dict(c), run.seed)
    return rejoin_figures(dict(c["train"], seed=run.seed), c["joiner"], c["join_step"])


TITLE = (
    "training through churn in-process: accuracy, consensus and average shift vs churn "
    "rate, 16 peers; rejoining by average vs copy"
)


def render(rows: Rows) -> Outputs:
    """churn.md, churn.json and churn.png from the rows alone (`tables.render_page`)."""
    return render_page(rows, setting(rows.quick))


PAGE = register(Page(name="churn", title=TITLE, plan=plan, row=row, render=render))
