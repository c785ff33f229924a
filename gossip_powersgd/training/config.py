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
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import yaml

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
    #: Local steps H: the algorithm communicates once every H optimizer steps, after steps H, 2H,
    #: ... (1 = every step; the paper's "32 local steps" baseline is 32). Parameter-mixing
    #: algorithms only (a gradient averager such as powersgd averages every step's gradients).
    local_steps: int = 1
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
    # ---- privacy mechanisms that use the graph (privacy/mechanisms/), on top of DP-SGD ----
    #: DP mechanism: local (DP-SGD alone) | muffliato (the same noise, accounted per pair) | zipdl
    #: (zero-sum noise per edge on the messages) | decor (antisymmetric pairwise noise from
    #: Diffie-Hellman pair keys; dp_noise_multiplier is then its independent sigma_ind).
    dp_mechanism: str = "local"
    #: zipdl: std of the per-edge zero-sum noise on every message coordinate (parameter units).
    dp_zipdl_sigma: Optional[float] = None
    #: decor: the pairs' noise multiplier sigma_cor (std sigma_cor x dp_max_grad_norm per pair).
    dp_decor_sigma_cor: Optional[float] = None
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


def dump_config(config: TrainConfig) -> str:
    """The fully resolved config as YAML (key order as declared)."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False, default_flow_style=None)


# Validation lives in validation.py; its names stay importable from here.
from .validation import (  # noqa: E402,F401  (validation.py imports this module's names)
    resolve_topology,
    validate_config,
    validate_specs,
)
