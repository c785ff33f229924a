"""The knowledge-matrix attack on recorded runs, scored against the truth.

`privacy.knowledge` says what colluders' equations determine and solves them; this module runs the
attack on the views a real run recorded (``observers`` = every rank: the colluders' views are what
the attack reads, the other peers' own records are the truth it is scored against) and measures,
per non-colluder peer, the relative error of the colluders' reconstruction beside two blind
guesses: the public initial model (error 1 by construction) and the colluders' mean contribution.

Two targets (`colluder_attack`'s ``regime``):

* ``"averaging"`` (gossip averaging of privately trained models, ``updates="once"``): each peer's
  private contribution u_j = y_j(0) - x0;
* ``"dsgd"`` (decentralized SGD): each peer's model at the last recorded step, y_j(T-1) - x0,
  attacked with every update an unknown or under the paper's assumption (updates tied over
  windows of `tie` steps: least squares), one attack per entry of ``modes``.

Parameters are scored in two parts: the tensors every message carries exactly (all of them under
exact gossip; PowerGossip's vectors: `knowledge.attackable_indices`), read from the messages, and
PowerGossip's compressed matrices, for which the colluders plug in their best estimates of their
neighbours' matrices (`reconstruction.reconstruct`, least squares over the low-rank products) and
solve the same system.

`observe_every_peer(config)` makes the input: a run with every rank observed, its views and the
public initial model. `attack_run(config, regime, colluder_sets)` is the whole measurement: that
run (set up for the regime: `averaging_config`), then each colluder set's attack in every mode of
the regime (`attack_modes`); `summarize` condenses its cells into errors over the colluders'
neighbours and non-neighbours.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from gossip_powersgd.privacy.knowledge import distances, flat

if TYPE_CHECKING:
    from topologies import AnyTopology

__all__ = [
    "FREEZE",
    "REGIMES",
    "attack_modes",
    "attack_run",
    "averaging_config",
    "colluder_attack",
    "observe_every_peer",
    "relative_error",
    "summarize",
]

REGIMES = ("averaging", "dsgd")


def observe_every_peer(config: Mapping[str, Any]):
    """Run `config` (a `gossip_powersgd.run` config) with every rank observed, its views recorded
    in a temporary folder: (the run's result, {rank: ObservedView}, the public initial model x0's
    parameters, built from the config's model and seed as every peer builds it)."""
    import tempfile

    import topologies

    from gossip_powersgd import run
    from gossip_powersgd.privacy.views import load_view, observed_dir
    from gossip_powersgd.training.data import load_dataset
    from gossip_powersgd.training.models import build_model

    data = load_dataset(config["dataset"], config["seed"])
    model = build_model(config["model"], data.input_shape, data.num_classes, config["seed"])
    x0 = [p.detach().clone() for p in model.parameters()]
    peers = list(range(topologies.parse(config["topology"]).size))
    with tempfile.TemporaryDirectory(prefix="knowledge-") as folder:
        result = run(dict(config, observers=peers, out_dir=folder))
        views = {k: load_view(observed_dir(folder, k)) for k in peers}
    shapes = [list(t.shape) for t in x0]
    if [list(s) for s in views[0].meta["shapes"]] != shapes:
        raise ValueError(f"the initial model's shapes {shapes} are not the views' own")
    return result, views, x0


def _rhs(system, views, x0, indices, estimates):
    """The right-hand side on `indices`: the colluders' own values, and for a received row the
    value the messages carry exactly (`estimates` None) or the estimate of the first colluder
    that received the sender's message at that step (on a schedule a colluder's edge to the
    sender is idle at some steps, so its estimates hold only the steps it heard the sender)."""
    from gossip_powersgd.privacy.knowledge import observations

    if estimates is None:
        return observations(system, views, x0, indices)
    base = flat(x0, indices)
    out = []
    for t, sender in system.rows:
        if sender in views:
            value = views[sender].own_trajectory()[t]
        else:
            value = next(e[sender][t] for e in estimates.values() if t in e.get(sender, {}))
        out.append(flat(value, indices) - base)
    return np.stack(out)


def relative_error(estimate: np.ndarray, truth: np.ndarray) -> float:
    """||estimate - truth|| / ||truth|| (nan for a zero truth)."""
    norm = float(np.linalg.norm(truth))
    return float(np.linalg.norm(estimate - truth)) / norm if norm > 0 else float("nan")


def _determined(system, peer: int, regime: str, step: int) -> bool:
    if regime == "averaging":
        vector = np.eye(len(system.unknowns))[system.unknowns.index((0, peer))]
    else:
        vector = system.coefficients(peer, step)
    return bool(system.determined(vector)[0])


def _estimate(system, solution, peer: int, regime: str, step: int) -> np.ndarray:
    if regime == "averaging":
        return solution[system.unknowns.index((0, peer))]
    return system.model(solution, peer, step)


def colluder_attack(
    views: Mapping[int, Any],
    colluders: Sequence[int],
    topology: AnyTopology,
    initial: Sequence[torch.Tensor],
    regime: str,
    modes: Mapping[str, Tuple[str, int]],
    *,
    gamma: Optional[float] = None,
) -> Dict[str, Any]:
    """The attack of `colluders` on every other peer of a recorded run, scored against the truth.

    views: {rank: ObservedView} of every peer (the colluders' are the attack's input, the others'
        own trajectories the truth). initial: the public initial model x0 (its parameters).
    regime: "averaging" or "dsgd" (module docstring). modes: {name: (updates, tie)}, the attacks
        to run (e.g. {"once": ("once", 1)}, or {"every_step": ("every_step", 1), "tie=8":
        ("every_step", 8)}).
    gamma: the run's consensus step, which the colluders know from the config (the algorithm
        spec's own, `algorithms.registry.spec_gamma`); None: the topology's, the default of exact
        gossip and PowerGossip. Another step than the run's gives a wrong system, whose solution
        is wrong where it claims to be determined.

    Returns {"colluders", "parts": {part: parameters}, "peers": {str(peer): cell}}, a cell holding
    the peer's graph distance to the nearest colluder and, per part ("exact", "compressed"),
    f"{part}/{mode}": {"error", "determined"} and the blind guesses' errors f"{part}/blind_initial"
    and f"{part}/blind_mean" (a compressed part is never counted determined)."""
    from gossip_powersgd.privacy.knowledge import attackable_indices, system_from_views
    from gossip_powersgd.privacy.reconstruction import reconstruct

    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {', '.join(REGIMES)}, got {regime!r}")
    mine = {c: views[c] for c in colluders}
    exact = attackable_indices(views[colluders[0]])
    shapes = views[colluders[0]].meta["shapes"]
    parts = {"exact": exact, "compressed": [k for k in range(len(shapes)) if k not in exact]}
    estimates = {c: {j: reconstruct(v, j) for j in v.meta["neighbors"]} for c, v in mine.items()}
    step = 0 if regime == "averaging" else max(views[colluders[0]].steps)
    far = [min(d) for d in zip(*(distances(topology, c) for c in colluders))]
    peers: Dict[str, Any] = {}
    for name, indices in parts.items():
        if not indices:
            continue
        x0_flat = flat(initial, indices)
        own = {j: flat(views[j].own_trajectory()[step], indices) - x0_flat for j in views}
        mean = np.mean([own[c] for c in colluders], axis=0)
        for mode, (updates, tie) in modes.items():
            system = system_from_views(mine, topology, gamma=gamma, updates=updates, tie=tie)
            rhs = _rhs(system, mine, initial, indices, None if name == "exact" else estimates)
            solution = system.solve(rhs)
            determined = {p: _determined(system, p, regime, step) for p in range(len(far))}
            for p in range(len(far)):
                if p in colluders:
                    continue
                cell = peers.setdefault(str(p), {"distance": far[p]})
                estimate = _estimate(system, solution, p, regime, step)
                cell[f"{name}/{mode}"] = {
                    "error": relative_error(estimate, own[p]),
                    "determined": determined[p] and name == "exact",
                }
                cell[f"{name}/blind_initial"] = relative_error(np.zeros_like(own[p]), own[p])
                cell[f"{name}/blind_mean"] = relative_error(mean, own[p])
    sizes = [int(np.prod(s)) for s in shapes]
    return {
        "colluders": list(colluders),
        "parts": {n: sum(sizes[k] for k in ix) for n, ix in parts.items()},
        "peers": peers,
    }


#: A drop of the learning rate that leaves float32 models unchanged (|lr * g| far below an ulp).
FREEZE = 1e-30


def averaging_config(config: Mapping[str, Any], epoch_steps: int) -> Dict[str, Any]:
    """`config` (a `gossip_powersgd.run` config) in the averaging regime: each peer trains alone
    for `epoch_steps` local steps (an epoch, so the first gossip step comes after it), then the
    learning rate drops by FREEZE (the models stop changing) and the peers gossip-average their
    privately trained models. A warm-up longer than that epoch is refused (the freeze would come
    after it, with the models still training while they gossip)."""
    warmup = float(config.get("warmup_epochs") or 0.0)
    if warmup > 1:
        raise ValueError(
            f"the averaging regime freezes the models after their first epoch (one epoch of "
            f"local steps, then gossip): warmup_epochs {warmup:g} ends after it; set it <= 1"
        )
    out = dict(config, local_steps=epoch_steps, schedule="step", milestones=[1.0])
    return dict(out, decay=FREEZE)


def attack_modes(regime: str, tie: int = 1) -> Dict[str, Tuple[str, int]]:
    """The attacks `attack_run` runs in `regime` ({name: (updates, tie)}): ``averaging``, the
    private values once; ``dsgd``, every update an unknown and updates tied over `tie` steps."""
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {', '.join(REGIMES)}, got {regime!r}")
    if regime == "averaging":
        return {"once": ("once", 1)}
    return {"every_step": ("every_step", 1), f"tie={tie}": ("every_step", tie)}


def attack_run(
    config: Mapping[str, Any],
    regime: str,
    colluder_sets: Sequence[Sequence[int]],
    *,
    tie: int = 1,
    epoch_steps: Optional[int] = None,
) -> Dict[str, Any]:
    """Train `config` (a `gossip_powersgd.run` config; ``averaging`` sets it up with
    `averaging_config` and `epoch_steps`, the local steps of an epoch) with every view recorded
    (`observe_every_peer`), then run each colluder set's attack (`colluder_attack`) in every mode
    of `attack_modes(regime, tie)`, with the consensus step the config's algorithm gossips with
    (its spec's gamma, else the topology's: the colluders know the config).

    Returns {"steps": gossip steps, "modes": [mode names], "accuracy": the averaged model's final
    test accuracy, "local_accuracy": the peers' own models' mean, "attacks": [colluder_attack's
    result per set]}. An averaging run whose `epoch_steps` is not an epoch is refused (its first
    gossip step would not come after the private training)."""
    modes = attack_modes(regime, tie)
    if regime == "averaging":
        if epoch_steps is None:
            raise ValueError("the averaging regime needs epoch_steps, the local steps of an epoch")
        config = averaging_config(config, epoch_steps)
    result, views, x0 = observe_every_peer(config)
    summary = result.summary
    epochs = config["epochs"]
    if regime == "averaging" and summary["steps"] != epochs * epoch_steps:
        raise ValueError(
            f"{summary['steps']} optimizer steps in {epochs} epochs: epoch_steps "
            f"{epoch_steps} is not an epoch, so the first gossip step is not after it"
        )
    topology = config["topology"]
    gamma = _run_gamma(config, topology)
    return {
        "steps": 1 + max(views[0].steps),
        "modes": list(modes),
        "accuracy": summary["final_test_acc_avg_model"],
        "local_accuracy": summary["final_test_acc_local_mean"],
        "attacks": [
            colluder_attack(views, list(c), topology, x0, regime, modes, gamma=gamma)
            for c in colluder_sets
        ],
    }


def _run_gamma(config: Mapping[str, Any], topology: str) -> Optional[float]:
    """The consensus step the run's algorithm gossips with (its spec's, else the topology's)."""
    import topologies

    from gossip_powersgd.algorithms.registry import spec_gamma
    from gossip_powersgd.training.config import TrainConfig

    spec = config.get("algorithm", TrainConfig.algorithm)
    return spec_gamma(spec, topologies.parse(topology))


def summarize(attacks: Sequence[Mapping[str, Any]], modes: Sequence[str]) -> List[Dict[str, Any]]:
    """Per colluder set, part, attack mode and group of peers ("neighbours" of a colluder,
    "non-neighbours"): the count of peers, how many are determined, the median and max relative
    error, and the median errors of the blind guesses (``blind_mean_median``,
    ``blind_initial_median``). `attacks` and `modes`: an `attack_run` result's."""
    out = []
    for attack in attacks:
        for part, size in attack["parts"].items():
            if not size:
                continue
            for mode in modes:
                for group, near in (("neighbours", True), ("non-neighbours", False)):
                    cells = [
                        c
                        for c in attack["peers"].values()
                        if (c["distance"] == 1) == near and f"{part}/{mode}" in c
                    ]
                    if cells:
                        out.append(_summary(cells, part, mode, group, attack["colluders"], size))
    return out


def _summary(cells, part: str, mode: str, group: str, colluders, size: int) -> Dict[str, Any]:
    errors = [c[f"{part}/{mode}"]["error"] for c in cells]
    s = dict(part=part, mode=mode, colluders=colluders, parameters=size, peers=group)
    s.update(count=len(cells), error_max=max(errors))
    s["determined"] = sum(c[f"{part}/{mode}"]["determined"] for c in cells)
    s["error_median"] = statistics.median(errors)
    for blind in ("mean", "initial"):
        s[f"blind_{blind}_median"] = statistics.median(c[f"{part}/blind_{blind}"] for c in cells)
    return s
