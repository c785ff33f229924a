"""
Attack as a curious neighbour
=============================

A curious neighbour follows the protocol but keeps every byte it receives, and knows everything
else a participant knows: the whole config (the seed too), the code, the common initial model, the
topology and its own data and state (:doc:`../concepts/threat-model`). This page records what
such a peer sees during training, reconstructs its neighbour's model from those bytes, and runs a
membership-inference attack through the reconstruction, beside the baseline a model that never saw
the victim gives.
"""

# %%
# Record what a peer receives
# ---------------------------
#
# ``observers: [0]`` makes peer 0 record its view: every message it receives, its own model and
# the algorithm's shared state, at every step (``observe_every: k`` thins it out). Recording
# changes no bit of the run. The view goes to ``RUN_DIR/observed/rank-0/``. To make membership
# visible in seconds, each peer holds only 100 records of a 50-dimensional problem, which an MLP
# memorises.

import tempfile
from pathlib import Path

import gossip_powersgd
from gossip_powersgd.privacy import (
    load_view,
    membership_inference,
    membership_samples,
    model_with_parameters,
    null_auc_std,
    observed_dir,
    reconstruct,
)
from gossip_powersgd.training.data import load_dataset
from gossip_powersgd.training.models import build_model

config = {
    "topology": "ring:4",
    "dataset": "synthetic_logreg:d=50,classes=4,n=800,noise=1.0,test=0.5",
    "model": "mlp:64",
    "algorithm": "powergossip:rank=1",
    "lr": 0.2,
    "momentum": 0.9,
    "epochs": 40,
    "eval_every": 40,
    "observers": [0],
    "quiet": True,
    "out_dir": str(Path(tempfile.mkdtemp(prefix="curious-")) / "run"),
}
result = gossip_powersgd.run(config, states=True)
print(f"averaged model {result.acc_avg:.1%}, peers' own models {result.acc_local_mean:.1%}")
print(f"bytes the observer recorded: {result.summary['observed_bytes'][0]:,}")

# %%
# Reconstruct a neighbour's model
# -------------------------------
#
# ``reconstruct(view, neighbour)`` estimates the neighbour's parameters at every recorded step
# from the messages alone. Exact gossip sends the model itself; PowerGossip sends low-rank
# products M Q and Mᵀ P with factors both ends share, so the observer solves a least-squares
# problem over its last few messages, starting from its own model for the directions no message
# measured. Peer 1 is a neighbour of peer 0 on the ring.

view = load_view(observed_dir(result.run_dir, 0))
estimates = reconstruct(view, 1)
last = max(estimates)
print(f"{len(estimates)} steps recorded; estimating peer 1 at step {last}")

dataset = load_dataset(config["dataset"], seed=0)
blank = build_model(config["model"], dataset.input_shape, dataset.num_classes, seed=0)
truth = [result.states[1][name] for name, _ in blank.named_parameters()]
models = {
    "peer 1's own model (what it would take to know)": model_with_parameters(blank, truth),
    "reconstruction from peer 0's view": model_with_parameters(blank, estimates[last]),
    "peer 0's own model": model_with_parameters(blank, view.own_trajectory()[last]),
    "blind baseline: the initial model": blank,
}

# %%
# Membership inference
# --------------------
#
# The LOSS attack scores each record by the model's loss on it: training records (members) tend
# to have lower loss than records the victim never saw (non-members, here test records). Its AUC
# is 0.5 for a model that knows nothing of the victim's data, with a standard deviation the null
# distribution gives; the true-positive rate at a low false-positive rate is the figure that
# matters for the records most exposed.

members, nonmembers = membership_samples(dataset, rank=1, num_peers=4, partition="iid", seed=0)
attacks = membership_inference(models, members, nonmembers, fpr=0.05)
noise = null_auc_std(len(members[1]), len(nonmembers[1]))
print(f"{len(members[1])} members, {len(nonmembers[1])} non-members; null AUC 0.5 ± {noise:.3f}")
for name, figures in attacks.items():
    print(f"{name:<48} AUC {figures['auc']:.3f}   TPR at 5% FPR {figures['tpr_at_fpr']:.3f}")

# %%
# Read each row against the blind baseline, and against chance (0.5) with the spread that a
# permutation test gives chance: a figure inside that spread says nothing. On this small, memorised
# problem the victim's own model leaks membership, and how much of that the neighbour recovers is
# what the reconstruction's row measures. The repository's attack pages (:doc:`../evidence`) do
# this with models trained to a useful accuracy, several seeds, LiRA besides LOSS, the spread of
# chance from a permutation test, and DP.
#
# Network DP of noisy gossip
# --------------------------
#
# For linear gossip with Gaussian noise, an observer's whole view is one Gaussian mechanism, and
# ``pairwise_epsilon(topology, steps, sigma, delta)`` computes the exact ε of every peer u towards
# every observer v (``eps[u, v]``): noise added once, or at every step with
# ``noise="every_step"``.

import numpy as np
import topologies

from gossip_powersgd.privacy import pairwise_epsilon

eps = pairwise_epsilon(topologies.ring(8), steps=20, sigma=5.0, delta=1e-5, noise="every_step")
np.set_printoptions(precision=2, suppress=True)
print("epsilon of peer 0 towards each observer on ring:8:", eps[0])

# %%
# Peers far from the observer on the ring keep a much smaller ε than its neighbours. This covers
# linear gossip only: PowerGossip's and Choco-SGD's messages are non-linear in the models, and
# what protects a peer there is its own DP-SGD (:doc:`differential_privacy`).
