"""One attacked run: train with an observer and its victim recording their views, then measure what
the observer learns of the victim (reconstruction error over time, LOSS membership inference with
four models) and what the run sent; and the pairwise network-DP matrices of noisy exact gossip."""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

from gossip_powersgd.training.hooks import SetupContext, TrainingHooks

#: The setting, chosen so that the attack has signal: small Dirichlet(0.5) shards of MNIST-1D
#: (1600 training samples over 8 peers, ~200 each), an MLP with 23k parameters (over-
#: parameterised for its shard) trained long enough to fit its shard, no weight decay.
SETTING = dict(dataset="mnist1d:num_samples=2000", partition="dirichlet:0.5", model="mlp:128,128",
               optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=0.0, batch_size=32, seed=0,
               backend="local", quiet=True, log_every=0, checkpoint_every=0, threads=1,
               comm_timeout=600.0)
#: --quick: seconds, for tests and smoke checks.
QUICK_SETTING = dict(SETTING, dataset="synthetic_logreg:d=20,classes=4,n=400", model="mlp:32",
                     partition="iid", lr=0.2, momentum=0.0)
#: (label, spec). Choco sign's γ = 1.0 is what the training page's sweep chose on ring:8
#: (experiments/results/training.md; the privacy page uses the same).
ALGORITHMS = (("exact gossip", "exact"), ("PowerGossip r1", "powergossip:rank=1"),
              ("PowerGossip r4", "powergossip:rank=4"), ("Choco sign", "choco:compressor=sign,gamma=1.0"))
#: The observer, and the neighbour it attacks (a neighbour of 0 on every topology used here).
OBSERVER, VICTIM = 0, 1
#: The one ε of the private runs (DP-SGD on every peer, target ε at δ, clip norm C).
#: The experimenter plays every peer and reports the victim's epsilon, so the peers' figures are
#: released to it (release_peer_statistics); the noise and masks stay secret per peer.
DP = dict(dp_target_epsilon=8.0, dp_delta=1e-5, dp_max_grad_norm=1.0, release_peer_statistics=True)
#: The membership-inference models, as the page names them.
MODELS = (("victim", "(a) victim's true model"), ("reconstruction", "(b) observer's reconstruction"),
          ("observer", "(c) observer's own model"), ("average", "(d) average of all models"))


class LastModels(TrainingHooks):
    """Keeps this peer's parameters as they are when the last step's gossip starts: the same
    instant as the last recorded `own` of a view (no algorithm changes its parameters before a
    step's first exchange)."""

    name = "last_models"

    def __init__(self):
        self.context: Optional[SetupContext] = None
        self.total_steps = 0
        self.parameters: List[torch.Tensor] = []

    def setup(self, context: SetupContext) -> None:
        self.context = context  # read at the end: a later hook may replace the algorithm
        self.total_steps = context.config.epochs * context.steps_per_epoch

    def after_optimizer_step(self, step: int) -> None:
        if step == self.total_steps - 1:
            self.parameters = [p.detach().cpu().clone() for p in self.context.algorithm.params]


def _peer(comm, config, keeper: Dict[int, LastModels]):
    from gossip_powersgd.training.trainer import train

    hook = keeper[comm.rank] = LastModels()
    return train(comm, config, hooks=[hook])


def attacked_run(topology: str, spec: str, private: bool, epochs: int, quick: bool = False,
                 window: Optional[int] = None, sigma: Optional[float] = None) -> Dict[str, Any]:
    """Train `spec` on `topology` with OBSERVER and VICTIM recording (every step), and measure the
    attack; the views live in a temporary folder, removed afterwards. `window`: PowerGossip's
    least-squares window (default `reconstruction.DEFAULT_WINDOW`). `sigma`: a private run's noise
    multiplier, when a run of the same shards and steps already found the one of DP's target ε
    (the search for it costs more than a small run)."""
    from gossip_powersgd.launch import run_peers
    from gossip_powersgd.privacy import (DEFAULT_WINDOW, load_view, observed_dir, reconstruct,
                                         reconstruction_errors)
    from gossip_powersgd.training.config import config_from_dict, resolve_topology

    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="privacy-attacks-"))
    try:
        data = dict(QUICK_SETTING if quick else SETTING, topology=topology, algorithm=spec,
                    epochs=epochs, eval_every=epochs, observers=[OBSERVER, VICTIM],
                    observe_every=1, out_dir=str(folder / "run"))
        if private:
            data.update(DP)
            if sigma is not None:
                del data["dp_target_epsilon"]
                data["dp_noise_multiplier"] = sigma
        config = config_from_dict(data)
        config = config.replace(peers=resolve_topology(config).size)
        keeper: Dict[int, LastModels] = {}
        started = time.perf_counter()
        summaries = run_peers(resolve_topology(config), _peer, config, keeper, backend="local",
                              timeout=config.comm_timeout)
        seconds = time.perf_counter() - started
        summary = summaries[0]
        observer = load_view(observed_dir(config.out_dir, OBSERVER))
        victim = load_view(observed_dir(config.out_dir, VICTIM))
        errors = reconstruction_errors(observer, VICTIM, victim.own_trajectory(),
                                       window or DEFAULT_WINDOW)
        last = errors["steps"][-1]
        parameters = {"victim": victim.own_trajectory()[last],
                      "reconstruction": reconstruct(observer, VICTIM, window or DEFAULT_WINDOW)[last],
                      "observer": observer.own_trajectory()[last],
                      "average": [torch.stack(ts).mean(0) for ts in
                                  zip(*(keeper[k].parameters for k in sorted(keeper)))]}
        attack = membership(config, parameters)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    epsilons = [math.inf if e == "inf" else float(e) for e in summary.get("epsilon", [math.inf])]
    return {
        "topology": topology, "spec": spec, "private": private, "epochs": epochs,
        "steps": summary["steps"], "parameters": summary["parameters"],
        "mb_sent_per_peer": summary["mb_sent_per_peer"],
        "observed_mb": summary["observed_bytes"][OBSERVER] / 1e6,
        "acc_avg": summary["final_test_acc_avg_model"],
        "acc_local_mean": summary["final_test_acc_local_mean"],
        "train_loss": summary["final_train_loss"], "eps_max": max(epsilons),
        "sigma": summary.get("noise_multiplier"),
        "error_steps": errors["steps"], "error": errors["estimate"], "error_trivial": errors["trivial"],
        "final_error": errors["estimate"][-1], "final_error_trivial": errors["trivial"][-1],
        "members": attack.pop("members"), **attack, "run_seconds": seconds,
    }


def membership(config, parameters: Dict[str, Sequence[torch.Tensor]]) -> Dict[str, Any]:
    """LOSS-attack AUC and TPR at 1 % FPR on VICTIM's shard, with each model in `parameters`."""
    from gossip_powersgd.privacy import (membership_inference, membership_samples,
                                         model_with_parameters, null_auc_std)
    from gossip_powersgd.training.data import load_dataset
    from gossip_powersgd.training.models import build_model

    dataset = load_dataset(config.dataset, config.seed)
    members, nonmembers = membership_samples(dataset, VICTIM, config.peers, config.partition,
                                             config.seed)
    model = build_model(config.model, dataset.input_shape, dataset.num_classes, config.seed)
    models = {name: model_with_parameters(model, values) for name, values in parameters.items()}
    report = membership_inference(models, members, nonmembers)
    out: Dict[str, Any] = {"members": len(members[0]),
                           "auc_null_std": null_auc_std(len(members[0]), len(nonmembers[0]))}
    for name, values in report.items():
        out[f"auc_{name}"] = values["auc"]
        out[f"tpr_{name}"] = values["tpr_at_fpr"]
    return out


#: The network-DP comparison: three 16-peer topologies at one sigma and delta (sensitivity 1), in
#: the cases (noise, steps): noise once then 2 or 20 gossip steps, and fresh noise at each of 20.
NETWORK_TOPOLOGIES = ("ring:16", "exponential:16", "complete:16")
NETWORK_SIGMA, NETWORK_DELTA = 5.0, 1e-5
NETWORK_CASES = (("once", 2), ("once", 20), ("every_step", 20))


def network_dp(specs: Sequence[str] = NETWORK_TOPOLOGIES,
               network_cases: Sequence[tuple] = NETWORK_CASES) -> Dict[str, Any]:
    """Exact pairwise epsilon[u, v] (u's privacy towards observer v's whole view) of noisy exact
    gossip per case and topology, beside its local-DP ceiling and, with noise once, Muffliato's
    per-message sum (not a bound) converted the same way."""
    import numpy as np

    from gossip_powersgd.privacy import (gaussian_epsilon, local_epsilon, pairwise_epsilon,
                                         per_message_composition_rdp)
    import topologies

    cases = []
    for noise, steps in network_cases:
        ceiling = local_epsilon(steps, NETWORK_SIGMA, NETWORK_DELTA, noise=noise)
        for spec in specs:
            eps = pairwise_epsilon(spec, steps, NETWORK_SIGMA, NETWORK_DELTA, noise=noise)
            mask = ~np.eye(len(eps), dtype=bool)
            off = eps[mask]
            case = {"topology": spec, "noise": noise, "steps": steps, "matrix": eps.tolist(),
                    "min": float(off.min()), "median": float(np.median(off)),
                    "max": float(off.max()), "local": ceiling,
                    "at_local": float(np.isclose(off, ceiling, rtol=1e-9, atol=0).mean())}
            if noise == "once":
                rho = per_message_composition_rdp(topologies.parse(spec), steps, NETWORK_SIGMA)
                summed = gaussian_epsilon(np.sqrt(2 * rho[mask]), NETWORK_DELTA)
                case["per_message_min"] = float(summed.min())
                case["per_message_max"] = float(summed.max())
                case["per_message_below_exact"] = float((summed < off * (1 - 1e-9)).mean())
                case["per_message_above_local"] = float((summed > ceiling * (1 + 1e-9)).mean())
            cases.append(case)
    return {"sigma": NETWORK_SIGMA, "delta": NETWORK_DELTA, "cases": cases}
