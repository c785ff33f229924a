"""`TrainConfig`: every setting of a decentralized training run, and `load_config` for YAML files.

A config file is a flat YAML mapping of the keys below; anything not given takes its default.
`load_config(path, ["lr=0.05", "algorithm=exact"])` applies command-line overrides (each value is
parsed as YAML, so `milestones=[5,8]`, `peers=null` and `quiet=true` work, except that a string
key takes the text as typed: `out_dir=2024-01-01` is a directory, not a date) and validates the
result. YAML is loaded safely (plain data only), and a duplicate key, an alias bomb or a file far
larger than a config is refused (`yaml_loader.py`). Validation: an unknown key or a bad value
raises a one-line `ValueError` that lists the valid keys or values.

Some keys only say *how* a run is executed, not *what* it computes (`BACKEND_KEYS`); peers need not
agree on them and a checkpoint may be resumed with other values. `RUN_KEYS` (where the run is
written, how often it is checkpointed) and `RECORDING_KEYS` (which messages are recorded) are
likewise left out of the checkpoint's config hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import yaml

from ..utils import one_line
from .yaml_loader import strict_yaml_load

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "step", "cosine")
BACKENDS = ("mpi", "local", "torch")
_FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max, without importing torch
_SEED_LIMIT = 2 ** 64  # torch.Generator.manual_seed's range


@dataclasses.dataclass
class TrainConfig:
    """One training run. Each field's comment is its documentation (`describe_keys()` prints them)."""

    #: Gossip graph, as `topologies.parse` spells it: "ring:8", "torus:4x4", "exponential:16", ...
    #: A spec without a size ("ring") takes `peers` (local backend) or the launcher's world size
    #: (mpi and torch backends).
    topology: str = "ring:8"
    #: Algorithm, as `make_algorithm` spells it: "powergossip:rank=1", "exact", "powersgd:rank=2", ...
    algorithm: str = "powergossip:rank=1"
    #: Dataset spec for `load_dataset`: "mnist1d", "synthetic_logreg:d=20,classes=4", "pkg.mod:fn".
    dataset: str = "mnist1d"
    #: How the training set is split among peers: "iid", "dirichlet:<alpha>", "shards:<k>", or
    #: "local": a bring-your-own dataset function called with rank and num_peers returns only that
    #: peer's data (its shard and its own test set, or None for the shared one; see data.py).
    partition: str = "iid"
    #: Model spec for `build_model`: "logreg", "mlp:100,100", "cnn1d", "cnn1d:channels=32", "pkg.mod:fn".
    model: str = "cnn1d"
    #: Local optimizer: sgd | adam | adamw (torch.optim, default betas/eps).
    optimizer: str = "sgd"
    #: Peak learning rate (reached after the warm-up).
    lr: float = 0.1
    #: SGD momentum (0 = plain SGD); must be 0 for adam/adamw.
    momentum: float = 0.0
    #: Nesterov momentum (sgd with momentum > 0 only).
    nesterov: bool = False
    #: Weight decay (L2 for sgd/adam, decoupled for adamw).
    weight_decay: float = 0.0
    #: Linear warm-up from lr/(warm-up steps) to lr over this many epochs (may be fractional; 0 = none).
    warmup_epochs: float = 0.0
    #: Learning-rate schedule after the warm-up, applied every step: constant | step | cosine (to 0).
    schedule: str = "constant"
    #: `step` schedule: epochs (may be fractional) at which the learning rate is multiplied by `decay`.
    milestones: List[float] = dataclasses.field(default_factory=list)
    #: `step` schedule: the factor applied at each milestone, in (0, 1].
    decay: float = 0.1
    #: Mini-batch size of each peer.
    batch_size: int = 32
    #: Number of epochs. An epoch is ceil(training samples / (peers x batch_size)) steps, the same
    #: on every peer; a peer whose shard runs out starts its next pass over its shard.
    epochs: int = 10
    #: Evaluate (accuracies, consensus distance, averaged model) every this many epochs, and at the end.
    eval_every: int = 1
    #: Also record the training loss and consensus distance every this many steps (0 = never).
    log_every: int = 0
    #: Seed of everything: data generation, partition, model init (identical on every peer) and the
    #: per-peer batch order (which also depends on the rank).
    seed: int = 0
    #: Run directory (config.yaml, metrics/, checkpoints/, summary.*). None: runs/<config name> from
    #: the command line; no files at all when `train` is called directly.
    out_dir: Optional[str] = None
    #: Write a checkpoint every this many epochs, and at the end (0 = never).
    checkpoint_every: int = 1
    #: Transport: mpi (one peer per MPI rank, launch with mpiexec) | local (one thread per peer) |
    #: torch (torch.distributed, one peer per process: torchrun --nproc-per-node N, gloo on the
    #: CPU, NCCL with device cuda).
    backend: str = "local"
    #: Number of peers (local backend); None = the topology's size. Must match the topology.
    peers: Optional[int] = None
    #: Seconds a peer waits for a neighbour or a collective before it fails naming that peer
    #: (from 1 s, the least in which a process group's set-up connects every peer, to a week).
    comm_timeout: float = 120.0
    #: No progress bar and no per-evaluation lines (the final summary is still printed).
    quiet: bool = False
    #: Torch intra-op threads per process (1 keeps runs bit-reproducible across backends).
    threads: int = 1
    #: Device of the models: cpu | cuda | cuda:K | auto (cuda:rank%count when a GPU is present).
    device: str = "cpu"
    #: Differential privacy (DP-SGD on each peer's own gradient): the noise multiplier sigma; the
    #: noise std is sigma x dp_max_grad_norm. DP is off unless this or dp_target_epsilon is set.
    dp_noise_multiplier: Optional[float] = None
    #: DP: the per-example clipping norm C (required when DP is on).
    dp_max_grad_norm: Optional[float] = None
    #: DP: the delta of the reported (epsilon, delta); None = the largest power of ten <= 1/(10 x
    #: the largest peer's shard size), stated in the summary.
    dp_delta: Optional[float] = None
    #: DP, instead of dp_noise_multiplier: the epsilon the run must end at; sigma is computed for
    #: the run's steps so that the peer with the largest sampling rate ends at or just below it.
    dp_target_epsilon: Optional[float] = None
    #: DP accountant: rdp (Renyi DP) | prv (privacy random variables) | gdp (Gaussian DP).
    dp_accountant: str = "rdp"
    #: DP: let Opacus' validator replace layers it cannot privatize (BatchNorm -> GroupNorm, ...).
    dp_fix_model: bool = False
    #: DP: where each peer's secret key for its noise and Poisson masks comes from: os (fresh OS
    #: entropy, never written anywhere; not reproducible) | run_dir (generated on the peer when the
    #: run starts, kept only in RUN_DIR/secrets/rank-K.key, mode 0600, and in its checkpoint, so
    #: --resume continues bit for bit; needs out_dir). Never derived from the config, never sent.
    dp_secret: str = "os"
    #: DP, for exact-reproducibility tests only: noise and masks from the shared seed. Every peer
    #: can then regenerate them, so epsilon holds against outsiders only, not against the peers.
    dp_public_randomness: bool = False
    #: DP: deprecated, the noise is always secret now (true is accepted; see dp_secret).
    dp_secure_noise: Optional[bool] = None
    #: DP runs and partition: local: gather every peer's shard size, label histogram and training
    #: loss into the summary, logs and progress line, and report epsilon under replace-one too.
    #: Off (default): these functions of a peer's private data stay in that peer's own files.
    release_peer_statistics: bool = False
    #: partition: local: the total number of training samples of all peers, declared public; an
    #: epoch is ceil(public_train_size / (peers x batch_size)) steps. Needed under partition: local
    #: unless release_peer_statistics: true (then the peers all-reduce their sizes).
    public_train_size: Optional[int] = None
    #: Curious neighbours: the ranks whose received messages are recorded, under
    #: <out_dir>/observed/rank-K (in memory without out_dir); [] = none. Recording changes nothing,
    #: so a run may resume with other observers: they record from the step it resumes at.
    observers: List[int] = dataclasses.field(default_factory=list)
    #: Curious neighbours: record every k-th gossip step (Choco reconstruction needs 1).
    observe_every: int = 1
    #: Experiment trackers that log rank 0's log and eval records: tensorboard | wandb | mlflow,
    #: each a name or {name: {option: value}} (see training/extensions.py); [] = none.
    loggers: List[Any] = dataclasses.field(default_factory=list)
    #: User hooks built on every peer: "package.module:Class" (a TrainingHooks subclass) or
    #: {"package.module:Class": {option: value}}; [] = none.
    hooks: List[Any] = dataclasses.field(default_factory=list)

    # ---- helpers ---------------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        data = dataclasses.asdict(self)
        data["milestones"] = list(data["milestones"])
        data["observers"] = list(data["observers"])
        return data

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)


#: The range of comm_timeout, in seconds (see validate_config).
MIN_COMM_TIMEOUT, MAX_COMM_TIMEOUT = 1.0, 7 * 24 * 3600.0

#: How a run is executed, not what it computes: excluded from the peers' agreement check.
BACKEND_KEYS = ("backend", "peers", "comm_timeout", "quiet", "threads", "device")
#: Where and how often a run is saved: also excluded from the checkpoint's config hash.
RUN_KEYS = ("out_dir", "checkpoint_every")
#: Which messages are recorded (changes no bit of the run): a run may resume with other values,
#: recording from the step it resumes at. Every peer must still agree on them.
RECORDING_KEYS = ("observers", "observe_every")

_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
VALID_KEYS = tuple(_FIELDS)


def describe_keys() -> str:
    """`key (default)  documentation` for every key, from the comments in this file."""
    import inspect
    import re

    source = inspect.getsource(TrainConfig)
    docs: Dict[str, List[str]] = {}
    pending: List[str] = []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = re.match(r"(\w+):", stripped)
        if match and match.group(1) in _FIELDS and pending:
            docs[match.group(1)] = pending
        pending = []
    defaults = TrainConfig().to_dict()
    return "\n".join(f"{key} ({defaults[key]!r})  {' '.join(docs.get(key, []))}" for key in VALID_KEYS)


# ---- canonical forms --------------------------------------------------------------------------------

def canonical_json(config: TrainConfig, exclude: Sequence[str] = ()) -> str:
    data = {k: v for k, v in config.to_dict().items() if k not in exclude}
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def agreement_text(config: TrainConfig) -> str:
    """What every peer must hold identically: the config minus the backend-only keys."""
    return canonical_json(config, BACKEND_KEYS)


def hashed_config(config: TrainConfig) -> Dict[str, Any]:
    """The part of the config a checkpoint is bound to (what the model's trajectory depends on)."""
    return {k: v for k, v in config.to_dict().items()
            if k not in BACKEND_KEYS + RUN_KEYS + RECORDING_KEYS}


def config_hash(config: TrainConfig) -> str:
    text = json.dumps(hashed_config(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


# ---- parsing and validation -------------------------------------------------------------------------

def _type_name(key: str) -> str:
    return {"milestones": "list of numbers", "observers": "list of ranks",
            "loggers": "list of names", "hooks": "list of specs"}.get(key, {
        "str": "string", "float": "number", "int": "integer", "bool": "true/false",
        "Optional[str]": "string or null", "Optional[int]": "integer or null",
        "Optional[float]": "number or null",
    }.get(str(_FIELDS[key].type), str(_FIELDS[key].type)))


def _coerce(key: str, value: Any) -> Any:
    """Check the YAML value of `key` has the right type; ints are accepted where floats are."""
    kind = str(_FIELDS[key].type)
    optional = kind.startswith("Optional[")
    if value is None and optional:
        return None
    base = kind[len("Optional["):-1] if optional else kind
    ok = False
    if base == "str":
        ok = isinstance(value, str)
    elif base == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif base == "float":
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok:
            value = float(value)
    elif base == "bool":
        ok = isinstance(value, bool)
    elif key == "milestones":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value]
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        if ok:
            value = [float(v) for v in value]
    elif key == "observers":
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value)
        if ok:
            value = [int(v) for v in value]
    elif key in ("loggers", "hooks"):
        from .extensions import entries

        entries(value, key)  # a one-line error for a malformed entry
        value, ok = list(value) if isinstance(value, (list, tuple)) else [value], True
    if not ok:
        hint = ""  # YAML turned unquoted text into another type: say how to keep it text
        if base == "str" and isinstance(value, bool):
            hint = "; quote it in the YAML file (YAML reads unquoted yes/no/on/off as true/false)"
        elif base == "str" and value is not None and not isinstance(value, (list, dict)):
            hint = f"; quote it in the YAML file: {key}: '{value}'"  # a date, a number
        raise ValueError(f"bad value for {key!r}: {value!r} is not a {_type_name(key)}{hint}")
    return value


def _unknown_keys_error(unknown: Sequence[str], where: str) -> ValueError:
    names = ", ".join(repr(k) for k in unknown)
    return ValueError(f"unknown config key{'s' if len(unknown) > 1 else ''} {names}{where}; "
                      f"valid keys: {', '.join(VALID_KEYS)}")


def config_from_dict(data: Dict[str, Any], where: str = "") -> TrainConfig:
    """Build a `TrainConfig` from a mapping, checking keys and value types (not the specs)."""
    if not isinstance(data, dict):
        raise ValueError(f"a config must be a mapping of key: value{where}, got {type(data).__name__}")
    unknown = [k for k in data if k not in _FIELDS]
    if unknown:
        raise _unknown_keys_error(unknown, where)
    return TrainConfig(**{k: _coerce(k, v) for k, v in data.items()})


def parse_override(text: str) -> tuple:
    """"lr=0.05" -> ("lr", 0.05): the value is parsed as YAML (`strict_yaml_load`)."""
    key, eq, value = text.partition("=")
    key = key.strip()
    if not eq or not key:
        raise ValueError(f"--set expects key=value, got {text!r}; valid keys: {', '.join(VALID_KEYS)}")
    if key not in _FIELDS:
        raise _unknown_keys_error([key], " in --set")
    parsed = strict_yaml_load(value, f"--set {key}={value}") if value.strip() else None
    if (parsed is not None and not isinstance(parsed, (str, list, dict))
            and str(_FIELDS[key].type) in ("str", "Optional[str]")):
        # A string key takes the text as typed: --set out_dir=2024-01-01 is a directory, not a
        # date (YAML reads dates, numbers and yes/no as such); null still means None.
        parsed = value.strip()
    return key, parsed


def load_config(path, overrides: Sequence[str] = (), deep: bool = True) -> TrainConfig:
    """Read a YAML config, apply `key=value` overrides, validate (see `validate_config`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} not found")
    data = strict_yaml_load(path.read_text(), str(path))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a config must be a mapping of key: value, got {type(data).__name__}")
    config = config_from_dict(data, f" in {path}")
    changes = {}
    for text in overrides:
        key, value = parse_override(text)
        changes[key] = _coerce(key, value)
    config = config.replace(**changes)
    validate_config(config, deep=deep)
    return config


def _check(condition: bool, key: str, value: Any, requirement: str) -> None:
    if not condition:
        raise ValueError(f"bad value for {key!r}: {value!r} ({requirement})")


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


#: Algorithms that run on a directed topology: push-sum, and the all-reduce baselines (no graph).
DIRECTED_ALGORITHMS = ("pushsum", "allreduce", "powersgd")


def _check_directed(c: TrainConfig, num_peers: Optional[int]) -> None:
    """Refuse a directed topology (or schedule) for an algorithm that needs symmetric edges."""
    import topologies

    name = c.algorithm.split(":", 1)[0].strip().lower()
    if name in DIRECTED_ALGORITHMS:
        return
    n = None if _has_size(c.topology) else (num_peers if num_peers is not None else 4)
    if topologies.parse(c.topology, n=n).is_directed:
        raise ValueError(f"bad value for 'algorithm': {name!r} needs symmetric edges, but topology "
                         f"{c.topology!r} is directed; use algorithm pushsum (or an undirected "
                         "topology)")


def _check_dp_keys_need_dp(c: TrainConfig) -> None:
    """Refuse a ``dp_*`` key set while differential privacy is off: without this, a run given
    only ``dp_max_grad_norm`` (or ``dp_secure_noise``, ...) would train with no privacy at all and
    look as if it had some."""
    if c.dp_noise_multiplier is not None or c.dp_target_epsilon is not None:
        return
    defaults = TrainConfig()
    for key in ("dp_max_grad_norm", "dp_delta", "dp_accountant", "dp_fix_model", "dp_secure_noise"):
        if getattr(c, key) != getattr(defaults, key):
            raise ValueError(f"{key} is set but differential privacy is off (neither "
                             "dp_noise_multiplier nor dp_target_epsilon is set): set one of them "
                             f"to turn DP on (e.g. dp_noise_multiplier: 1.0), or drop {key}")


def validate_config(config: TrainConfig, deep: bool = True) -> None:
    """Raise a one-line ValueError for the first bad value.

    `deep` also builds what the specs name, exactly as training will (the dataset, the partition,
    the model; the algorithm spec and the topology are always checked).
    """
    c = config
    for key in VALID_KEYS:  # values set in code rather than from YAML
        _coerce(key, getattr(c, key))
    _check(c.optimizer in OPTIMIZERS, "optimizer", c.optimizer, f"valid: {', '.join(OPTIMIZERS)}")
    _check(c.schedule in SCHEDULES, "schedule", c.schedule, f"valid: {', '.join(SCHEDULES)}")
    _check(c.backend in BACKENDS, "backend", c.backend, f"valid: {', '.join(BACKENDS)}")
    # models train in float32: a larger lr cannot even be applied (torch raises an overflow error)
    _check(math.isfinite(c.lr) and 0 < c.lr <= _FLOAT32_MAX, "lr", c.lr,
           f"must be > 0 and at most {_FLOAT32_MAX:.4g} (float32)")
    _check(0 <= c.momentum < 1, "momentum", c.momentum, "must be in [0, 1)")
    _check(c.momentum == 0 or c.optimizer == "sgd", "momentum", c.momentum,
           f"momentum is for sgd only; {c.optimizer} has its own betas, set momentum to 0")
    _check(not c.nesterov or (c.optimizer == "sgd" and c.momentum > 0), "nesterov", c.nesterov,
           "needs optimizer sgd with momentum > 0")
    _check(math.isfinite(c.weight_decay) and c.weight_decay >= 0, "weight_decay", c.weight_decay,
           "must be >= 0")
    _check(c.batch_size >= 1, "batch_size", c.batch_size, "must be >= 1")
    _check(c.epochs >= 1, "epochs", c.epochs, "must be >= 1")
    _check(0 <= c.warmup_epochs <= c.epochs, "warmup_epochs", c.warmup_epochs,
           f"must be in [0, epochs={c.epochs}]")
    _check(0 < c.decay <= 1, "decay", c.decay, "must be in (0, 1]")
    _check(all(0 < m <= c.epochs for m in c.milestones) and list(c.milestones) == sorted(c.milestones),
           "milestones", c.milestones, f"must be increasing epochs in (0, {c.epochs}]")
    _check(c.schedule == "step" or not c.milestones, "milestones", c.milestones,
           "milestones are for schedule: step")
    _check(c.eval_every >= 1, "eval_every", c.eval_every, "must be >= 1 (epochs)")
    _check(c.log_every >= 0, "log_every", c.log_every, "must be >= 0 (steps; 0 = off)")
    _check(c.checkpoint_every >= 0, "checkpoint_every", c.checkpoint_every, "must be >= 0 (0 = off)")
    # torch's generators take seeds below 2**64; a larger one would fail inside the model's set-up
    _check(0 <= c.seed < _SEED_LIMIT, "seed", c.seed, "must be in [0, 2**64)")
    _check(c.peers is None or c.peers >= 1, "peers", c.peers, "must be >= 1 or null")
    # The set-up of a launched run waits comm_timeout for every process to connect to the
    # rendezvous: below a second that fails on an ordinary start (torch then reports only its
    # socket's "timed out after 0ms"); beyond a week it is no bound at all, and far beyond,
    # Python's waits overflow (threading.TIMEOUT_MAX).
    _check(math.isfinite(c.comm_timeout) and MIN_COMM_TIMEOUT <= c.comm_timeout <= MAX_COMM_TIMEOUT,
           "comm_timeout", c.comm_timeout,
           f"must be in [{MIN_COMM_TIMEOUT:g}, {MAX_COMM_TIMEOUT:g}] seconds (1 s to a week)")
    _check(c.threads >= 1, "threads", c.threads, "must be >= 1")
    _check(c.device == "auto" or c.device == "cpu" or c.device == "cuda" or c.device.startswith("cuda:"),
           "device", c.device, "valid: cpu, cuda, cuda:K, auto")
    _check(c.out_dir is None or c.out_dir.strip() != "", "out_dir", c.out_dir, "must not be empty")
    _check(all(k >= 0 for k in c.observers) and len(set(c.observers)) == len(c.observers),
           "observers", c.observers, "must be distinct ranks >= 0, e.g. [3]")
    _check(c.observe_every >= 1, "observe_every", c.observe_every, "must be >= 1 (steps)")
    _check(c.public_train_size is None or c.public_train_size >= 1, "public_train_size",
           c.public_train_size, "must be >= 1 (training samples of all peers) or null")

    from ..algorithms import algorithm_kwargs

    try:
        algorithm_kwargs(c.algorithm)
    except ValueError as exc:
        raise ValueError(f"bad value for 'algorithm': {one_line(exc)}") from None
    import topologies

    if _has_size(c.topology):
        num_peers = topologies.parse(c.topology).size
        _check(c.peers is None or c.peers == num_peers, "peers", c.peers,
               f"topology {c.topology!r} has {num_peers} peers")
    elif c.peers is not None:
        num_peers = resolve_topology(c).size
    else:
        num_peers = None  # "ring" under mpiexec or torchrun: sized by the world at launch
        try:
            topologies.parse(c.topology, n=4)  # the name and its options, at some size
        except ValueError as exc:
            raise ValueError(f"bad value for 'topology': {one_line(exc)}") from None
        _check(c.backend in ("mpi", "torch"), "topology", c.topology,
               "give its size, e.g. ring:8, or set peers (the local backend cannot guess it)")
    _check_directed(c, num_peers)
    _check_dp_keys_need_dp(c)
    from ..privacy.training import validate_privacy_config

    validate_privacy_config(c)
    from .extensions import config_hooks

    config_hooks(c)  # unknown or uninstalled loggers, user hooks that do not import or build
    if deep:
        validate_specs(c, num_peers)


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
            partition(dataset.y_train, num_peers, config.partition, config.seed)
        except ValueError as exc:
            raise ValueError(f"bad value for 'partition': {one_line(exc)}") from None
    else:
        try:
            partition(dataset.y_train, 1, config.partition, config.seed)
        except ValueError as exc:
            raise ValueError(f"bad value for 'partition': {one_line(exc)}") from None
    try:
        model = build_model(config.model, dataset.input_shape, dataset.num_classes, config.seed)
        check_model_fits(model, config.model, dataset.x_test[:2], dataset.num_classes)
    except ValueError as exc:
        raise ValueError(f"bad value for 'model': {one_line(exc)}") from None


def dump_config(config: TrainConfig) -> str:
    """The fully resolved config as YAML (key order as declared)."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False, default_flow_style=None)
