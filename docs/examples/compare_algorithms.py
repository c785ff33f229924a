"""
Compare algorithms on a ring
============================

Train the same model on the same 8-peer ring with exact gossip, PowerGossip and Choco-SGD, and
read for each what matters: the bytes each peer sent, the accuracy of the averaged model and of
each peer's own model, and how far apart the peers still are (the consensus distance).

Every peer here is a thread of this process (``backend: local``). The same config run under
``mpiexec`` or ``torchrun`` gives the same models, bit for bit: the commands are at the end.
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
# The same comparison from the command line
# -----------------------------------------
#
# ``gossip-train`` runs a config file; ``--set`` overrides any key. Under ``mpiexec`` each rank
# is one peer (``backend: mpi``); under ``torchrun`` each process is one peer (``backend:
# torch``, gloo on the CPU). Both need as many processes as the topology has peers; a mismatch
# stops every rank with one line saying how many to start. Here the bundled ``tiny`` example
# (4 peers, seconds), once per algorithm and launcher, then ``gossip-plot`` draws the runs side
# by side:
#
# .. code-block:: bash
#
#    for alg in exact powergossip:rank=1; do
#      mpiexec -n 4 gossip-train --config tiny --quiet --set backend=mpi \
#        --set algorithm=$alg --set out_dir=runs/mpi-${alg%%:*}
#    done
#    torchrun --standalone --nproc-per-node 4 -m gossip_powersgd.cli.train --config tiny \
#      --quiet --set backend=torch --set algorithm=powergossip:rank=1 --set out_dir=runs/torch-powergossip
#    gossip-plot runs/mpi-exact runs/mpi-powergossip --out runs/plots
#    cmp <(python -c "import json; print(json.load(open('runs/mpi-powergossip/summary.json'))['model_sha256'])") \
#        <(python -c "import json; print(json.load(open('runs/torch-powergossip/summary.json'))['model_sha256'])")
#
# The last line checks what is claimed above: the MPI and torch runs end with the same model, bit
# for bit (``model_sha256`` in each ``summary.json``). Rank 0 prints the summary table of each
# run; ``--quiet`` leaves out the per-evaluation lines. Without ``--set backend=mpi`` under
# ``mpiexec`` (or ``backend=torch`` under ``torchrun``) the run stops with a line saying to add it.
#
# :doc:`../guides/launching` has more on launchers; the full comparison (60 epochs, 3 seeds)
# is the training page of :doc:`../evidence`.
