"""Validation of a `TrainConfig`: every value checked before anything is built, each problem one
line naming the key, its value and what is wanted (`validate_config`); `deep` also builds the data
and the model exactly as training will (`validate_specs`). `config.py` re-exports these names
(this module imports nothing of it: a config arrives as an argument)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional

from ..comm.transports import TRANSPORTS
from ..utils import one_line
from .features import features, peer_statistics_private

if TYPE_CHECKING:
    from topologies import AnyTopology

#: A `config.TrainConfig` (every key an attribute). The class is not imported, not even for type
#: checking: config.py imports this module to re-export its names, and validation reads nothing
#: of the class but the attributes (tests/project/test_imports.py keeps the two modules acyclic).
TrainConfig = Any

OPTIMIZERS = ("sgd", "adam", "adamw")


def __getattr__(name: str) -> Any:
    """`BACKENDS`: the registered transports' names (`comm.transports.TRANSPORTS`)."""
    if name == "BACKENDS":
        return TRANSPORTS.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SCHEDULES = ("constant", "step", "cosine")
_FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max, without importing torch
_SEED_LIMIT = 2**64  # torch.Generator.manual_seed's range
#: Integer counts of a run (steps, epochs, samples), and their limit: beyond 2**53 a step number
#: is no longer exact as a float64, and no run comes near it (2**53 steps at a million a second
#: take 285 years).
_COUNTS = (
    "epochs",
    "batch_size",
    "local_steps",
    "eval_every",
    "log_every",
    "checkpoint_every",
    "threads",
)
_COUNT_LIMIT = 2**53
#: The range of comm_timeout, in seconds (see validate_config).
MIN_COMM_TIMEOUT, MAX_COMM_TIMEOUT = 1.0, 7 * 24 * 3600.0


def _check(condition: bool, key: str, value: Any, requirement: str) -> None:
    if not condition:
        raise ValueError(f"bad value for {key!r}: {value!r} ({requirement})")


def warmup_steps(warmup_epochs: float, steps_per_epoch: int) -> int:
    """The warm-up's length in steps: `warmup_epochs` at `steps_per_epoch`, rounded (the trainer's
    `learning_rate` and LiRA's reference models, `privacy.lira.schedule_factor`, both use it). Step
    k of a W-step warm-up runs at lr*(k+1)/W, so a warm-up of one step runs at the full rate: a
    positive `warmup_epochs` that rounds to fewer than 2 steps is refused, not silently ignored."""
    steps = int(round(warmup_epochs * steps_per_epoch))
    _check(
        warmup_epochs == 0 or steps >= 2,
        "warmup_epochs",
        warmup_epochs,
        f"{steps} step(s) at {steps_per_epoch} steps per epoch, and a warm-up needs at least 2: "
        f"set it to at least {2 / steps_per_epoch:g}, or 0 for none",
    )
    return steps


def resolve_topology(config: TrainConfig, world_size: Optional[int] = None):
    """The `Topology` of a config: `peers` (or the launcher's world size) fills a spec without a size."""
    import topologies

    n = config.peers
    if n is None and not _has_size(config.topology):
        n = world_size
    try:
        return topologies.parse(config.topology, n=n)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"bad value for 'topology': {one_line(exc)}") from None


def _check_directed(c: TrainConfig, num_peers: Optional[int]) -> None:
    """Refuse a directed topology (or schedule) for an algorithm that does not declare `directed`;
    where the peers are known, the algorithm's own config-time checks too (`check_algorithm`)."""
    import topologies

    from ..algorithms import check_directed, parse_algorithm

    n = None if _has_size(c.topology) else (num_peers if num_peers is not None else 4)
    topology = topologies.parse(c.topology, n=n)
    try:
        check_directed(parse_algorithm(c.algorithm), topology, c.topology)
    except ValueError as exc:
        raise ValueError(f"bad value for 'algorithm': {one_line(exc)}") from None
    if num_peers is not None:  # else the launcher's world sizes it: checked at set-up
        check_algorithm(c, topology)


def check_algorithm(c: TrainConfig, topology: AnyTopology) -> None:
    """The algorithm's own config-time checks of its spec's values on the run's topology (an
    option out of range, a γ outside the topology's stable range, a compressor missing), a
    one-line ValueError naming 'algorithm' and the spec: "rank must be >= 1" alone, printed by
    every process of a launch, would read as the process's rank."""
    from ..algorithms import check_config

    try:
        check_config(c.algorithm_spec, topology)
    except ValueError as exc:
        raise ValueError(
            f"bad value for 'algorithm': algorithm spec {c.algorithm!r}: {one_line(exc)}"
        ) from None


def validate_config(config: TrainConfig, deep: bool = True) -> None:
    """Raise a one-line ValueError for the first bad value.

    `deep` also builds what the specs name, exactly as training will (the dataset, the partition,
    the model; the algorithm spec and the topology are always checked).
    """
    c = config
    c.check_types()  # values set in code rather than from YAML
    # in this order: the first bad value is the one an error names
    _check_choices_and_optimizer(c)
    _check_schedule_and_counts(c)
    _check_run_settings(c)
    _check_algorithm(c)
    num_peers = _topology_peers(c)
    _check_directed(c, num_peers)
    _check_public_train_size(c)
    for feature in features():  # differential privacy, observers, loggers, user hooks, ...
        feature.validate(c)
    if deep:
        validate_specs(c, num_peers)


def _check_choices_and_optimizer(c: TrainConfig) -> None:
    """The names chosen from a list (optimizer, schedule, backend) and the optimizer's values."""
    _check(c.optimizer in OPTIMIZERS, "optimizer", c.optimizer, f"valid: {', '.join(OPTIMIZERS)}")
    _check(c.schedule in SCHEDULES, "schedule", c.schedule, f"valid: {', '.join(SCHEDULES)}")
    _check(c.backend in TRANSPORTS, "backend", c.backend, f"valid: {', '.join(TRANSPORTS.names())}")
    # models train in float32: a larger lr cannot even be applied (torch raises an overflow error)
    _check(
        math.isfinite(c.lr) and 0 < c.lr <= _FLOAT32_MAX,
        "lr",
        c.lr,
        f"must be > 0 and at most {_FLOAT32_MAX:.4g} (float32)",
    )
    _check(0 <= c.momentum < 1, "momentum", c.momentum, "must be in [0, 1)")
    _check(
        c.momentum == 0 or c.optimizer == "sgd",
        "momentum",
        c.momentum,
        f"momentum is for sgd only; {c.optimizer} has its own betas, set momentum to 0",
    )
    _check(
        not c.nesterov or (c.optimizer == "sgd" and c.momentum > 0),
        "nesterov",
        c.nesterov,
        "needs optimizer sgd with momentum > 0",
    )
    _check(
        math.isfinite(c.weight_decay) and c.weight_decay >= 0,
        "weight_decay",
        c.weight_decay,
        "must be >= 0",
    )


def _check_schedule_and_counts(c: TrainConfig) -> None:
    """The run's counts (exact in float64), clipping, its length, its learning-rate schedule and how
    often it evaluates, logs and checkpoints."""
    for key in _COUNTS:  # step and epoch numbers stay exact in float64 (JSON readers, trackers)
        value = getattr(c, key)
        _check(
            value <= _COUNT_LIMIT,
            key,
            value,
            "at most 2**53: no run reaches it",
        )
    _check(
        c.max_grad_norm is None or (math.isfinite(c.max_grad_norm) and c.max_grad_norm > 0),
        "max_grad_norm",
        c.max_grad_norm,
        "must be > 0 and finite, or null for no clipping",
    )
    _check(c.batch_size >= 1, "batch_size", c.batch_size, "must be >= 1")
    _check(
        c.local_steps >= 1,
        "local_steps",
        c.local_steps,
        "must be >= 1 (optimizer steps per communication round)",
    )
    _check(c.epochs >= 1, "epochs", c.epochs, "must be >= 1")
    _check(
        0 <= c.warmup_epochs <= c.epochs,
        "warmup_epochs",
        c.warmup_epochs,
        f"must be in [0, epochs={c.epochs}]",
    )
    _check(0 < c.decay <= 1, "decay", c.decay, "must be in (0, 1]")
    _check(
        all(0 < m <= c.epochs for m in c.milestones) and list(c.milestones) == sorted(c.milestones),
        "milestones",
        c.milestones,
        f"must be increasing epochs in (0, {c.epochs}]",
    )
    _check(
        c.schedule == "step" or not c.milestones,
        "milestones",
        c.milestones,
        "milestones are for schedule: step",
    )
    # The trainer's learning_rate follows the warm-up alone until it ends: the decay of a milestone
    # inside it would come at the warm-up's end, not at the epoch it names.
    early = [m for m in c.milestones if m < c.warmup_epochs]
    if early:
        _check(
            False,
            "milestones",
            c.milestones,
            f"milestone {early[0]:g} falls inside the warm-up, which ends at epoch "
            f"{c.warmup_epochs:g} (warmup_epochs), and would only take effect then: move it to "
            f"{c.warmup_epochs:g} or later, or shorten warmup_epochs",
        )
    _check(
        c.schedule == "step" or c.decay == type(c).decay,  # the default: not set
        "decay",
        c.decay,
        "decay is for schedule: step",
    )
    _check(c.eval_every >= 1, "eval_every", c.eval_every, "must be >= 1 (epochs)")
    _check(c.log_every >= 0, "log_every", c.log_every, "must be >= 0 (steps; 0 = off)")
    _check(
        c.checkpoint_every >= 0, "checkpoint_every", c.checkpoint_every, "must be >= 0 (0 = off)"
    )


def _check_run_settings(c: TrainConfig) -> None:
    """Where and how the run runs: seed, peers, comm_timeout, threads, device, out_dir and the
    declared training-set size."""
    # torch's generators take seeds below 2**64; a larger one would fail inside the model's set-up
    _check(0 <= c.seed < _SEED_LIMIT, "seed", c.seed, "must be in [0, 2**64)")
    _check(c.peers is None or c.peers >= 1, "peers", c.peers, "must be >= 1 or null")
    # The set-up of a launched run waits comm_timeout for every process to connect to the
    # rendezvous: below a second that fails on an ordinary start (torch then reports only its
    # socket's "timed out after 0ms"); beyond a week it is no bound at all, and far beyond,
    # Python's waits overflow (threading.TIMEOUT_MAX).
    _check(
        math.isfinite(c.comm_timeout) and MIN_COMM_TIMEOUT <= c.comm_timeout <= MAX_COMM_TIMEOUT,
        "comm_timeout",
        c.comm_timeout,
        f"must be in [{MIN_COMM_TIMEOUT:g}, {MAX_COMM_TIMEOUT:g}] seconds (1 s to a week)",
    )
    _check(c.threads >= 1, "threads", c.threads, "must be >= 1")
    _check(
        c.device.strip() != "cuda:",  # the index left out (--set device=cuda: is this text)
        "device",
        c.device,
        "no GPU index after 'cuda:': write cuda (the peers spread over the GPUs), cuda:K "
        "(K = 0, 1, ...) or auto",
    )
    _check(
        c.device in ("auto", "cpu", "cuda")
        or (c.device.startswith("cuda:") and c.device[5:].isdigit() and c.device[5:].isascii()),
        "device",
        c.device,
        "valid: cpu, cuda, cuda:K (K = 0, 1, ...: a GPU's index), auto",
    )
    _check(c.out_dir is None or c.out_dir.strip() != "", "out_dir", c.out_dir, "must not be empty")
    _check(
        c.out_dir is None or c.out_dir.isprintable(),
        "out_dir",
        c.out_dir,
        "a line break or control character in a directory name is surely a slip; name it on one "
        "line",
    )
    _check(
        c.public_train_size is None or c.public_train_size >= 1,
        "public_train_size",
        c.public_train_size,
        "must be >= 1 (training samples of all peers) or null",
    )


def _check_algorithm(c: TrainConfig) -> None:
    """The algorithm spec, a one-line ValueError naming 'algorithm' if it does not parse."""
    from ..algorithms import parse_algorithm

    try:
        parse_algorithm(c.algorithm)  # the one parse: `TrainConfig.algorithm_spec` reads it after
    except ValueError as exc:
        raise ValueError(f"bad value for 'algorithm': {one_line(exc)}") from None


def _topology_peers(c: TrainConfig) -> Optional[int]:
    """The number of peers the topology (or `peers`) gives, None where the launcher's world sizes it;
    a one-line ValueError for a bad topology or a `peers` that contradicts it."""
    import topologies

    if _has_size(c.topology):
        num_peers = topologies.parse(c.topology).size
        _check(
            c.peers is None or c.peers == num_peers,
            "peers",
            c.peers,
            f"topology {c.topology!r} has {num_peers} peers",
        )
    elif c.peers is not None:
        num_peers = resolve_topology(c).size
    else:
        num_peers = None  # "ring" under mpiexec or torchrun: sized by the world at launch
        try:
            topologies.parse(c.topology, n=4)  # the name and its options, at some size
        except ValueError as exc:
            raise ValueError(f"bad value for 'topology': {one_line(exc)}") from None
        _check(
            not TRANSPORTS.get(c.backend).in_process,
            "topology",
            c.topology,
            "give its size, e.g. ring:8, or set peers (the local backend cannot guess it)",
        )
    return num_peers


def _check_public_train_size(c: TrainConfig) -> None:
    """`public_train_size` is for `partition: local`, and needed there while the shard sizes are
    private (nothing else can size an epoch)."""
    total = c.public_train_size
    if total is not None and c.partition != "local":
        raise ValueError(
            f"bad value for 'public_train_size': {total!r} (it is for partition: "
            "local; other partitions split a dataset every peer loads, whose size is "
            "public)"
        )
    if total is None and c.partition == "local" and peer_statistics_private(c):
        raise ValueError(
            "bad value for 'public_train_size': None (partition: local needs the "
            "total number of training samples declared public to size an epoch: set "
            "public_train_size: N, or release_peer_statistics: true to let the peers "
            "all-reduce their shard sizes)"
        )


def _has_size(spec: str) -> bool:
    import topologies

    try:
        topologies.parse(spec)
        return True
    except (ValueError, TypeError):
        return False


def validate_specs(config: TrainConfig, num_peers: Optional[int]) -> None:
    """Build the dataset (cached, so training reuses it), the partition and the model."""
    from .data import LOCAL_PARTITION, load_dataset, partition
    from .models import build_model, check_model_fits

    if config.partition == LOCAL_PARTITION:
        # Each peer's data exists only on that peer: it is loaded, checked and agreed at start-up.
        return
    try:
        dataset = load_dataset(config.dataset, config.seed)
    except ValueError as exc:
        raise ValueError(f"bad value for 'dataset': {one_line(exc)}") from None
    if num_peers is not None:
        try:
            partition(
                dataset.partition_labels(config.partition), num_peers, config.partition, config.seed
            )
        except ValueError as exc:
            raise ValueError(f"bad value for 'partition': {one_line(exc)}") from None
    else:
        try:
            partition(dataset.partition_labels(config.partition), 1, config.partition, config.seed)
        except ValueError as exc:
            raise ValueError(f"bad value for 'partition': {one_line(exc)}") from None
    try:
        model = build_model(config.model, dataset.input_shape, dataset.num_classes, config.seed)
        check_model_fits(
            model,
            config.model,
            dataset.x_test[:2],
            dataset.num_classes,
            target_shape=tuple(dataset.y_test.shape[1:]),
        )
    except ValueError as exc:
        raise ValueError(f"bad value for 'model': {one_line(exc)}") from None


__all__ = ["validate_config", "validate_specs", "resolve_topology"]
