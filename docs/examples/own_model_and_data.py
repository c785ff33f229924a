"""
Bring your own model and data
=============================

A config names its dataset and model by *spec*. Besides the built-in ones (``mnist1d``,
``cifar10:root=DIR``, ``cnn1d``, ``resnet20``, ...; :doc:`../reference/config`), a spec of the
form ``package.module:function`` calls a function of yours. This page states the contract of each
kind of function and trains with them.

In a script run with ``python``, the functions it defines are in the module ``__main__``, so
``__main__:blobs`` names ``blobs`` below (this works for ``gossip_powersgd.run`` with
``backend: local``, and under ``mpiexec`` where every rank runs the script). With
``gossip-train``, put them in a module next to your config: see the end of this page.
"""

# %%
# A dataset function
# ------------------
#
# ``dataset: package.module:function`` calls ``function(seed=seed)`` (or ``function()`` when it
# takes no ``seed``) once per peer, and expects either
#
# * four arrays ``(x_train, y_train, x_test, y_test)`` (numpy arrays or tensors; ``x`` of any
#   shape with samples first, ``y`` 1-D integer class labels from 0), or
# * two map-style torch Datasets ``(train, test)`` (``len(d)`` and ``d[i] -> (x, y)``, ``y`` an
#   integer class label from 0, as for the arrays): a peer then reads only the indices of its
#   own shard. Give the training Dataset a ``targets``
#   attribute for non-IID partitions (``dirichlet:0.5``, ``shards:2``), as torchvision's have.
#
# Every peer calls it with the same seed, must get the same data (peers compare a digest of it
# and stop naming any peer that differs), and keeps only its shard (``partition``). The number of
# classes is the largest label plus one. Of two Datasets, the digest covers the test set, the
# labels ``targets`` holds and the records held in memory (a ``TensorDataset``'s tensors, an array
# ``data`` of one row per record); records read only by ``d[i]`` are not compared.

import tempfile
from pathlib import Path

import numpy as np
import torch

import gossip_powersgd


def blobs(seed: int = 0):
    """Three Gaussian blobs in 2-D: 1000 training and 200 test points."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(3, 2)) * 3
    y = rng.integers(0, 3, size=1200)
    x = (centers[y] + rng.normal(size=(1200, 2))).astype(np.float32)
    return x[:1000], y[:1000], x[1000:], y[1000:]


# %%
# A model function
# ----------------
#
# ``model: package.module:function`` calls ``function(input_shape=..., num_classes=...)`` (or
# ``function()`` when it does not take both) and expects a ``torch.nn.Module`` on the CPU.
# ``input_shape`` is the shape of one sample (here ``(2,)``). Options after a third colon are
# passed as keyword arguments: ``__main__:mlp:width=32`` calls ``mlp(input_shape=(2,),
# num_classes=3, width=32)``; a value that reads as an integer, a number or true/false is passed
# as one. Every peer builds the model with the same seed (torch's global RNG is seeded for the
# call and restored afterwards), so all peers start from the same weights.


def mlp(input_shape, num_classes, width: int = 16):
    return torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(int(np.prod(input_shape)), width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, num_classes),
    )


runs = Path(tempfile.mkdtemp(prefix="byo-"))
result = gossip_powersgd.run(
    {
        "topology": "ring:4",
        "dataset": "__main__:blobs",
        "partition": "dirichlet:1.0",
        "model": "__main__:mlp:width=32",
        "algorithm": "powergossip:rank=1",
        "lr": 0.1,
        "epochs": 4,
        "quiet": True,
        "out_dir": str(runs / "blobs"),
    }
)
print(f"{result.summary['parameters']} parameters, averaged model {result.acc_avg:.1%}")
print("label histogram per peer:", result.summary["label_histogram"])

# %%
# Data that exists only on its peer
# ---------------------------------
#
# With ``partition: local`` no peer ever loads another's data: the function is called as
# ``function(rank=r, num_peers=n[, seed=s])`` on peer ``r`` and returns only that peer's
# ``(x_train, y_train, x_test, y_test)``. The test pair may be ``None, None``: the peer then
# evaluates on a shared test set, which ``function(rank=None, num_peers=n)`` returns as
# ``(x_test, y_test)``. Since shard sizes are private, the config declares the peers' total,
# ``public_train_size``, which sets the length of an epoch. Each peer's shard size and label
# histogram stay in its own ``peers/rank-K.json``.


def hospital(rank, num_peers, seed: int = 0):
    """Peer `rank` holds 100 + 50 * rank points of its own; the test set is shared."""
    centers = np.random.default_rng([seed, 99]).normal(size=(3, 2)) * 3
    if rank is None:
        rng = np.random.default_rng([seed, 7])
        y = rng.integers(0, 3, size=300)
        return (centers[y] + rng.normal(size=(300, 2))).astype(np.float32), y
    rng = np.random.default_rng([seed, rank])
    y = rng.integers(0, 3, size=100 + 50 * rank)
    return (centers[y] + rng.normal(size=(len(y), 2))).astype(np.float32), y, None, None


result = gossip_powersgd.run(
    {
        "topology": "ring:4",
        "dataset": "__main__:hospital",
        "partition": "local",
        "public_train_size": 1100,
        "model": "__main__:mlp",
        "lr": 0.1,
        "epochs": 4,
        "quiet": True,
        "out_dir": str(runs / "hospital"),
    }
)
print(f"averaged model {result.acc_avg:.1%}")
print("shard sizes, each read from its own peer's file:")
print({rank: figures["shard_size"] for rank, figures in result.peers.items()})

# %%
# The same with gossip-train
# --------------------------
#
# ``gossip-train`` imports bring-your-own modules from the current directory, as ``python -m``
# does (no ``PYTHONPATH`` needed). Put the functions in a file, say ``my_code.py``, and name them
# in the config or with ``--set``:
#
# .. code-block:: bash
#
#    cat > my_code.py <<'EOF'
#    import numpy as np
#    import torch
#
#
#    def blobs(seed=0):
#        rng = np.random.default_rng(seed)
#        centers = rng.normal(size=(3, 2)) * 3
#        y = rng.integers(0, 3, size=1200)
#        x = (centers[y] + rng.normal(size=(1200, 2))).astype(np.float32)
#        return x[:1000], y[:1000], x[1000:], y[1000:]
#
#
#    def mlp(input_shape, num_classes, width=16):
#        return torch.nn.Sequential(
#            torch.nn.Flatten(), torch.nn.Linear(input_shape[0], width), torch.nn.ReLU(),
#            torch.nn.Linear(width, num_classes))
#    EOF
#    gossip-train --config tiny --quiet --set dataset=my_code:blobs \
#      --set model=my_code:mlp:width=32 --set out_dir=runs/blobs
#
# Under ``mpiexec`` every rank imports ``my_code`` from its own current directory: start it from
# the folder that holds the file (on every machine). A function that raises, returns the wrong
# thing or calls ``sys.exit`` stops the run with one line naming the spec and what was wrong
# (:doc:`../troubleshooting`).
#
# A training loop step of your own (gradient clipping of your kind, early stopping, logging) is a
# :class:`~gossip_powersgd.training.TrainingHooks` subclass, named the same way:
# ``hooks: [my_code:EarlyStop]`` (:doc:`../guides/extending`).
