"""What the bandwidth page runs (torch-free), in waves as rows come in: the lr grids
(`tune/T/A/lr=V`, tuning topology T, seed 0), the γ grids at the all-reduce's chosen lr, every
algorithm at its chosen values on every topology and seed (`train/T/A/seedS`), the best at twice
the epochs (`plateau/T/A`), then the measurements (`alone/`, `timing/`, `e2e/`, `fault/`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Tuple

from experiments.engine import Run
from experiments.suite.runs import LOCAL


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """A row of the page: `spec` ("{gamma}" filled in per run) tuned over `grid` by `tune` ("lr",
    "gamma", "gamma_x": × the topology's γ), timed as `timing` (cost does not depend on γ);
    `warmup`: (steps, row key) whose steps cost that row's; `over_all_hosts`: an all-reduce."""

    key: str
    label: str
    spec: str
    tune: str
    grid: Tuple[float, ...]
    timing: str
    local_steps: int = 1
    warmup: Optional[Tuple[int, str]] = None
    over_all_hosts: bool = False


def _powergossip(key: str, label: str, options: str) -> Algorithm:
    spec = f"powergossip:{options}"
    return Algorithm(key, label, spec + ",gamma={gamma}", "gamma_x", (0.5, 1.0), spec)


def _choco(key: str, label: str, compressor: str, grid: Tuple[float, ...]) -> Algorithm:
    """Choco at γ over `grid`, timed at its first γ."""
    spec = f"choco:compressor={compressor},gamma={{gamma}}"
    return Algorithm(key, label, spec, "gamma", grid, spec.format(gamma=grid[0]))


_REDUCE = dict(tune="lr", grid=(0.1, 0.2, 0.4), over_all_hosts=True)
#: start_iter 10 (its default): 10 exact all-reduces first, which cost an all-reduce step
_POWERSGD = dict(_REDUCE, timing="powersgd:rank=1,start_iter=0", warmup=(10, "allreduce"))
#: lr: the all-reduce grid's best, one point, to fit the plan in its time
_LOCAL = dict(tune="lr", grid=(0.4,), timing="exact", local_steps=4)
ALGORITHMS = (
    Algorithm("exact", "exact gossip", "exact:gamma={gamma}", "gamma_x", (0.5, 1.0), "exact"),
    _powergossip("pg-r1", "PowerGossip r1", "rank=1,iters=1"),
    _powergossip("pg-r2", "PowerGossip r2", "rank=2,iters=1"),
    _powergossip("pg-r1-2it", "PowerGossip r1, 2 iters", "rank=1,iters=2"),
    _choco("choco-sign", "Choco sign", "sign", (0.5, 1.0)),
    _choco("choco-topk", "Choco top-k 1%", "topk:0.01", (0.1, 0.2)),
    Algorithm("allreduce", "all-reduce", "allreduce", timing="allreduce", **_REDUCE),
    Algorithm("powersgd", "PowerSGD (centralized) r1", "powersgd:rank=1", **_POWERSGD),
    Algorithm("exact-h4", "exact gossip, H = 4 local steps", "exact:gamma={gamma}", **_LOCAL),
)
BY_KEY = {a.key: a for a in ALGORITHMS}


@dataclasses.dataclass(frozen=True)
class Setting:
    """The sizes of one plan (full or --quick): `seeds` per topology (the `COMPARED` rows'; the
    others run the first); `slow`: (base rate, slowed host, its rate) on `slow_topologies` for
    `slow_algorithms`; `e2e`: (topology, algorithm, rate) of the complete runs; `only`, `rates_of`:
    per topology, what is trained and timed on it (default: all); `untimed_at`, `eval_untimed_at`:
    what is not timed at a rate; `faults`: (launcher, fault); `quick`: cluster rows may skip."""

    base: Mapping[str, Any]
    algorithms: Tuple[str, ...]
    topologies: Tuple[str, ...]
    tune_topology: str
    seeds: Mapping[str, Tuple[int, ...]]
    rates: Tuple[str, ...]
    slow: Optional[Tuple[str, str, str]] = None
    slow_topologies: Tuple[str, ...] = ()
    e2e: Tuple[Tuple[str, str, str], ...] = ()
    grids: Mapping[str, Tuple[float, ...]] = dataclasses.field(default_factory=dict)
    only: Mapping[str, Tuple[str, ...]] = dataclasses.field(default_factory=dict)
    rates_of: Mapping[str, Tuple[str, ...]] = dataclasses.field(default_factory=dict)
    slow_algorithms: Tuple[str, ...] = ()
    untimed_at: Mapping[str, Tuple[str, ...]] = dataclasses.field(default_factory=dict)
    eval_untimed_at: Tuple[str, ...] = ()
    faults: Tuple[Tuple[str, str], ...] = ()
    plateau: bool = True
    quick: bool = False


#: The training recipe (momentum SGD, cosine schedule). MNIST-1D with 10,000 samples (9,000 train,
#: 1,000 test, the standard generator), a 40-1024-1024-10 MLP: 1,101,834 parameters for 2 x 200
#: MFLOP per sample-batch of compute, so that communication matters here.
FULL_BASE = dict(dataset="mnist1d:num_samples=10000,train_split=0.9", model="mlp:1024,1024")
FULL_BASE.update(partition="iid", optimizer="sgd", momentum=0.9, weight_decay=0.0001)
FULL_BASE.update(warmup_epochs=1, schedule="cosine", batch_size=32, epochs=20, eval_every=1)
FULL_BASE.update(LOCAL)
QUICK_BASE = dict(FULL_BASE, dataset="mnist1d:num_samples=1200", model="mlp:64", epochs=2)

#: (launcher, fault) of the full page's faults across hosts (rows.fault_row): the three faults under
#: both launchers, and every process of a host killed under torchrun (its agent too).
FAULT_CASES = tuple((lc, f) for lc in ("torch", "mpi") for f in ("cut", "kill", "stop"))
FAULT_CASES += (("torch", "kill-all"),)
#: Sized to finish in about 80 minutes on 2 shared cores (the page says what was cut and why).
FULL = Setting(
    base=FULL_BASE,
    algorithms=tuple(a.key for a in ALGORITHMS),
    topologies=("ring:8", "torus:2x4"),
    tune_topology="ring:8",
    seeds={"ring:8": (0, 1), "torus:2x4": (0,)},
    rates=("1gbit", "100mbit", "10mbit", "1mbit"),
    slow=("100mbit", "host3", "10mbit"),
    slow_topologies=("ring:8",),
    only={"torus:2x4": ("exact", "pg-r1")},
    rates_of={"torus:2x4": ("100mbit", "10mbit")},
    slow_algorithms=("exact", "pg-r1", "allreduce"),
    untimed_at={"1mbit": ("exact-h4",)},
    eval_untimed_at=("1mbit",),
    faults=FAULT_CASES,
)
QUICK = Setting(
    base=QUICK_BASE,
    algorithms=("exact", "pg-r1", "allreduce"),
    topologies=("ring:2",),
    tune_topology="ring:2",
    seeds={"ring:2": (0,)},
    rates=("10mbit",),
    e2e=(("ring:2", "pg-r1", "10mbit"),),
    grids={"exact": (1.0,), "pg-r1": (1.0,), "allreduce": (0.1,)},
    plateau=False,
    quick=True,
    faults=(("torch", "kill"),),
)
#: The epochs of a measured run's config (it stops itself long before).
PROBE_EPOCHS = 1000
#: The three rows the target accuracy and the answer are about.
COMPARED = ("pg-r1", "exact", "allreduce")
Rows = Mapping[str, Dict[str, Any]]


def seeds_of(s: Setting, key: str, topology: str) -> Tuple[int, ...]:
    """The seeds algorithm `key` runs on `topology`: all of them for the compared rows."""
    return tuple(s.seeds[topology])[: None if key in COMPARED else 1]


def algorithms_on(s: Setting, topology: str) -> Tuple[str, ...]:
    """The algorithms with rows on `topology`: its own (`Setting.only`) and the all-reduces."""
    own = s.only.get(topology, s.algorithms)
    return tuple(k for k in s.algorithms if k in own or BY_KEY[k].over_all_hosts)


def rates_on(s: Setting, topology: str) -> Tuple[str, ...]:
    """The rates `topology`'s steps are timed at, in `s.rates`' order."""
    return tuple(r for r in s.rates if r in s.rates_of.get(topology, s.rates))


def measured_on(s: Setting, key: str, topology: str) -> str:
    """The topology whose rows time `key` on `topology`: the tuning one for an all-reduce (its ring
    goes through all hosts, whatever the topology), else its own."""
    return s.tune_topology if BY_KEY[key].over_all_hosts else topology


def own_on(s: Setting, topology: str) -> List[str]:
    """The algorithms trained and timed on `topology` itself (not borrowing another's rows)."""
    return [k for k in algorithms_on(s, topology) if measured_on(s, k, topology) == topology]


def topology_gamma(topology: str) -> float:
    import topologies

    return float(topologies.parse(topology).gamma)


def train_run(key: str, s: Setting, a: Algorithm, topology: str, seed: int, lr, gamma, **extra):
    """An in-process training run; γ goes into the spec when the row is made ("{gamma}"), so that
    the stored config holds it as a number."""
    train = dict(s.base, topology=topology, algorithm=a.spec, lr=lr, local_steps=a.local_steps)
    config = {"kind": "train", "algorithm": a.key, "gamma": gamma, "train": dict(train, **extra)}
    return Run(key=key, config=config, seed=seed, cost=float(config["train"]["epochs"]))


def tuning_keys(s: Setting, algorithm: Algorithm) -> List[Tuple[float, str]]:
    """(value, row key) of each point of the algorithm's grid (`:.9g`: stable across float bits)."""
    label = {"lr": "lr", "gamma": "g", "gamma_x": "gx"}[algorithm.tune]
    where = f"tune/{s.tune_topology}/{algorithm.key}/{label}"
    return [(v, f"{where}={v:.9g}") for v in s.grids.get(algorithm.key, algorithm.grid)]


def best_value(s: Setting, algorithm: Algorithm, rows: Rows):
    """(value, key) of the grid's most accurate run (the first on a tie; a failed one never wins),
    or None until the whole grid has rows."""
    keys = tuning_keys(s, algorithm)
    if any(k not in rows for _, k in keys):
        return None
    scored = [(rows[k].get("acc_avg"), v, k) for v, k in keys if rows[k].get("acc_avg") is not None]
    return max(scored, key=lambda x: x[0])[1:] if scored else None  # max: the first of equals


def chosen_lr(s: Setting, rows: Rows) -> Optional[float]:
    """The learning rate of the γ-tuned algorithms: the all-reduce grid's best."""
    best = best_value(s, BY_KEY["allreduce"], rows)
    return None if best is None else best[0]


def chosen(s: Setting, key: str, rows: Rows):
    """(lr, γ multiplier or γ or None, tuning key) of algorithm `key`, or None until known."""
    best, lr_star = best_value(s, BY_KEY[key], rows), chosen_lr(s, rows)
    if best is None or lr_star is None:
        return None
    value, tune_key = best
    return (value, None, tune_key) if BY_KEY[key].tune == "lr" else (lr_star, value, tune_key)


def gamma_on(a: Algorithm, value, topology: str):
    """The γ of algorithm `a` on `topology` from its chosen value (a multiplier for gamma_x)."""
    if a.tune == "lr":
        return topology_gamma(topology) if "{gamma}" in a.spec else None
    return value * topology_gamma(topology) if a.tune == "gamma_x" else value


def main_key(s: Setting, key: str, topology: str, seed: int, rows: Rows) -> Optional[str]:
    """The row key of `key` on `topology`, seed `seed` (the chosen tuning run's on the tuning
    topology's seed 0), None until the choice is made."""
    pick = chosen(s, key, rows)
    if pick is None:
        return None
    topology = measured_on(s, key, topology)  # an all-reduce's model: any graph's (a test checks)
    own = f"train/{topology}/{key}/seed{seed}"
    return pick[2] if (topology, seed) == (s.tune_topology, 0) else own


def train_keys(s: Setting, key: str, topology: str, rows: Rows) -> List[str]:
    """The row keys of algorithm `key` on `topology`, one per seed, that exist."""
    keys = [main_key(s, key, topology, seed, rows) for seed in seeds_of(s, key, topology)]
    return [k for k in keys if k is not None and k in rows]


def best_main(s: Setting, rows: Rows, among=None) -> Optional[Tuple[str, str]]:
    """(algorithm, row key) of the best on the tuning topology, seed 0, among `among` (or all)."""
    among = [k for k in s.algorithms if among is None or k in among]
    keys = {k: main_key(s, k, s.tune_topology, 0, rows) for k in among}
    if any(v is None or v not in rows for v in keys.values()):
        return None
    return max(keys.items(), key=lambda kv: rows[kv[1]].get("acc_avg") or 0.0)


def training_runs(s: Setting, rows: Rows) -> List[Run]:
    """The grids (γ's once the lr is chosen), the runs at the chosen values, the plateau run."""
    tune, lr_star, runs = s.tune_topology, chosen_lr(s, rows), []
    for a in (BY_KEY[k] for k in s.algorithms):
        if a.tune == "lr" or lr_star is not None:
            for value, key in tuning_keys(s, a):
                lr = value if a.tune == "lr" else lr_star
                runs.append(train_run(key, s, a, tune, 0, lr, gamma_on(a, value, tune)))
    for a, pick in ((BY_KEY[k], chosen(s, k, rows)) for k in s.algorithms):
        for topology in (t for t in s.topologies if pick and a.key in own_on(s, t)):
            for seed in seeds_of(s, a.key, topology):
                if (topology, seed) != (tune, 0):  # else: the chosen tuning run
                    gamma = gamma_on(a, pick[1], topology)
                    key = f"train/{topology}/{a.key}/seed{seed}"
                    runs.append(train_run(key, s, a, topology, seed, pick[0], gamma))
    best = best_main(s, rows, COMPARED)
    if best is not None and s.plateau:
        a, (lr, value, _) = BY_KEY[best[0]], chosen(s, best[0], rows)
        gamma, epochs = gamma_on(a, value, tune), 2 * s.base["epochs"]
        runs.append(train_run(f"plateau/{tune}/{a.key}", s, a, tune, 0, lr, gamma, epochs=epochs))
    return runs


def rate_name(rate: str, slow: Optional[Tuple[str, str]] = None) -> str:
    """A step-time row's rate as keys spell it: "100mbit", "100mbit+host3@10mbit" (host slowed)."""
    return rate if slow is None else f"{rate}+{slow[0]}@{slow[1]}"


def timing_key(topology: str, rate: str, slow: Optional[Tuple[str, str]] = None) -> str:
    """The key of a step-time row."""
    return f"timing/{topology}/{rate_name(rate, slow)}"


def timed_settings(s: Setting) -> List[Tuple[str, str, Optional[Tuple[str, str]]]]:
    """(topology, rate, (slowed host, its rate) or None) of each step-time row, in plan order."""
    timed = [(t, r, None) for t in s.topologies for r in rates_on(s, t)]
    return timed + [(t, s.slow[0], s.slow[1:]) for t in s.slow_topologies if s.slow]


def measurement_runs(s: Setting, rows: Rows) -> List[Run]:
    """The timed runs (they stop themselves: `training.timing.StepTimer`): a peer alone, the step
    times per topology and rate, the complete cluster runs, the faults across hosts."""
    probe = {k: v for k, v in s.base.items() if k not in ("backend", "out_dir")}
    probe.update(epochs=PROBE_EPOCHS, eval_every=PROBE_EPOCHS)
    runs = []
    for topology in s.topologies:
        for a in (BY_KEY[k] for k in own_on(s, topology)):
            train = dict(probe, topology=topology, algorithm=a.timing, lr=0.05)
            config = {"kind": "alone", "algorithm": a.key, "train": train}
            config["train"]["local_steps"] = a.local_steps
            runs.append(Run(key=f"alone/{topology}/{a.key}", config=config))
    for topology, rate, slow in timed_settings(s):
        algorithms = [
            {"key": k, "spec": BY_KEY[k].timing, "local_steps": BY_KEY[k].local_steps}
            for k in own_on(s, topology)
            if (slow is None or not s.slow_algorithms or k in s.slow_algorithms)
            and k not in s.untimed_at.get(rate, ())
        ]
        config = dict(kind="timing", quick=s.quick, topology=topology, rate=rate)
        config.update(slow=list(slow) if slow else None, algorithms=algorithms)
        config["train"] = dict(probe, topology=topology, lr=0.05)
        # an evaluation's all-reduces go round all hosts: timed on the tuning topology only
        config["eval"] = topology == s.tune_topology and rate not in s.eval_untimed_at and not slow
        runs.append(Run(key=timing_key(topology, rate, slow), config=config, cost=2.0))
    sources = {run.key: run for run in training_runs(s, rows)}
    for topology, key, rate in s.e2e:
        source = sources.get(main_key(s, key, topology, 0, rows))
        if source is not None and source.key in rows:
            config = dict(kind="e2e", quick=s.quick, algorithm=key, rate=rate, source=source.key)
            config.update(gamma=source.config["gamma"], train=dict(source.config["train"]))
            key_of = f"e2e/{topology}/{key}/{rate}"
            runs.append(Run(key=key_of, config=config, seed=source.seed, cost=3.0))
    fault = {"kind": "fault", "quick": s.quick}
    return runs + [Run(f"fault/{lc}/{f}", dict(fault, launcher=lc, fault=f)) for lc, f in s.faults]


def plan(quick: bool, rows: Rows) -> List[Run]:
    """The page's runs (see the module docstring); measurements once every training row exists."""
    s = QUICK if quick else FULL
    training = training_runs(s, rows)
    # every choice made (`best_main`) puts every main and plateau run in `training`
    if best_main(s, rows) is None or any(r.key not in rows for r in training):
        return training
    return training + measurement_runs(s, rows)
