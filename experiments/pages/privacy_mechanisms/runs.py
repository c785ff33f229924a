"""The logreg mechanisms pages' runs: a topology's calibration (each mechanism's noise for TARGET),
and one (mechanism, algorithm, seed) attacked at its last step by observer 0 (budget page: not)."""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Dict, List, Mapping

from experiments.engine import Run
from experiments.pages._privacy import quarters, references, with_load

DELTA, CLIP, TARGET = 1e-5, 1.0, 4.0
#: DECOR's sigma_cor / sigma_ind and ZIP-DL's per-draw std over DP-SGD's noise std on the model
#: (`zipdl.noise_ratio`: its zero-sum noise as large as one step's DP noise), fixed before any run.
DECOR_RATIO, ZIPDL_RATIO = 4.0, 1.0
RATIOS = dict(decor_ratio=DECOR_RATIO, zipdl_ratio=ZIPDL_RATIO)
#: The first T of the network view the page's text describes (T doubled from it). No run here
#: computes that view (no guarantee for training: `muffliato.network_applies`).
NETWORK_STEPS = 128
#: The attacker (it records what it receives), and the held-out share of every peer's shard.
OBSERVER, FRACTION = 0, 0.5
#: The budget page's rows: what it shows of a run.
KEEP = ("topology", "mechanism", "algorithm", "seed", "epochs", "steps", "acc_avg", "acc_3q")


def row(run: Run) -> Dict[str, Any]:
    """A calibration, or one run trained (and, unless the plan says not, attacked) as its row."""
    import torch

    c = run.config
    if c["kind"] == "calibration":
        return calibrate(c["setting"])
    torch.set_num_threads(1)
    start, begun = os.getloadavg()[0], time.perf_counter()
    keys = ("setting", "label", "spec", "mechanism", "noise")
    m = train(*(c[k] for k in keys), run.seed, c["attack"])
    if not c["attack"]:
        return {k: m[k] for k in KEEP}
    m["attack_seconds"] = time.perf_counter() - begun - m["run_seconds"]
    return with_load(dict(m, nice=os.nice(0)), start)


def calibrate(setting: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """{mechanism: noise and epsilons} on `setting`'s topology, each by its own accountant."""
    from gossip_powersgd.privacy.mechanisms.calibration import calibrate as solve

    keys = ("topology", "batch_size", "shard", "epochs", "lr", "schedule")
    return solve(*(setting[k] for k in keys), target=TARGET, delta=DELTA, clip=CLIP, **RATIOS)


def victims_of(setting: Dict[str, Any]) -> List[int]:
    """The attacked peers: the observer's neighbours 1 and n - 1."""
    import topologies

    peers = setting["peers"]
    near = set(topologies.parse(setting["topology"]).neighbors(OBSERVER))
    chosen = sorted({1 % peers, peers - 1})
    if not set(chosen) <= near:
        raise ValueError(f"peers {chosen} are not all neighbours of {OBSERVER} on this topology")
    return chosen


def train(setting, label, spec, mechanism, noise, seed, attack=True) -> Dict[str, Any]:
    """Train one run on the seed's split with observer 0 recording, and attack its neighbours."""
    from gossip_powersgd.privacy.attacks import Snapshots
    from gossip_powersgd.privacy.heldout import make_split
    from gossip_powersgd.privacy.observing import ObserverHooks
    from gossip_powersgd.privacy.views import ObservedView

    from experiments.suite.runs import run_one

    peers = setting["peers"]
    split = make_split(setting["dataset"], peers, "iid", 0, range(peers), FRACTION, seed)
    overrides = {k: setting[k] for k in ("topology", "model", "batch_size", "lr", "schedule")}
    overrides.update(dataset=split.spec(), partition="local", epochs=setting["epochs"])
    overrides["public_train_size"] = peers * setting["shard"]  # sizes an epoch; public anyway
    overrides.update(momentum=0.0, weight_decay=0.0, warmup_epochs=0, comm_timeout=600.0)
    overrides["eval_every"] = max(1, setting["epochs"] // 4)  # quarters: the plateau check
    overrides.update(seed=seed, algorithm=spec)
    if mechanism != "none":
        overrides.update(noise_config(mechanism, noise), dp_max_grad_norm=CLIP, dp_delta=DELTA)
    hooks: Dict[int, Dict[str, Any]] = {}

    def make_hooks(rank: int):
        mine = hooks[rank] = {"snap": Snapshots((1.0,))}
        if rank == OBSERVER:
            mine["observer"] = ObserverHooks([OBSERVER])
        return list(mine.values())

    m = run_one(overrides, make_hooks=make_hooks)
    m.pop("curve")
    if noise is not None and m["steps"] != noise["steps"]:
        raise RuntimeError(f"the run took {m['steps']} steps, the calibration {noise['steps']}")
    m.update(quarters(m["evals"], setting["epochs"]))
    m.update(topology=setting["topology"], mechanism=mechanism, algorithm=label)
    m["seed"] = seed
    if attack:
        recorder = hooks[OBSERVER]["observer"].recorder
        view = ObservedView(recorder.meta, recorder.records)
        snaps = {k: h["snap"].parameters for k, h in hooks.items()}
        m.update(neighbour_attack(setting, split, view, snaps, seed))
    return m


def neighbour_attack(setting, split, view, snaps, seed) -> Dict[str, Any]:
    """The observer's attacks on its neighbours at the last step (`received_attack`)."""
    from gossip_powersgd.privacy.attack_run import received_attack
    from gossip_powersgd.privacy.attacks import Candidates, References
    from gossip_powersgd.training.models import build_model

    base = split.data()
    victims = victims_of(setting)
    candidates = Candidates.of(split, victims)

    def make():
        return build_model(setting["model"], base.input_shape, base.num_classes, 0)

    recipe = dict(epochs=setting["epochs"], lr=setting["lr"], batch=setting["batch_size"])
    recipe["momentum"] = 0.0
    args = (split, candidates, OBSERVER, make, setting["references"], recipe, seed)
    refs = references([setting, seed], functools.partial(References.build, *args))
    out = received_attack(view, snaps, candidates, refs, make, window=4)
    return dict(out, victims=victims, reference_seconds=refs.seconds)


def plan_runs(prefix: str, setting: Dict[str, Any], algorithms, mechanisms, rows: Mapping, attack):
    """A topology's calibration, then its runs (Muffliato's unless DP-SGD's)."""
    name = setting["topology"]
    runs = [Run(f"{prefix}calibration/{name}", dict(kind="calibration", setting=setting))]
    noises = rows.get(runs[0].key)
    if noises is None:
        return runs
    reuse = reuses_local(noises)
    cost = {"decor": 3, "zipdl": 2, "muffliato": 2, "local": 2, "none": 1}  # measured
    for label, spec in algorithms:
        for mechanism in (m for m in ("none",) + mechanisms if m != "muffliato" or not reuse):
            noise = None if mechanism == "none" else noises[mechanism]
            config = dict(kind="run", setting=setting, label=label, spec=spec)
            config.update(mechanism=mechanism, noise=noise, attack=attack)
            for seed in setting["seeds"]:
                key = f"{prefix}{name}/{mechanism}/{label}/seed{seed}"
                runs.append(Run(key, config, seed, cost[mechanism] * setting["epochs"]))
    return runs


def reuses_local(noises) -> bool:
    """Whether Muffliato's calibrated noise is DP-SGD's (then its rows are local DP-SGD's)."""
    return abs(noises["muffliato"]["sigma"] - noises["local"]["sigma"]) < 1e-9


def noise_config(mechanism: str, noise: Mapping[str, Any]) -> Dict[str, Any]:
    """The training config keys of `mechanism` at its calibrated `noise`."""
    out = dict(dp_mechanism=mechanism, dp_noise_multiplier=noise["sigma"])
    if mechanism == "zipdl":
        out["dp_zipdl_sigma"] = noise["zipdl_sigma"]
    if mechanism == "decor":
        out["dp_decor_sigma_cor"] = noise["sigma_cor"]
    return out
