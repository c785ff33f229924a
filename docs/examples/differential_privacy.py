"""
Train with differential privacy and read each peer's ε
======================================================

With ``dp_noise_multiplier`` (σ) or ``dp_target_epsilon``, and ``dp_max_grad_norm`` (C), every
peer trains with DP-SGD on its own shard: it Poisson-samples its shard at rate
q = batch_size / shard size, clips every example's gradient to norm C and adds Gaussian noise of
standard deviation σC to the sum before its optimizer step. Everything it sends afterwards is
post-processing of its private iterates, whatever the algorithm. Each peer keeps its own
accountant, so each peer has its own ε: peers with different shard sizes sample at different
rates. Needs the ``privacy`` extra (``pip install 'gossip_powersgd[privacy]'``: Opacus and
dp-accounting). What exactly is guaranteed, and against whom: :doc:`../concepts/threat-model`.
"""

# %%
# Peers with shards of different sizes
# ------------------------------------
#
# Four peers hold 400, 800, 1200 and 1600 records of their own (``partition: local``; the
# contract of such a function is in :doc:`own_model_and_data`). Their total is declared public,
# since the sizes themselves are private.

import json
import tempfile
from pathlib import Path

import numpy as np

import gossip_powersgd


def clinic(rank, num_peers, seed: int = 0):
    """A linear problem in 20 dimensions; peer `rank` holds 400 * (rank + 1) records."""
    teacher = np.random.default_rng([seed, 1]).normal(size=(20, 4))
    rng = np.random.default_rng([seed, 2 if rank is None else 3 + rank])
    n = 1000 if rank is None else 400 * (rank + 1)
    x = rng.normal(size=(n, 20)).astype(np.float32)
    y = np.argmax(x @ teacher + 0.3 * rng.normal(size=(n, 4)), axis=1)
    return (x, y) if rank is None else (x, y, None, None)


base = {
    "topology": "ring:4",
    "dataset": "__main__:clinic",
    "partition": "local",
    "public_train_size": 4000,
    "model": "logreg",
    "algorithm": "exact",
    "batch_size": 64,
    "lr": 0.5,
    "epochs": 3,
    "quiet": True,
}
runs = Path(tempfile.mkdtemp(prefix="dp-"))

# %%
# The same run without and with DP
# --------------------------------
#
# ``dp_noise_multiplier: 1.0`` fixes σ for every peer; ``dp_target_epsilon`` instead makes each
# peer solve for its own σ from its own q. ``dp_delta`` defaults to the largest power of ten at
# most 1 / (10 × the training set size).

plain = gossip_powersgd.run({**base, "out_dir": str(runs / "plain")})
private = gossip_powersgd.run(
    {
        **base,
        "dp_noise_multiplier": 1.0,
        "dp_max_grad_norm": 1.0,
        "dp_accountant": "rdp",
        "out_dir": str(runs / "dp"),
    }
)
print(f"without DP: averaged model {plain.acc_avg:.1%}")
print(f"with DP:    averaged model {private.acc_avg:.1%}")

# %%
# Each peer's ε
# -------------
#
# Nothing computed from a peer's private data (its shard size, sampling rate, ε, label histogram,
# training loss) goes to another peer, to ``summary.json``, to the logs or to rank 0's progress
# line. Each peer writes its own figures to its own ``RUN_DIR/peers/rank-K.json``: ε by the
# chosen accountant (``rdp``, ``prv`` or ``gdp``) and, beside it, by dp-accounting's privacy loss
# distributions (``epsilon_pld``), an accountant from another library.

for rank in range(4):
    figures = json.loads((private.run_dir / "peers" / f"rank-{rank}.json").read_text())
    print(
        f"peer {rank}: {figures['shard_size']:5d} records, q = {figures['sample_rate']:.3f}, "
        f"sigma = {figures['noise_multiplier']}, {figures['steps']} steps -> "
        f"epsilon = {figures['epsilon']:.2f} (PLD: {figures['epsilon_pld']:.2f}) "
        f"at delta = {figures['delta']:g}"
    )
print("summary.json says:", private.summary["epsilon_per_peer"])

# %%
# The peer with the largest shard samples each record least often and gets the smallest ε. The
# same figures are in ``RunResult.peers`` when the run is in-process. The guarantee is
# record-level (ε, δ)-DP of each peer's own data, for adding or removing one record of that
# peer's shard (``dp_adjacency``), against anyone who sees every message the peer sends, the
# whole config and seed included; the noise and the sampling come from a secret of the peer
# (``dp_secret: os``, fresh entropy, never written; ``run_dir`` keeps it in the peer's own run
# directory for a bit-exact ``--resume``).
#
# ``release_peer_statistics: true`` gathers every peer's figures into the summary instead (the
# sizes are then public). Models with BatchNorm are refused, naming the layer: use GroupNorm, or
# ``dp_fix_model: true`` to replace it.
#
# From the command line, the same keys:
#
# .. code-block:: bash
#
#    gossip-train --config tiny --quiet --set dp_noise_multiplier=1.0 --set dp_max_grad_norm=1.0 \
#      --set out_dir=runs/tiny-dp
#    cat runs/tiny-dp/peers/rank-0.json
#
# Measured accuracy against ε for every algorithm, and the budgets that pay, are on the privacy
# pages of :doc:`../evidence`.
