"""
Reproduce the paper's workloads from files on disk
==================================================

The PowerGossip paper trains ResNet-20 and VGG-16 on CIFAR-10 and an LSTM language model on
WikiText-2. This package reads both datasets from their standard distributions on disk; nothing is
ever downloaded. This page writes a few records of each format into a temporary folder, so that it
runs anywhere in seconds, and trains the paper's models on them for a few steps. With the real
files, point ``root=`` at them instead; the configs of the paper's grid are in the repository's
``experiments/configs/paper/``.
"""

# %%
# CIFAR-10, binary version
# ------------------------
#
# ``dataset: cifar10:root=DIR`` reads the binary distribution (``cifar-10-binary.tar.gz``, unpacked):
# ``DIR/data_batch_1.bin`` … ``data_batch_5.bin`` and ``DIR/test_batch.bin`` (or the same under
# ``DIR/cifar-10-batches-bin/``). Each record is 1 label byte and 3072 pixel bytes (3 × 32 × 32,
# channel-major). Each peer reads only its own shard's records; training batches get a 4-pixel
# zero-padded random crop and a horizontal flip drawn from the peer's own seeded stream, every
# image the per-channel normalisation. Here: 5 × 16 training and 32 test records of noise.

import tempfile
from pathlib import Path

import numpy as np

import gossip_powersgd

data = Path(tempfile.mkdtemp(prefix="paper-data-"))
rng = np.random.default_rng(0)


def cifar_records(count: int) -> bytes:
    labels = rng.integers(0, 10, size=(count, 1), dtype=np.uint8)
    pixels = rng.integers(0, 256, size=(count, 3 * 32 * 32), dtype=np.uint8)
    return np.concatenate([labels, pixels], axis=1).tobytes()


cifar = data / "cifar-10-batches-bin"
cifar.mkdir()
for k in range(1, 6):
    (cifar / f"data_batch_{k}.bin").write_bytes(cifar_records(16))
(cifar / "test_batch.bin").write_bytes(cifar_records(32))

# %%
# ResNet-20 (``resnet20``: 272,474 parameters for 10 classes, BatchNorm) on 4 peers. The averaged
# model of a BatchNorm network gets its statistics recomputed on a few batches of each peer before
# it is evaluated, except where the peers' statistics are private (under differential privacy,
# and under ``partition: local``, unless ``release_peer_statistics: true``): it then keeps the
# peers' mean statistics, since a peer's batch statistics would leave it. On noise, the accuracy means nothing; the bytes do: PowerGossip rank 1 sends
# far less than the formula for exact gossip.

runs = Path(tempfile.mkdtemp(prefix="paper-runs-"))
result = gossip_powersgd.run(
    {
        "topology": "ring:4",
        "dataset": f"cifar10:root={data}",
        "model": "resnet20",
        "algorithm": "powergossip:rank=1",
        "batch_size": 8,
        "epochs": 1,
        "lr": 0.1,
        "momentum": 0.9,
        "quiet": True,
        "out_dir": str(runs / "resnet20"),
    }
)
summary = result.summary
print(f"{summary['parameters']:,} parameters, {result.steps} steps")
print(
    f"sent {summary['mb_sent_per_peer']:.3f} MB per peer; exact gossip would send "
    f"{summary['exact_gossip_mb_per_peer_formula']:.3f} MB "
    f"({summary['exact_gossip_mb_per_peer_formula'] / summary['mb_sent_per_peer']:.0f}x more)"
)

# %%
# WikiText-2, word level
# ----------------------
#
# ``dataset: wikitext2:root=DIR,bptt=30`` reads ``DIR/wiki.train.tokens``, ``wiki.valid.tokens``
# and ``wiki.test.tokens`` (or the same under ``DIR/wikitext-2/``): every line's words plus
# ``<eos>``, over the vocabulary of the training text. Records are consecutive windows of
# ``bptt`` tokens, each token's target the next one; ``split=valid`` evaluates on the validation
# text instead of the test text. ``partition: contiguous`` gives each peer a contiguous chunk of
# the text, and evaluations report perplexity beside accuracy.

words = "the gossip of peers on a ring keeps their average model exactly where it was".split()


def text(lines: int) -> str:
    return "".join(" ".join(rng.choice(words, size=12)) + " \n" for _ in range(lines))


wikitext = data / "wikitext-2"
wikitext.mkdir()
(wikitext / "wiki.train.tokens").write_text(text(200))
(wikitext / "wiki.valid.tokens").write_text(text(20))
(wikitext / "wiki.test.tokens").write_text(text(20))

result = gossip_powersgd.run(
    {
        "topology": "ring:4",
        "dataset": f"wikitext2:root={data},bptt=10",
        "partition": "contiguous",
        "model": "lstm_lm:layers=2,hidden=32,tied=true,dropout=0.2",
        "algorithm": "powergossip:rank=1,iters=4",
        "max_grad_norm": 0.25,
        "batch_size": 8,
        "epochs": 1,
        "lr": 1.0,
        "quiet": True,
        "out_dir": str(runs / "lstm"),
    }
)
last = result.evals[-1]
print({key: round(value, 2) for key, value in last.items() if "perplexity" in key})

# %%
# The paper's grid
# ----------------
#
# ``experiments/configs/paper/`` holds one config per row of the paper's tables (ResNet-20 on
# CIFAR-10 with exact gossip, all-reduce, Choco-SGD, DeepSqueeze and PowerGossip at 1 and 2 power
# iterations, warm-started or not; the LSTM on WikiText-2 with PowerGossip at 8 to 32 iterations,
# exact gossip and 32 local steps). ``local_steps: H`` communicates once every H steps. With the
# data on disk, one of them on 8 processes:
#
# .. code-block:: console
#
#    $ torchrun --nproc-per-node 8 -m gossip_powersgd.cli.train \
#        --config experiments/configs/paper/resnet20_cifar10_powergossip_r1_i1_warm.yaml \
#        --set dataset=cifar10:root=/path/to/cifar-10-batches-bin
#
# Without the data, ``dataset: synthetic_images`` is a CIFAR-shaped synthetic stand-in
# (3 × 32 × 32, 10 classes, generated record by record from the seed; not CIFAR-10). The
# repository's stand-in page measures the paper's models on it (:doc:`../evidence`).
