"""Datasets read record by record from local files: each peer reads only its own shard.

`RecordDataset` is the second kind of dataset `data.load_dataset` returns (the first, `Dataset`,
holds every array in memory). It holds the test set in memory (every peer evaluates on all of it)
but not the training set: `read_train(indices)` reads just the records a peer's shard names (an
indexed read of a memory map), and a per-batch `train_transform` (augmentation, normalisation)
runs on each mini-batch with a generator the batch iterator derives from (seed, rank, epoch,
step), so runs stay reproducible, resume bit for bit and agree between transports.

Built in, from files on disk (nothing is ever downloaded)::

    "cifar10:root=DIR"           the CIFAR-10 binary distribution: DIR/data_batch_{1..5}.bin and
                                 DIR/test_batch.bin (or DIR/cifar-10-batches-bin/...), records of
                                 1 label byte + 3072 pixel bytes (3 x 32 x 32, channel-major);
                                 training batches get a 4-pixel zero-padded random crop and a random
                                 horizontal flip, every image the per-channel normalisation
                                 (options: augment=false)
    "wikitext2:root=DIR,bptt=35" WikiText-2 (word level): DIR/wiki.{train,valid,test}.tokens (or
                                 DIR/wikitext-2/...); every line's words plus <eos>, the vocabulary
                                 of the training text (the files already spell rare words <unk>;
                                 a valid/test word absent from train reads as <unk>); records are
                                 the consecutive bptt-token windows, the target of each token the
                                 next token; evaluation on split=test (or split=valid)

Each file read is a `DataFile` with the sha256 of its bytes (computed once, as it is loaded):
peers that split one dataset agree on every file's digest, naming a file that differs, and each
checkpoint records them, so that a run resumed on changed files is refused naming the file. A data
file must be a regular file (a directory, a FIFO or a device is named as such, never opened).

A bring-your-own function's ``(train, test)`` torch Datasets are read by `torch_datasets`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from ..utils import require_regular_file

__all__ = [
    "DataFile",
    "RecordDataset",
    "cifar10",
    "wikitext2",
    "cifar_augment",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
]

#: The most numbers one array of a generated dataset (``synthetic_logreg``, ``synthetic_images``)
#: may hold (2 GiB of float64): a spec asking for more is refused in one line before anything is
#: allocated, not left to fail with a MemoryError traceback. Here, a module both already use,
#: so that the two agree (datasets.py cannot be imported by synthetic_images.py: it imports it).
MAX_GENERATED_NUMBERS = 1 << 28

#: Per-channel mean and standard deviation of the CIFAR-10 training images (pixels in [0, 1]).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
_CIFAR_RECORD = 1 + 3 * 32 * 32
_CIFAR_ARCHIVE = (
    "the standard archive cifar-10-binary.tar.gz from "
    "https://www.cs.toronto.edu/~kriz/cifar.html unpacks into cifar-10-batches-bin/"
)
_WIKITEXT_ARCHIVE = (
    "the standard archive wikitext-2-v1.zip unpacks into wikitext-2/ with "
    "wiki.train.tokens, wiki.valid.tokens and wiki.test.tokens"
)


@dataclasses.dataclass(frozen=True)
class DataFile:
    """One file a dataset was read from: `name` is the same on every peer (the file's name in its
    folder), `path` where this peer read it, `sha256` the digest of its bytes."""

    name: str
    path: str
    sha256: str


def file_digest(path: Path) -> str:
    """The sha256 of the file's bytes (read in 1 MiB pieces: CIFAR-10's 180 MB take ~0.4 s)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _data_files(folder: Path, names) -> tuple:
    return tuple(DataFile(n, str(folder / n), file_digest(folder / n)) for n in names)


def _files_fingerprint(files, *extra: str) -> str:
    """The digest peers compare: every file's digest and what else shapes the records."""
    digest = hashlib.sha256(";".join(extra).encode())
    for f in files:
        digest.update(f"{f.name}:{f.sha256};".encode())
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True, eq=False)
class RecordDataset:
    """A dataset whose training records are read on demand (see the module docstring).

    ``read_train(indices)`` returns ``(x, y)`` tensors of those training records, untransformed;
    ``labels`` (optional) returns every training label (only for label-based partitions);
    ``train_transform(xb, generator)`` turns a batch of raw records into model inputs.
    """

    num_train: int
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    name: str
    read_train: Callable[[np.ndarray], tuple[torch.Tensor, torch.Tensor]]
    fingerprint: str  # what peers compare to know they read the same files
    labels: Optional[Callable[[], np.ndarray]] = None
    train_transform: Optional[Callable[[torch.Tensor, torch.Generator], torch.Tensor]] = None
    shared_test: bool = True
    #: The files read (`DataFile`s): their digests are what peers agree on and what a checkpoint
    #: records, so that a resumed run refuses data changed under the same spec, naming the file.
    files: tuple = ()
    #: The split the test arrays hold: "test", or "valid" (`wikitext2:split=valid`).
    eval_split: str = "test"
    #: Whether the training records are consecutive windows of one text (a language model's): a
    #: `contiguous` shard of them is batched as parallel streams (`batches.StreamBatches`).
    stream: bool = False

    @property
    def num_test(self) -> int:
        return len(self.y_test)

    def partition_labels(self, spec: str) -> np.ndarray:
        """What `data.partition` needs for `spec`: for a split that ignores labels (iid,
        contiguous) placeholders, so no record is read; else every training label."""
        head = spec.split(":", 1)[0].strip()
        if head in ("iid", "contiguous"):
            return np.zeros(self.num_train, dtype=np.int64)
        if self.labels is None:
            raise ValueError(
                f"dataset {self.name!r} has no per-record labels for partition "
                f"{spec!r} (a language model's targets are tokens); use iid or "
                "contiguous"
            )
        return self.labels()


def _find(root: str, spec: str, subdir: str, names: tuple[str, ...], archive: str) -> Path:
    """The folder under `root` (itself or root/subdir) holding every file of `names`; each must be
    a regular file (a directory, a FIFO or a device is named as such and never opened: a FIFO
    would block for good, /dev/zero never ends)."""
    base = Path(root).expanduser()
    for folder in (base, base / subdir):
        if all(os.path.lexists(folder / n) for n in names):
            break
    else:
        folder = base / subdir if (base / subdir).is_dir() else base
        missing = next(n for n in names if not os.path.lexists(folder / n))
        raise ValueError(
            f"dataset spec {spec!r}: {folder / missing} does not exist ({archive}; point root= at "
            "the folder that holds it)"
        )
    for n in names:
        require_regular_file(folder / n, f"dataset spec {spec!r}: {folder / n}")
    return folder


# ---- CIFAR-10 --------------------------------------------------------------------------------------


def _cifar_records(path: Path, spec: str) -> np.memmap:
    size = path.stat().st_size
    if size == 0 or size % _CIFAR_RECORD:
        raise ValueError(
            f"dataset spec {spec!r}: {path} holds {size} bytes, not a whole number of "
            f"{_CIFAR_RECORD}-byte CIFAR-10 records (a truncated download?)"
        )
    return np.memmap(path, dtype=np.uint8, mode="r", shape=(size // _CIFAR_RECORD, _CIFAR_RECORD))


def _normalise(x: torch.Tensor) -> torch.Tensor:
    """uint8 (or [0, 1] float) images -> per-channel standardised float32."""
    x = x.to(torch.float32) / 255.0 if x.dtype == torch.uint8 else x.to(torch.float32)
    mean = torch.tensor(CIFAR10_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD, device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std


def cifar_augment(
    x: torch.Tensor, generator: torch.Generator, *, padding: int = 4, flip: bool = True
) -> torch.Tensor:
    """The standard CIFAR training augmentation on a batch, as tensor ops: zero-pad `padding`
    pixels on each side, crop a random 32x32 (well, HxW) window per image, flip each image
    horizontally with probability 1/2; then normalise. Draws only from `generator` (CPU)."""
    n, c, h, w = x.shape
    if n == 0:
        return _normalise(x)
    padded = torch.nn.functional.pad(x.to(torch.float32), (padding,) * 4)
    dy = torch.randint(0, 2 * padding + 1, (n,), generator=generator).to(x.device)
    dx = torch.randint(0, 2 * padding + 1, (n,), generator=generator).to(x.device)
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
    batch = torch.arange(n, device=x.device)[:, None, None, None]
    channel = torch.arange(c, device=x.device)[None, :, None, None]
    out = padded[batch, channel, rows, cols]
    if flip:
        flips = (torch.rand(n, generator=generator) < 0.5).to(x.device)
        out = torch.where(flips[:, None, None, None], out.flip(-1), out)
    return _normalise(out.to(torch.uint8) if x.dtype == torch.uint8 else out)


def cifar10(spec: str, options: dict[str, Any]) -> RecordDataset:
    """``cifar10:root=DIR[,augment=false]`` (see the module docstring)."""
    names = tuple(f"data_batch_{i}.bin" for i in range(1, 6)) + ("test_batch.bin",)
    folder = _find(options["root"], spec, "cifar-10-batches-bin", names, _CIFAR_ARCHIVE)
    train = [_cifar_records(folder / n, spec) for n in names[:5]]
    test = _cifar_records(folder / names[5], spec)
    starts = np.cumsum([0] + [len(t) for t in train])

    def read_train(indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        indices = np.asarray(indices, dtype=np.int64)
        rows = np.empty((len(indices), _CIFAR_RECORD), dtype=np.uint8)
        which = np.searchsorted(starts, indices, side="right") - 1
        for f in np.unique(which):  # an indexed read of each file's memory map: these rows only
            mine = which == f
            rows[mine] = train[f][indices[mine] - starts[f]]
        return torch.from_numpy(rows[:, 1:].reshape(-1, 3, 32, 32).copy()), torch.from_numpy(
            rows[:, 0].astype(np.int64)
        )

    def labels() -> np.ndarray:
        return np.concatenate([np.asarray(t[:, 0], dtype=np.int64) for t in train])

    for name, records in zip(names, [*train, test]):
        _check_cifar_labels(folder / name, records, spec)
    raw = np.asarray(test)
    y_test = torch.from_numpy(raw[:, 0].astype(np.int64))
    x_test = _normalise(torch.from_numpy(raw[:, 1:].reshape(-1, 3, 32, 32).copy()))
    files = _data_files(folder, names)
    augment = options.get("augment", True)
    return RecordDataset(
        num_train=int(starts[-1]),
        x_test=x_test,
        y_test=y_test,
        num_classes=10,
        input_shape=(3, 32, 32),
        name=spec,
        read_train=read_train,
        fingerprint=_files_fingerprint(files, "cifar10"),
        labels=labels,
        train_transform=cifar_augment if augment else _drop_generator(_normalise),
        files=files,
    )


def _check_cifar_labels(path: Path, records: np.memmap, spec: str) -> None:
    """Every label byte of the file in 0..9 (the CIFAR-100 archive's go to 99), naming the file."""
    largest = int(np.max(records[:, 0]))
    if largest > 9:
        raise ValueError(
            f"dataset spec {spec!r}: {path} has label {largest}; CIFAR-10 labels are 0..9 (is "
            "this the CIFAR-100 archive?)"
        )


def _drop_generator(fn):
    return lambda x, generator: fn(x)


# ---- WikiText-2 ------------------------------------------------------------------------------------


def _words(path: Path, spec: str) -> list[str]:
    """Every line's words followed by <eos>, a blank line one <eos>: the stream of PyTorch's
    word-language-model example and torchtext's newline_eos, whose token counts (one <eos> per
    line, blank ones too) are those published with WikiText-2. A file of blank lines only is
    refused, naming it (its stream would be <eos> alone)."""
    try:
        with open(path, encoding="utf-8") as f:
            words = [w for line in f for w in line.split() + ["<eos>"]]
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"dataset spec {spec!r}: {path} is not UTF-8 text (byte {exc.start}: {exc.reason}); "
            "WikiText-2's token files are UTF-8: point root= at the unpacked wikitext-2 files"
        ) from None
    if words and all(w == "<eos>" for w in words):
        raise ValueError(
            f"dataset spec {spec!r}: {path} holds no word, only {len(words)} blank lines (a "
            "failed copy?); its stream would be <eos> alone"
        )
    return words


def _windows(tokens: torch.Tensor, bptt: int, indices) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.as_tensor(np.asarray(indices, dtype=np.int64)) * bptt
    offsets = starts[:, None] + torch.arange(bptt)
    return tokens[offsets], tokens[offsets + 1]


def wikitext2(spec: str, options: dict[str, Any]) -> RecordDataset:
    """``wikitext2:root=DIR[,bptt=35,split=test]`` (see the module docstring)."""
    bptt, split = options.get("bptt", 35), options.get("split", "test")
    if bptt < 1:
        raise ValueError(f"dataset spec {spec!r}: bptt must be >= 1")
    if split not in ("test", "valid"):
        raise ValueError(f"dataset spec {spec!r}: split must be test or valid, got {split!r}")
    names = ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")
    folder = _find(options["root"], spec, "wikitext-2", names, _WIKITEXT_ARCHIVE)
    train_words = _words(folder / names[0], spec)
    vocabulary = {"<unk>": 0}
    for word in train_words:
        vocabulary.setdefault(word, len(vocabulary))
    unk = vocabulary["<unk>"]

    def ids(words: list[str]) -> torch.Tensor:
        return torch.tensor([vocabulary.get(w, unk) for w in words], dtype=torch.int64)

    train = ids(train_words)
    test_path = folder / f"wiki.{split}.tokens"
    test_words = _words(test_path, spec)
    _check_vocabulary(test_path, test_words, vocabulary, spec)
    test = ids(test_words)
    n_train, n_test = (len(train) - 1) // bptt, (len(test) - 1) // bptt
    if n_train < 1 or n_test < 1:
        raise ValueError(
            f"dataset spec {spec!r}: the {'training' if n_train < 1 else split} text has fewer than "
            f"bptt + 1 = {bptt + 1} tokens; lower bptt"
        )
    x_test, y_test = _windows(test, bptt, np.arange(n_test))
    files = _data_files(folder, (names[0], test_path.name))
    return RecordDataset(
        num_train=n_train,
        x_test=x_test,
        y_test=y_test,
        num_classes=len(vocabulary),
        input_shape=(bptt,),
        name=spec,
        read_train=lambda idx: _windows(train, bptt, idx),
        fingerprint=_files_fingerprint(files, "wikitext2", f"bptt={bptt}", f"split={split}"),
        files=files,
        eval_split=split,
        stream=True,
    )


def _check_vocabulary(path: Path, words: list[str], vocabulary: dict, spec: str) -> None:
    """Refuse an evaluation text none of whose words is in the training vocabulary: it would read
    as all <unk> and <eos>, and its perplexity would measure nothing (another corpus's file?).
    WikiText-2's own valid and test texts have every word in it (rare words are spelled <unk>)."""
    spoken = [w for w in words if w != "<eos>"]
    if spoken and not any(w in vocabulary for w in spoken):
        raise ValueError(
            f"dataset spec {spec!r}: {path}: none of its {len(spoken)} words is in the "
            "training vocabulary (wiki.train.tokens), so every one would read as <unk> and its "
            "perplexity would measure nothing: is it a file of the same corpus?"
        )
