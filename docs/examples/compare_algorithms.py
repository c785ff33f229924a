"""
Compare algorithms on a ring
============================

Train the same model on the same 8-peer ring with exact gossip, PowerGossip and Choco-SGD, and
read for each what matters: the bytes each peer sent, the accuracy of the averaged model and of
each peer's own model, and how far apart the peers still are (the consensus distance).

First every peer is a thread of this process (``backend: local``); then the same comparison runs
under ``mpiexec`` and ``torchrun``, which give the same models, bit for bit.
"""

# %%
# One config, several algorithms
# ------------------------------
#
# A config is a mapping of keys (:doc:`../reference/config`); ``gossip_powersgd.run`` validates it
# exactly as ``gossip-train`` does and runs every peer. MNIST-1D (a 1-D stand-in for MNIST that
# the ``mnist1d`` package generates locally) with its small CNN, 5 epochs: far from converged,
# but enough to see the differences. Each run writes its run directory (here in a temporary
# folder): config.yaml, metrics/, summary.json.

import tempfile
from pathlib import Path

import gossip_powersgd

runs = Path(tempfile.mkdtemp(prefix="compare-"))
base = {
    "topology": "ring:8",
    "dataset": "mnist1d",
    "model": "cnn1d",
    "optimizer": "sgd",
    "lr": 0.1,
    "momentum": 0.9,
    "epochs": 5,
    "backend": "local",
    "quiet": True,
}
algorithms = {
    "exact gossip": "exact",
    "PowerGossip r1": "powergossip:rank=1",
    "PowerGossip r4": "powergossip:rank=4",
    "Choco-SGD sign": "choco:compressor=sign,gamma=0.5",
}
results = {}
for label, spec in algorithms.items():
    config = {**base, "algorithm": spec, "out_dir": str(runs / label.replace(" ", "-"))}
    results[label] = gossip_powersgd.run(config)

# %%
# Bytes, accuracy and consensus
# -----------------------------
#
# ``RunResult`` holds the summary (``summary.json``) and every evaluation record. Accuracies are
# fractions here (percentages on screen). ``mb_sent_per_peer`` counts the training messages
# only; evaluations and the consensus distance travel apart (``metric_bytes_sent``).

exact_mb = results["exact gossip"].mb_sent_per_peer
print(
    f"{'algorithm':<16} {'MB/peer':>8} {'x fewer':>8} {'avg acc':>8} {'local acc':>10} {'consensus':>10}"
)
for label, result in results.items():
    print(
        f"{label:<16} {result.mb_sent_per_peer:8.3f} {exact_mb / result.mb_sent_per_peer:8.1f}"
        f" {result.acc_avg:8.2%} {result.acc_local_mean:10.2%} {result.consensus_distance:10.3g}"
    )

# %%
# The averaged model's accuracy is that of the mean of all peers' parameters, which gossip
# preserves; the local accuracy is each peer's own model, mean over peers. The consensus distance
# is the mean over peers of ‖x_i − x̄‖²: exact gossip keeps the peers closest, and the compressed
# algorithms trade some of that agreement for bytes. Bytes on a rank-1 exchange of an m × n matrix
# are r(m + n) floats instead of mn, so the saving grows with the size of the model's matrices.
#
# Accuracy against the bytes sent is the fair comparison: each evaluation record carries both.

import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 3.5))
for label, result in results.items():
    evals = result.evals
    ax.plot(
        [r["mb_sent_per_peer"] for r in evals],
        [100 * r["test_acc_avg_model"] for r in evals],
        marker="o",
        label=label,
    )
ax.set_xscale("log")
ax.set_xlabel("training MB sent per peer")
ax.set_ylabel("averaged-model accuracy (%)")
ax.grid(alpha=0.3)
ax.legend()
fig.tight_layout()

# %%
# The same comparison under mpiexec and torchrun
# ----------------------------------------------
#
# ``gossip-train`` runs a config file; ``--set`` overrides any key. Under ``mpiexec`` each rank
# is one peer (``backend: mpi``); under ``torchrun`` each process is one peer (``backend:
# torch``, gloo on the CPU). Both need as many processes as the topology has peers; a mismatch
# stops every rank with one line saying how many to start, and so does a launch without the
# matching ``--set backend=...``. Here the bundled ``tiny`` example (4 peers, seconds): exact
# gossip and PowerGossip under ``mpiexec``, PowerGossip again under ``torchrun``. These are
# shell commands; this page runs them as they are printed, with the launchers of the environment
# the package is installed in first on ``PATH`` (in a checkout, ``.venv/bin``).

import json
import os
import shlex
import subprocess
import sys

env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
env.setdefault("OMP_NUM_THREADS", "1")  # one thread per peer process
commands = {
    "mpi-exact": "mpiexec -n 4 gossip-train --config tiny --quiet --set backend=mpi"
    " --set algorithm=exact --set out_dir={runs}/mpi-exact",
    "mpi-powergossip": "mpiexec -n 4 gossip-train --config tiny --quiet --set backend=mpi"
    " --set algorithm=powergossip:rank=1 --set out_dir={runs}/mpi-powergossip",
    "torch-powergossip": "torchrun --standalone --nproc-per-node 4 -m gossip_powersgd.cli.train"
    " --config tiny --quiet --set backend=torch --set algorithm=powergossip:rank=1"
    " --set out_dir={runs}/torch-powergossip",
}
summaries = {}
for name, command in commands.items():
    print("$", command.format(runs="runs"))
    argv = shlex.split(command.format(runs=runs))
    subprocess.run(argv, env=env, check=True, timeout=600, stdout=subprocess.DEVNULL)
    summaries[name] = json.loads((runs / name / "summary.json").read_text())

# %%
# Each run directory holds the same ``summary.json`` as an in-process run. Rank 0 also printed
# the summary table (left out here); ``--quiet`` leaves out the per-evaluation lines.

for name, summary in summaries.items():
    print(
        f"{name:<18} {summary['mb_sent_per_peer']:8.4f} MB/peer"
        f"  avg acc {summary['final_test_acc_avg_model']:.2%}"
        f"  consensus {summary['final_consensus_distance']:.3g}"
    )
mpi, torch_run = summaries["mpi-powergossip"], summaries["torch-powergossip"]
print("same model under mpiexec and torchrun:", mpi["model_sha256"] == torch_run["model_sha256"])

# %%
# The last line checks what is claimed above: the MPI and torch runs end with the same model, bit
# for bit (``model_sha256`` in each ``summary.json``). ``gossip-plot runs/mpi-exact
# runs/mpi-powergossip --out runs/plots`` draws the runs side by side, against epochs and against
# MB sent.
#
# :doc:`../guides/launching` has more on launchers; the full comparison (60 epochs, 3 seeds)
# is the training page of :doc:`../evidence`.
