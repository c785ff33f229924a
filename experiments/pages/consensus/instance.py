"""One instance of the consensus page (a topology and a problem): every algorithm, every γ of a
tuned one, on seed 0, then the other seeds; the page's list of instances; and the trained models
of the `models:epoch=E` problem (`ensure_models`)."""

from __future__ import annotations

import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from experiments.suite.runs import BASE
from gossip_powersgd.training.hooks import TrainingHooks

from .measure import STEP_CAP, cells_for, consensus_curve, expand, matched, matched_ratio, summarize

#: Algorithms at the topology's γ (no tuning): the original problems' full list...
UNTUNED = ("exact",) + tuple(f"powergossip:rank={r},iters=1,warm=true" for r in (1, 2, 4))
UNTUNED += ("powergossip:rank=1,iters=1,warm=false",)
#: ...and the baselines whose γ is swept over the grid.
BASELINES = tuple(
    f"{name}:compressor={c}"
    for name in ("choco", "deepsqueeze")
    for c in ("sign", "topk:matched", "lowrank:1")
)
#: The algorithms of the added problems, of the winner map and of the seeds after the first.
WINNER_SPECS = UNTUNED[:2] + UNTUNED[3:4] + BASELINES[:2]
GAMMAS = (0.01, 0.03, 0.1, 0.3, 1.0, 1.2, 1.4, 2.0)
SEEDS = (0, 1, 2)
#: The instances, in the page's order: (topology, problem, kind). "full": an original problem
#: with every algorithm on seed 0 (the winner map's on seeds 1-2); "added": a new problem with the
#: winner map's algorithms on 3 seeds (`models`: 1, its randomness is the one training's). Cut to
#: fit the time: the page lists what of `FULL_GRID` did not run. The last 8 were added later.
SPECTRAL = tuple(f"spectral:alpha={a:g}" for a in (0, 0.5, 1, 2))
LOWRANK = tuple(
    f"lowrank:r={r},sigma={s}" for r, s in ((4, 0), (4, 0.1), (4, 0.3), (1, 0.1), (16, 0.1))
)
MODELS = tuple(f"models:epoch={e}" for e in (1, 10, 30))
LATER_RING = ("lowrank:r=1,sigma=0", "lowrank:r=16,sigma=0", "lowrank:r=4,sigma=0.03")
LATER_TORUS = SPECTRAL[0:3:2] + LOWRANK[:2] + ("offset:beta=10",)
INSTANCES = (
    (("ring:8", "matrix", "full"), ("ring:8", "cnn", "full"))
    + tuple(("ring:8", p, "added") for p in SPECTRAL + LOWRANK + ("offset:beta=10",) + MODELS)
    + (("torus:4x4", "matrix", "full"), ("torus:4x4", "spectral:alpha=2", "added"))
    + tuple(("ring:8", p, "added") for p in LATER_RING)
    + tuple(("torus:4x4", p, "added") for p in LATER_TORUS)
)
#: Every problem the page would run on each topology given the time (`offset:beta=0` is `matrix`).
FULL_GRID = (
    ("matrix", "cnn")
    + SPECTRAL
    + tuple(f"lowrank:r={r},sigma={s:g}" for r in (1, 4, 16) for s in (0, 0.03, 0.1, 0.3))
    + ("offset:beta=10",)
    + MODELS
)
#: The local backend runs one thread per peer; a longer GIL switch interval than the default 5 ms
#: runs the same (deterministic: peers synchronise on every message) computation 2-4x faster.
SWITCH_INTERVAL_S = 0.05
#: A stored run's curve: a list of each of these, a value per recorded step.
CURVE = ("step", "bits_per_peer", "error")


#: The `models:epoch=E` problem's tensors: every peer's `cnn1d` parameters after E epochs of D-PSGD
#: on the consensus topology itself, saved at the end of each of these epochs (`ensure_models`).
SAVED_EPOCHS = (1, 10, 30)
#: D-PSGD on the demo recipe (lr 0.1, momentum 0.9, cosine, batch 32), Dirichlet(0.1) labels.
TRAINING = dict(BASE, algorithm="exact", partition="dirichlet:0.1", eval_every=1000)


class SaveAtEpochs(TrainingHooks):
    """Keeps a float32 copy of the model's parameters at the end of the chosen epochs."""

    name = "consensus_save_at_epochs"

    def __init__(self, epochs: Sequence[int]):
        self.epochs, self.saved = set(int(e) for e in epochs), {}
        self.model, self.steps_per_epoch = None, 1

    def setup(self, context) -> None:
        self.model, self.steps_per_epoch = context.model, context.steps_per_epoch

    def after_gossip(self, step: int) -> None:
        epoch, rest = divmod(step + 1, self.steps_per_epoch)
        if rest == 0 and epoch in self.epochs:
            self.saved[epoch] = [p.detach().float().clone() for p in self.model.parameters()]


def ensure_models(topology: str, seed: int, base: Path, epochs=SAVED_EPOCHS) -> Path:
    """The cache file {"epochs": {E: {rank: [tensors]}}, ...}, trained unless it exists; one
    trainer at a time per file (a lock): instances in parallel wait for it and reuse it."""
    import fcntl
    import io

    import torch

    from gossip_powersgd import run
    from gossip_powersgd.utils import atomic_write

    path = Path(base) / f"{topology.replace(':', '')}_seed{seed}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists() and set(epochs) <= set(torch.load(path, weights_only=True)["epochs"]):
            return path
        hooks: Dict[int, SaveAtEpochs] = {}

        def make(rank: int) -> List[SaveAtEpochs]:
            hooks[rank] = SaveAtEpochs(epochs)
            return [hooks[rank]]

        started = time.perf_counter()
        result = run(dict(TRAINING, topology=topology, seed=seed, epochs=max(epochs)), make)
        saved = {e: {rank: hooks[rank].saved[e] for rank in sorted(hooks)} for e in epochs}
        data = {"epochs": saved, "seconds": time.perf_counter() - started}
        buffer = io.BytesIO()
        torch.save(
            dict(data, topology=topology, seed=seed, test_acc_avg_model=result.acc_avg), buffer
        )
        atomic_write(path, buffer.getvalue())
    return path


def settings(kind: str, problem: str) -> Dict:
    """The algorithms, the algorithms rerun on later seeds (None: all) and the seeds of a kind."""
    seeds = [0] if problem.startswith("models:") else list(SEEDS)
    if kind == "full":
        return dict(algorithms=list(UNTUNED + BASELINES), reseed=list(WINNER_SPECS), seeds=seeds)
    return {"algorithms": list(WINNER_SPECS), "reseed": None, "seeds": seeds}


def run_instance(
    topology: str,
    problem: str,
    algorithms: Sequence[str],
    reseed: Optional[Sequence[str]],
    seeds: Sequence[int],
    gammas: Sequence[float],
    budgets: Sequence[float],
    dtype: str,
    stop_relative: float,
    models_dir: str,
) -> Dict:
    """The instance's row: every run (curve, stop, γ) and the top-k ratio. A swept algorithm's γ
    run to the second largest budget ("screen"), the best is rerun to the largest; later seeds
    rerun each `reseed` algorithm (None: all) once, a swept one at its best γ on seed 0."""
    import topologies

    from gossip_powersgd.algorithms import algorithm_label, spec_gamma
    from gossip_powersgd.launch import run_peers

    started, topo, switch = time.perf_counter(), topologies.parse(topology), sys.getswitchinterval()
    screen_bits, max_bits = budgets[-2], budgets[-1]
    models = str(ensure_models(topology, 0, models_dir)) if problem.startswith("models:") else None
    kw = dict(budgets=budgets, stop_error=stop_relative, dtype=dtype, models_file=models)
    kw["stop_at_floor"] = True
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        ratio = None
        if any("topk:matched" in a for a in algorithms):
            ratio = run_peers(topo, matched_ratio, problem, dtype, 0, models)[0]

        def one(item: Dict, bits: float, stage: str, seed: int) -> Dict:
            spec = item["spec"]
            values = run_peers(
                topo, consensus_curve, problem, spec, STEP_CAP, bits, seed=seed, **kw
            )
            h = values[0]["history"]
            if any(v["history"] != h for v in values.values()):
                raise RuntimeError(f"{spec}: the peers recorded different histories")
            out = {k: values[0][k] for k in ("stop", "seconds", "floor")}
            curve = {k: [r[k] for r in h] for k in CURVE}
            gamma = spec_gamma(spec, topo)
            return {**item, "gamma": gamma, "stage": stage, "seed": seed, **out, "curve": curve}

        runs = [
            one(r, screen_bits, "screen", 0) if r["swept"] else one(r, max_bits, "full", 0)
            for r in expand(algorithms, gammas, ratio)
        ]
        for label in dict.fromkeys(r["label"] for r in runs if r["swept"]):
            screened = [r for r in runs if r["label"] == label and r["stop"] != "diverged"]
            best = min(screened, key=lambda r: _screen_key(r, screen_bits), default=None)
            if best is not None and best["stop"] == "max_bits":
                runs[runs.index(best)] = one(best, max_bits, "full", 0)
        chosen = None if reseed is None else {algorithm_label(matched(s, ratio)) for s in reseed}
        summary = summarize([with_cells(r, budgets) for r in runs], budgets)
        for seed in seeds[1:]:
            for label, entry in summary.items():
                if chosen is None or label in chosen:
                    item = {"label": label, "spec": entry["plot_spec"], "swept": entry["swept"]}
                    runs.append(one(item, max_bits, "full", seed))
    finally:
        sys.setswitchinterval(switch)
    out = {
        "gamma_topology": topo.gamma,
        "topk_ratio": ratio,
        "seconds": time.perf_counter() - started,
    }
    return dict(out, cpu_count=os.cpu_count(), machine=platform.machine(), runs=runs)


def history(run: Dict) -> List[Dict]:
    """A stored run's curve (a list per key of CURVE) as records, a dict per step."""
    return [dict(zip(CURVE, values)) for values in zip(*(run["curve"][k] for k in CURVE))]


def with_cells(run: Dict, budgets: Sequence[float]) -> Dict:
    """A stored run with its history and its table cells (`cells_for`)."""
    h = history(run)
    return dict(
        run, history=h, budgets=cells_for(h, budgets, run["stop"], run["stage"], run["floor"])
    )


def _screen_key(run: Dict, screen_bits: float):
    """Screening runs that stopped early at their target first (fewest bits), then by the error
    at the screening budget."""
    h = history(run)
    if run["stop"] in ("reached", "floor"):
        return (0, h[-1]["bits_per_peer"])
    cell = cells_for(h, [screen_bits], run["stop"], "full")[screen_bits]
    return (1, cell["row"]["error"] if cell["status"] == "ok" else math.inf)
