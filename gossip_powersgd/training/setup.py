"""Setting up one peer's run: the checked config, its data, model, algorithm and optimizer.

`build_run` does, on every peer, what happens before the first step of `trainer.train`: seed this
process (when it owns it), load this peer's data (the whole dataset and its shard, or under
`partition: local` only its own data) and check that every peer loaded the same shared data (a
digest, never the data), build and check the model, the algorithm and the optimizer, and run the
set-up hooks. `collectively` is how checks whose outcome may differ between peers (files, user code)
become the same one-line error on every peer.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from ..algorithms import make_algorithm
from ..comm.base import AgreementError
from ..launch import collectively
from ..utils import warn
from .devices import model_device, resolve_device  # noqa: F401 (resolve_device: re-exported)
from .config import (
    TrainConfig,
    agreement_text,
    config_from_dict,
    config_hash,
    hashed_config,
    resolve_topology,
    validate_config,
)
from .features import peer_statistics_private
from .hooks import HookList, SetupContext
from .validation import check_algorithm, warmup_steps

if TYPE_CHECKING:
    from ..comm.base import Comm


def make_optimizer(config: TrainConfig, params) -> torch.optim.Optimizer:
    """The local optimizer the config names, over `params`."""
    from .eager_optim import defer_compiler_import

    classes = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    if config.optimizer in classes:  # no import of torch's compiler (eager_optim.py)
        defer_compiler_import(classes[config.optimizer])
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            params,
            lr=config.lr,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
            nesterov=config.nesterov,
        )
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    raise ValueError(f"unknown optimizer {config.optimizer!r}; valid: sgd, adam, adamw")


def _process_owned(comm: Comm) -> bool:
    """Whether this peer has the process to itself (MPI), so that the global RNGs are its own."""
    from ..comm.local import LocalCommunicator

    comm = getattr(comm, "transport", comm)  # a membership's communicator wraps its transport
    return not isinstance(comm, LocalCommunicator)


@dataclasses.dataclass
class PeerRun:
    """What one peer trains with: built once by `build_run`, fixed for the run."""

    model: torch.nn.Module
    averaged: torch.nn.Module  # evaluated with the peers' average; never trained
    optimizer: torch.optim.Optimizer
    algorithm: Any
    batches: Any
    acts_on: str
    x_test: torch.Tensor
    y_test: torch.Tensor
    histogram: List[int]
    num_classes: int
    steps_per_epoch: int
    num_parameters: int
    parameter_bytes: int
    owns_process: bool
    header_args: Dict[str, Any]  # what every checkpoint header of this run says
    eval_split: str = "test"  # the data evaluated on: "test", or "valid" (wikitext2:split=valid)
    own_test: bool = False  # partition: local with each peer's own test set (its private data)


def checked_config(comm: Comm, config, resume: bool) -> TrainConfig:
    """The config as a validated `TrainConfig` that fits the communicator and every peer agrees on."""
    if isinstance(config, dict):
        config = config_from_dict(config)
    validate_config(config, deep=False)
    wanted = resolve_topology(config, world_size=comm.size)
    if wanted.size != comm.size or wanted.fingerprint != comm.topology.fingerprint:
        raise ValueError(
            f"config topology {config.topology!r} ({wanted.size} peers) is not the "
            f"communicator's ({comm.size} peers)"
        )
    # the algorithm's own config-time checks (exact gossip's stable γ), on every rank before any
    # peer starts a collective the others would never join
    check_algorithm(config, wanted)
    comm.check_agreement("config", agreement_text(config))
    if resume and config.out_dir is None:
        raise ValueError("resume needs a run directory: set out_dir")
    return config


def build_run(
    comm: Comm,
    config: TrainConfig,
    hooks: HookList,
    log=None,
    resume: bool = False,
    origin: Optional[Dict[str, Any]] = None,
) -> PeerRun:
    """Seed, load this peer's shard, build the model, algorithm and optimizer; run setup hooks
    (`resume`: the run continues from a checkpoint, `SetupContext.resuming`; `origin`: the run's
    provenance, `SetupContext.provenance`). `log` (a `progress.SetupLog`) is told as each phase
    ends."""
    if log is None:
        from .progress import SetupLog

        log = SetupLog(comm.rank, quiet=True)
    from .data import LOCAL_PARTITION
    from .models import count_parameters

    rank, size = comm.rank, comm.size
    device = model_device(config.device, comm)
    owns_process = _process_owned(comm)
    if owns_process:
        _seed_process(config.seed, rank)
    dataset, num_train = _load_data(comm, config)
    x_train, y_train, histogram = _shard(comm, config, dataset)
    log.done(f"data {config.dataset} loaded, partition {config.partition}")
    model = collectively(comm, _checked_model, config, dataset, x_train, rank)
    x_train, y_train = x_train.to(device), y_train.to(device)
    batches = _make_batches(config, dataset, model, x_train, y_train, rank)
    steps_per_epoch = max(1, -(-num_train // (size * config.batch_size)))

    model = model.to(device)
    num_parameters = count_parameters(model)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    algorithm = make_algorithm(config.algorithm_spec, model.named_parameters(), comm)
    optimizer = make_optimizer(config, model.parameters())
    context = SetupContext(
        config=config,
        comm=comm,
        device=device,
        model=model,
        optimizer=optimizer,
        batches=batches,
        algorithm=algorithm,
        steps_per_epoch=steps_per_epoch,
        train_size=num_train,
        resuming=bool(resume),
        provenance=origin,
        build=_builder(config, comm),
    )
    log.done(f"model {config.model} ({num_parameters} parameters) and {config.algorithm} built")
    hooks.setup(context)
    context.batches.transform = dataset.train_transform  # also on batches a hook replaced (DP)
    if getattr(batches, "carrier", None) is not None and context.batches is not batches:
        batches.carrier.carry_state = False  # a hook's batches (DP's Poisson ones) are no streams
    acts_on = _acts_on(context.algorithm, config)
    _check_schedule(config, rank, size, num_train, steps_per_epoch, acts_on, context.batches)
    header_args = _header_args(comm, config, dataset)
    return PeerRun(
        model=context.model,
        averaged=copy.deepcopy(context.model),
        optimizer=context.optimizer,
        algorithm=context.algorithm,
        batches=context.batches,
        acts_on=acts_on,
        x_test=dataset.x_test.to(device),
        y_test=dataset.y_test.to(device),
        histogram=histogram,
        num_classes=dataset.num_classes,
        steps_per_epoch=steps_per_epoch,
        num_parameters=num_parameters,
        parameter_bytes=parameter_bytes,
        owns_process=owns_process,
        header_args=header_args,
        eval_split=getattr(dataset, "eval_split", "test"),
        own_test=config.partition == LOCAL_PARTITION and not dataset.shared_test,
    )


def _seed_process(seed: int, rank: int) -> None:
    """Seed the global RNGs (torch, numpy, random) of a process this peer owns, from the run's
    seed and its rank."""
    seed = int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def _load_data(comm: Comm, config: TrainConfig) -> Tuple[Any, int]:
    """(this peer's dataset, the number of training samples an epoch is sized by), checked to be
    the same shared data on every peer (collective)."""
    from .data import LOCAL_PARTITION, agree_local_dataset, load_dataset, load_peer_dataset

    rank, size = comm.rank, comm.size
    if config.partition == LOCAL_PARTITION:  # the data exists only on its peer
        dataset = collectively(comm, load_peer_dataset, config.dataset, rank, size, config.seed)
        # The shard sizes stay private unless released: the epoch is then sized by the declared
        # public total (validate_config requires one).
        share = not peer_statistics_private(config)
        dataset, num_train = agree_local_dataset(comm, dataset, share_size=share)
        if not share:
            num_train = int(config.public_train_size)
            # Each peer checks its own shard against the declared total; the outcome may differ
            # between peers, so the refusal is collective (every rank raises the same line).
            collectively(comm, _check_declared_total, dataset.num_train, num_train)
        _check_same_dataset(comm, config, dataset, ("test",) if dataset.shared_test else ())
    else:
        dataset = collectively(comm, load_dataset, config.dataset, config.seed)
        num_train = dataset.num_train
        _check_same_dataset(comm, config, dataset, _SHARED_DATA)
    return dataset, num_train


def _check_declared_total(shard: int, total: int) -> None:
    """Refuse a declared `public_train_size` below this peer's own shard size: it declares the
    peers' total, so it is at least every shard's size, and DP's default delta (at most
    1 / (10 x the total)) relies on it to stay below 1 / (a shard's size). The error names neither
    the size nor the peer: they are private."""
    if int(shard) > int(total):
        raise ValueError(
            f"bad value for 'public_train_size': {int(total)} (a peer's shard holds more "
            "training samples than that, and it declares the total of all the peers' shards: "
            "set it to that total; the shard sizes are private, so no size or peer is named)"
        )


def _shard(
    comm: Comm, config: TrainConfig, dataset
) -> Tuple[torch.Tensor, torch.Tensor, List[int]]:
    """(inputs, targets, label histogram) of this peer's shard (collective); a language model's
    targets are tokens: no label histogram (it would be vocabulary-wide)."""
    from .data import label_histogram, peer_shard

    x_train, y_train = collectively(
        comm, peer_shard, dataset, comm.rank, comm.size, config.partition, config.seed
    )
    histogram = label_histogram(y_train, dataset.num_classes) if y_train.ndim == 1 else []
    return x_train, y_train, histogram


def _acts_on(algorithm, config: TrainConfig) -> str:
    """What the algorithm (as the set-up hooks left it) acts on: "parameters" or "gradients"."""
    acts_on = getattr(algorithm, "acts_on", "parameters")
    if acts_on not in ("parameters", "gradients"):
        raise ValueError(
            f"algorithm {config.algorithm!r} has acts_on={acts_on!r}; "
            "expected 'parameters' or 'gradients'"
        )
    return acts_on


def _header_args(comm: Comm, config: TrainConfig, dataset) -> Dict[str, Any]:
    """What every checkpoint header of this run says: who wrote it, in which run, on which data."""
    from .data import content_digests

    return dict(
        rank=comm.rank,
        world_size=comm.size,
        topology=comm.topology,
        topology_spec=config.topology,
        config_hash=config_hash(config),
        config_json=json.dumps(hashed_config(config), sort_keys=True),
        data=content_digests(dataset),
    )


def _builder(config: TrainConfig, comm: Comm) -> Callable[[torch.nn.Module], tuple]:
    """What `SetupContext.replace_model` calls: the optimizer and the algorithm built on a model's
    parameters, for a hook that swapped its layers (DP's model check)."""

    def build(model: torch.nn.Module) -> tuple:
        optimizer = make_optimizer(config, model.parameters())
        return optimizer, make_algorithm(config.algorithm_spec, model.named_parameters(), comm)

    return build


def _make_batches(config: TrainConfig, dataset, model, x_train, y_train, rank: int):
    """This peer's batches: a language model that carries its hidden state (`carry_state`) on a
    `contiguous` shard of consecutive windows gets them as parallel streams (truncated BPTT,
    `StreamBatches`); anything else shuffled mini-batches."""
    from .batches import Batches, StreamBatches

    if (
        getattr(dataset, "stream", False)
        and config.partition == "contiguous"
        and hasattr(model, "carry_state")
    ):
        model.carry_state = True
        return StreamBatches(
            x_train, y_train, config.batch_size, seed=config.seed, rank=rank, carrier=model
        )
    batches = Batches(x_train, y_train, config.batch_size, seed=config.seed, rank=rank)
    batches.transform = dataset.train_transform
    return batches


def _check_schedule(
    config: TrainConfig,
    rank: int,
    size: int,
    num_train: int,
    steps_per_epoch: int,
    acts_on: str,
    batches,
) -> None:
    """Refuse a `local_steps` that leaves the run without a communication round, or a warm-up of
    fewer than 2 steps (`warmup_steps`); warn (rank 0, one line each) about an `eval_every`,
    `checkpoint_every` or `batch_size` beyond what the run can use, naming the value it takes
    instead. The same outcome on every peer (public values).
    The batch_size warning is for fixed-size batches only: Poisson-sampled ones (DP, no
    ``batch_size`` attribute) draw each record at a rate and divide the sum by batch_size."""
    if acts_on == "gradients" and config.local_steps != 1:
        raise ValueError(
            f"local_steps {config.local_steps} needs an algorithm that mixes the "
            f"parameters; {config.algorithm!r} averages every step's gradients (use "
            "allreduce for local SGD, or set local_steps to 1)"
        )
    warmup_steps(config.warmup_epochs, steps_per_epoch)
    steps = config.epochs * steps_per_epoch
    if config.local_steps > steps:
        raise ValueError(
            f"local_steps {config.local_steps} exceeds the run's {steps} optimizer steps "
            f"({config.epochs} epochs of {steps_per_epoch}): the peers would never communicate; "
            f"set local_steps to at most {steps}"
        )
    if rank != 0:
        return
    for key, what in (("eval_every", "evaluates"), ("checkpoint_every", "writes its checkpoint")):
        value = getattr(config, key)
        if value > config.epochs and (key == "eval_every" or config.out_dir is not None):
            warn(
                f"{key} {value} exceeds epochs ({config.epochs}): the run {what} at its end "
                f"only (as with {key}: {config.epochs})"
            )
    mean_shard = -(-num_train // size)
    fixed_size = getattr(batches, "batch_size", None) is not None
    if fixed_size and config.batch_size > mean_shard:
        warn(
            f"batch_size {config.batch_size} exceeds the peers' shards ({mean_shard} training "
            "samples each on average): each step takes a peer's whole shard, an effective "
            f"batch size of about {mean_shard}"
        )


#: Which of the dataset's arrays every peer must hold identically. Every peer loads the whole
#: dataset and keeps its own shard, so all of it; under `partition: local` each peer loads only its
#: own data and only a shared test set is compared.
_SHARED_DATA = ("train", "test")


def _check_same_dataset(comm: Comm, config: TrainConfig, dataset, parts) -> None:
    """Fail on every peer, naming the ranks, unless all loaded the same data of `parts` (a digest
    is sent, never the data). Collective: every peer calls it, also with no shared part (a peer's
    own test data under `partition: local`), when the peers only agree that nothing is shared."""
    from .data import dataset_digest

    if not parts:
        comm.check_agreement("dataset (no shared part)", "local")
        return
    # A file dataset: each file agreed by its name, so that a disagreement names the file (ranks
    # reading different copies, e.g. root=~/c under different homes). The number of files is part
    # of the spec, the same on every rank.
    for f in getattr(dataset, "files", ()):
        try:
            comm.check_agreement(f"dataset file {f.name}", f.sha256)
        except AgreementError as exc:
            raise AgreementError(
                f"{exc}: the ranks read different files under the same spec (this rank read "
                f"{f.path}); partition {config.partition!r} splits one dataset, so every rank "
                "must read the same copy"
            ) from None
    try:
        comm.check_agreement("dataset", dataset_digest(dataset, parts))
    except AgreementError as exc:
        raise AgreementError(
            f"{exc} ({config.dataset!r} returned different data on different "
            "ranks, usually unseeded randomness: draw from a generator seeded "
            "with its seed argument, e.g. numpy.random.default_rng(seed))"
        ) from None


def _checked_model(config: TrainConfig, dataset, x_train: torch.Tensor, rank: int):
    """The config's model, checked against this peer's data before anything trains: it runs on
    the dataset's inputs and, if this peer's last batch holds one sample, trains on such a batch."""
    from .models import build_model, check_model_fits, check_single_sample_batch, has_batch_norm
    from .zoo import seed_dropout_per_peer

    model = build_model(config.model, dataset.input_shape, dataset.num_classes, config.seed)
    seed_dropout_per_peer(model, config.seed, rank)  # the same weights, each peer its own masks
    check_model_fits(
        model,
        config.model,
        dataset.x_test[:2],
        dataset.num_classes,
        target_shape=tuple(dataset.y_test.shape[1:]),
    )
    if len(x_train) % config.batch_size == 1 and has_batch_norm(model):
        x_one = x_train[:1]
        if dataset.train_transform is not None:
            x_one = dataset.train_transform(x_one, torch.Generator().manual_seed(0))
        check_single_sample_batch(
            model,
            config.model,
            x_one,
            rank=rank,
            # a private shard size is named nowhere: this error reaches every peer
            shard_size=None if peer_statistics_private(config) else len(x_train),
            batch_size=config.batch_size,
        )
    return model


__all__ = [
    "collectively",
    "resolve_device",
    "make_optimizer",
    "checked_config",
    "build_run",
    "PeerRun",
]
