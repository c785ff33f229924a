"""The attack rows: a real run, every peer's view recorded, the colluders' views attacked.

One `gossip_powersgd.run` per (regime, algorithm) with ``observers`` = every rank: the colluders'
views are what the attack reads; the other peers' own records are the truth it is scored against
(their models y_j(t) as they sent them). Two regimes:

* ``averaging`` (the paper's first setting, ``updates="once"``): each peer trains alone on its
  shard for one epoch (``local_steps`` = an epoch, so the first gossip step comes after it), then
  the learning rate drops by 1e-30 (float32 updates below the models' resolution: the models stop
  changing) and the peers gossip-average their privately trained models for the remaining epochs.
  Target: each peer's private contribution u_j = y_j(0) - x0.
* ``dsgd`` (decentralized SGD, ``updates="every_step"``): one local step per gossip step. Target:
  each peer's model at the last recorded step, y_j(T-1) - x0. Attacked exactly (every update an
  unknown) and under the paper's assumption (updates tied over windows of `tie` steps: least
  squares).

Parameters are scored in two parts: the tensors every message carries exactly (all of them under
exact gossip; PowerGossip's vectors) read from the messages, and PowerGossip's compressed matrices,
for which the colluders plug in their best estimates of their neighbours' matrices
(`privacy.reconstruction.reconstruct`, least squares over the low-rank products) and solve the
same system. Each error is ||estimate - truth|| / ||truth|| next to two blind guesses: the public
initial model (error 1 by construction) and the colluders' mean contribution.
"""

from __future__ import annotations

import tempfile
from typing import Any, Dict, List, Sequence

import numpy as np
import torch

from experiments.pages.privacy_knowledge.structure import distances

#: A drop of the learning rate that leaves float32 models unchanged (|lr * g| far below an ulp).
FREEZE = 1e-30


def train_config(config: Dict[str, Any], seed: int) -> Dict[str, Any]:
    """The `gossip_powersgd.run` config of an attack run (every rank observed)."""
    train = dict(config["train"], seed=seed, backend="local", quiet=True)
    train.update(algorithm=config["algorithm"], topology=config["topology"])
    if config["regime"] == "averaging":
        train.update(local_steps=config["epoch_steps"], schedule="step", milestones=[1.0])
        train.update(decay=FREEZE)
    peers = len(distances(config["topology"]))
    return dict(train, observers=list(range(peers)))


def _initial(train: Dict[str, Any]) -> List[torch.Tensor]:
    """x0: the public initial model (built from the config and its seed, as every peer does)."""
    from gossip_powersgd.training.data import load_dataset
    from gossip_powersgd.training.models import build_model

    data = load_dataset(train["dataset"], train["seed"])
    model = build_model(train["model"], data.input_shape, data.num_classes, train["seed"])
    return [p.detach().clone() for p in model.parameters()]


def _flat(tensors: Sequence[torch.Tensor], indices: Sequence[int]) -> np.ndarray:
    if not indices:
        return np.zeros(0)
    return torch.cat([tensors[k].detach().double().reshape(-1) for k in indices]).numpy()


def _rhs(system, views, x0, indices, estimates):
    """The right-hand side on `indices`: the colluders' own values, and for a received row the
    value the messages carry exactly (`estimates` None) or the colluder's estimate of it."""
    from gossip_powersgd.privacy.knowledge import observations

    if estimates is None:
        return observations(system, views, x0, indices)
    base = _flat(x0, indices)
    out = []
    for t, sender in system.rows:
        if sender in views:
            value = views[sender].own_trajectory()[t]
        else:
            value = next(e[sender][t] for c, e in estimates.items() if sender in e)
        out.append(_flat(value, indices) - base)
    return np.stack(out)


def _target(system, solution, peer, regime, last):
    if regime == "averaging":
        return solution[system.unknowns.index((0, peer))]
    return system.model(solution, peer, last)


def _error(estimate: np.ndarray, truth: np.ndarray) -> float:
    norm = float(np.linalg.norm(truth))
    return float(np.linalg.norm(estimate - truth)) / norm if norm > 0 else float("nan")


def attack_colluders(views, colluders, config, x0, modes) -> Dict[str, Any]:
    """Every non-colluder peer's errors for one colluder set, per attack mode and part."""
    from gossip_powersgd.privacy.knowledge import attackable_indices, system_from_views
    from gossip_powersgd.privacy.reconstruction import reconstruct

    mine = {c: views[c] for c in colluders}
    exact = attackable_indices(views[colluders[0]])
    shapes = views[colluders[0]].meta["shapes"]
    parts = {"exact": exact, "compressed": [k for k in range(len(shapes)) if k not in exact]}
    estimates = {c: {j: reconstruct(v, j) for j in v.meta["neighbors"]} for c, v in mine.items()}
    regime = config["regime"]
    truth_step = 0 if regime == "averaging" else max(views[colluders[0]].steps)
    far = [min(d) for d in zip(*(distances(config["topology"], c) for c in colluders))]
    peers: Dict[str, Any] = {}
    for name, indices in parts.items():
        if not indices:
            continue
        x0_flat = _flat(x0, indices)
        own = {j: _flat(views[j].own_trajectory()[truth_step], indices) - x0_flat for j in views}
        mean = np.mean([own[c] for c in colluders], axis=0)
        for mode, (updates, tie) in modes.items():
            system = system_from_views(mine, config["topology"], updates=updates, tie=tie)
            rhs = _rhs(system, mine, x0, indices, None if name == "exact" else estimates)
            solution = system.solve(rhs)
            determined = {}
            for p in range(len(far)):
                if regime == "averaging":
                    vector = np.eye(len(system.unknowns))[system.unknowns.index((0, p))]
                else:
                    vector = system.coefficients(p, truth_step)
                determined[p] = bool(system.determined(vector)[0])
            for p in range(len(far)):
                if p in colluders:
                    continue
                cell = peers.setdefault(str(p), {"distance": far[p]})
                estimate = _target(system, solution, p, regime, truth_step)
                cell[f"{name}/{mode}"] = {
                    "error": _error(estimate, own[p]),
                    "determined": determined[p] and name == "exact",
                }
                cell[f"{name}/blind_initial"] = _error(np.zeros_like(own[p]), own[p])
                cell[f"{name}/blind_mean"] = _error(mean, own[p])
    sizes = [int(np.prod(s)) for s in shapes]
    return {
        "colluders": list(colluders),
        "parts": {n: sum(sizes[k] for k in ix) for n, ix in parts.items()},
        "peers": peers,
    }


def attack_row(config: Dict[str, Any], seed: int) -> Dict[str, Any]:
    """One run (every view recorded, in a temporary folder), then each colluder set's attack."""
    from gossip_powersgd import run as train_run
    from gossip_powersgd.privacy import load_view
    from gossip_powersgd.privacy.views import observed_dir

    train = train_config(config, seed)
    x0 = _initial(train)
    with tempfile.TemporaryDirectory(prefix="knowledge-") as folder:
        result = train_run(dict(train, out_dir=folder))
        views = {k: load_view(observed_dir(folder, k)) for k in train["observers"]}
    shapes = [list(t.shape) for t in x0]
    if [list(s) for s in views[0].meta["shapes"]] != shapes:
        raise ValueError(f"the initial model's shapes {shapes} are not the views' own")
    summary = result.summary
    epochs = train["epochs"]
    if config["regime"] == "averaging" and summary["steps"] != epochs * config["epoch_steps"]:
        raise ValueError(
            f"{summary['steps']} optimizer steps in {epochs} epochs: epoch_steps "
            f"{config['epoch_steps']} is not an epoch, so the first gossip step is not after it"
        )
    modes = {"once": ("once", 1)}
    if config["regime"] == "dsgd":
        modes = {
            "every_step": ("every_step", 1),
            f"tie={config['tie']}": ("every_step", config["tie"]),
        }
    attacks = [attack_colluders(views, list(c), config, x0, modes) for c in config["colluder_sets"]]
    return {
        "regime": config["regime"],
        "algorithm": config["algorithm"],
        "label": config["label"],
        "topology": config["topology"],
        "steps": 1 + max(views[0].steps),
        "modes": list(modes),
        "accuracy": summary["final_test_acc_avg_model"],
        "local_accuracy": summary["final_test_acc_local_mean"],
        "attacks": attacks,
    }
