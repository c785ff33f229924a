"""`TrainConfig`: every setting of a decentralized training run, and `load_config` for YAML files.

A config file is a flat YAML mapping of the keys below; anything not given takes its default.
`load_config(path, ["lr=0.05", "algorithm=exact"])` applies command-line overrides (each value is
parsed as YAML, so `milestones=[5,8]`, `peers=null` and `quiet=true` work, except that a string
key takes the text as typed: `out_dir=2024-01-01` is a directory, not a date) and validates the
result. YAML is loaded safely (plain data only), and a duplicate key, an alias bomb, a number
not in decimal (`1:30`) or a huge file is refused (`yaml_loader.py`). Validation: an unknown key
or a bad value raises a one-line `ValueError` that lists the valid keys or values.

The core keys are the fields below; the keys of config-driven features (differential privacy
`dp_*`, observers, loggers, user hooks, ...) are declared by each feature (`features.py`) and held
by `TrainConfig` alongside: `config.dp_noise_multiplier` reads like a field. A feature with a
section may also be written nested (``dp: {noise_multiplier: 1.0}``, ``--set dp.delta=1e-5``);
the flat spelling is the canonical one (dumped, hashed).

Some keys only say *how* a run is executed, not *what* it computes (`BACKEND_KEYS`): peers need not
agree on them, a checkpoint may use others. `RUN_KEYS` (where the run is written, how often it is
checkpointed) and `RECORDING_KEYS` (which messages are recorded) are also left out of its hash.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import yaml

from . import features as _features
from .yaml_loader import read_config_text, strict_yaml_load, yaml11_float

# Validation lives in validation.py (which imports nothing of this module); its names stay
# importable from here.
from .validation import (  # noqa: F401  (re-exported)
    BACKENDS,
    MAX_COMM_TIMEOUT,
    MIN_COMM_TIMEOUT,
    OPTIMIZERS,
    SCHEDULES,
    resolve_topology,
    validate_config,
    validate_specs,
)


@dataclasses.dataclass
class _CoreConfig:
    """The core keys of a training run. Each field's comment is its documentation."""

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
    #: Linear warm-up from lr/(warm-up steps) to lr over this many epochs (may be fractional; 0 =
    #: none); a warm-up must round to at least 2 steps (one step would run at the full rate).
    warmup_epochs: float = 0.0
    #: Learning-rate schedule after the warm-up, applied every step: constant | step | cosine (to 0).
    schedule: str = "constant"
    #: `step` schedule: epochs (may be fractional; none inside the warm-up) at which lr *= `decay`.
    milestones: List[float] = dataclasses.field(default_factory=list)
    #: `step` schedule: the factor applied at each milestone, in (0, 1].
    decay: float = 0.1
    #: Gradient clipping for plain (non-DP) training: each step's gradient is scaled to a global
    #: norm of at most this (torch.nn.utils.clip_grad_norm_), after a gradient averager's
    #: all-reduce, before the optimizer step (an LSTM's usual 0.25); null = none. Under DP each
    #: sample's gradient is clipped by dp_max_grad_norm instead.
    max_grad_norm: Optional[float] = None
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
    #: Torch intra-op threads per process (1 keeps runs bit-reproducible across backends); more
    #: than the CPUs this process may use are cut to them, with a warning.
    threads: int = 1
    #: Device of the models: cpu | cuda | cuda:K | auto (cuda:rank%count when a GPU is present;
    #: under backend torch, cuda is each host's LOCAL_RANK-th GPU).
    device: str = "cpu"
    #: DP runs and partition: local: gather every peer's shard size, label histogram and training
    #: loss into the summary, logs and progress line; epsilon is then replace-one's (sizes public).
    #: Off (default): these functions of a peer's private data stay in that peer's own files.
    release_peer_statistics: bool = False
    #: partition: local: the total number of training samples of all peers, declared public; an
    #: epoch is ceil(public_train_size / (peers x batch_size)) steps. Needed under partition: local
    #: unless release_peer_statistics: true (then the peers all-reduce their sizes). A peer whose
    #: own shard is larger refuses it (without naming its size).
    public_train_size: Optional[int] = None


class TrainConfig(_CoreConfig):
    """One training run: the core keys (fields of `_CoreConfig`) and every registered feature's
    keys (`features.feature_keys()`), each readable and settable as an attribute.
    `keydocs.describe_keys()` prints them all with their documentation."""

    def __init__(self, **values: Any):
        keys = _features.feature_keys()
        extra = {k: values.pop(k) for k in list(values) if k not in _FIELDS}
        unknown = [k for k in extra if k not in keys]
        if unknown:
            raise TypeError(
                f"TrainConfig got unknown key{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(map(repr, unknown))}; valid keys: {', '.join(valid_keys())}"
            )
        super().__init__(**values)
        self.__dict__["_feature_values"] = {
            name: extra[name] if name in extra else key.fresh_default()
            for name, key in keys.items()
        }

    def __getattr__(self, name: str) -> Any:  # only for names that are not core fields
        values = self.__dict__.get("_feature_values")
        if values is not None and name in values:
            return values[name]
        if values is not None and not name.startswith("__") and name in _features.feature_keys():
            return _features.feature_keys()[name].fresh_default()  # registered after this config
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        values = self.__dict__.get("_feature_values")
        if name not in _FIELDS and values is not None and name in _features.feature_keys():
            values[name] = value
        else:
            super().__setattr__(name, value)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, TrainConfig) and self.to_dict() == other.to_dict()

    __hash__ = None  # mutable, like the dataclass it extends

    def __repr__(self) -> str:
        return f"TrainConfig({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"

    # ---- helpers ---------------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        """Every key's value: the core keys in declared order, then each feature's."""
        data = {name: copy.deepcopy(getattr(self, name)) for name in _FIELDS}
        data["milestones"] = list(data["milestones"])
        data.update({name: copy.deepcopy(getattr(self, name)) for name in _features.feature_keys()})
        return data

    @property
    def algorithm_spec(self):
        """`algorithm` parsed into an `algorithms.AlgorithmSpec` (name, class, typed options such as
        PowerGossip's int rank), once per spec text: validation parses it, every user reads it."""
        from ..algorithms.registry import parse_algorithm

        return parse_algorithm(self.algorithm)

    def replace(self, **changes) -> "TrainConfig":
        return TrainConfig(**{**self.to_dict(), **changes})

    def check_types(self) -> None:
        """A one-line ValueError for the first value of the wrong type (a value set in code
        rather than read from YAML, which `config_from_dict` checks)."""
        for key in valid_keys():
            _coerce(key, getattr(self, key), from_yaml=False)


#: How a run is executed, not what it computes: excluded from the peers' agreement check.
BACKEND_KEYS = ("backend", "peers", "comm_timeout", "quiet", "threads", "device")
#: Where and how often a run is saved: also excluded from the checkpoint's config hash.
RUN_KEYS = ("out_dir", "checkpoint_every")

_FIELDS = {f.name: f for f in dataclasses.fields(_CoreConfig)}


def valid_keys() -> tuple:
    """Every key a config may set: the core keys, then the registered features'."""
    return (*_FIELDS, *_features.feature_keys())


def recording_keys() -> tuple:
    """Keys that only say which messages are recorded (a feature's `Key.recording`): they change no
    bit of the run, so a run may resume with other values, recording from the step it resumes at.
    Every peer must still agree on them."""
    return tuple(name for name, key in _features.feature_keys().items() if key.recording)


def __getattr__(name: str) -> Any:
    """`VALID_KEYS` and `RECORDING_KEYS` as constants (they include the registered features')."""
    if name == "VALID_KEYS":
        return valid_keys()
    if name == "RECORDING_KEYS":
        return recording_keys()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- canonical forms --------------------------------------------------------------------------------


def canonical_json(config: TrainConfig, exclude: Sequence[str] = ()) -> str:
    data = {k: v for k, v in config.to_dict().items() if k not in exclude}
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def agreement_text(config: TrainConfig) -> str:
    """What every peer must hold identically: the config minus the backend-only keys."""
    return canonical_json(config, BACKEND_KEYS)


def hashed_config(config: TrainConfig) -> Dict[str, Any]:
    """The part of the config a checkpoint is bound to (what the model's trajectory depends on)."""
    excluded = BACKEND_KEYS + RUN_KEYS + recording_keys()
    return {k: v for k, v in config.to_dict().items() if k not in excluded}


def config_hash(config: TrainConfig) -> str:
    text = json.dumps(hashed_config(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


# ---- parsing and validation -------------------------------------------------------------------------

_TYPE_NAMES = {
    "str": "string",
    "float": "number",
    "int": "integer",
    "bool": "true/false",
    "Optional[str]": "string or null",
    "Optional[int]": "integer or null",
    "Optional[float]": "number or null",
    "Optional[bool]": "true/false or null",
}


def _kind(key: str) -> str:
    return str(_FIELDS[key].type) if key in _FIELDS else _features.feature_keys()[key].kind


def _type_name(key: str) -> str:
    if key == "milestones":
        return "list of numbers"
    feature_key = _features.feature_keys().get(key)
    if feature_key is not None and feature_key.type_name:
        return feature_key.type_name
    return _TYPE_NAMES.get(_kind(key), _kind(key))


def _coerce(key: str, value: Any, from_yaml: bool = True) -> Any:
    """Check the YAML value of `key` has the right type; ints are accepted where floats are, and
    (`from_yaml`) the YAML 1.1 text of a number, 1e-3, where a number is."""
    feature_key = _features.feature_keys().get(key)
    if feature_key is not None and feature_key.coerce is not None:
        return feature_key.coerce(value)
    kind = _kind(key)
    optional = kind.startswith("Optional[")
    if value is None and optional:
        return None
    base = kind[len("Optional[") : -1] if optional else kind
    ok = False
    if base == "str":
        ok = isinstance(value, str)
    elif base == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif base == "float":
        value = yaml11_float(value, from_yaml)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok:
            value = float(value)
    elif base == "bool":
        ok = isinstance(value, bool)
    elif key == "milestones":
        value = yaml11_float(value, from_yaml)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value]
        if isinstance(value, (list, tuple)):
            value = [yaml11_float(v, from_yaml) for v in value]
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
        )
        if ok:
            value = [float(v) for v in value]
    if not ok:
        hint = ""  # YAML turned unquoted text into another type: say how to keep it text
        if base == "str" and isinstance(value, bool):
            hint = "; quote it in the YAML file (YAML reads unquoted yes/no/on/off as true/false)"
        elif base == "str" and value is not None and not isinstance(value, (list, dict)):
            hint = f"; quote it in the YAML file: {key}: '{value}'"  # a date, a number
        name = _type_name(key)
        article = "an" if name[0] in "aeiou" else "a"
        raise ValueError(f"bad value for {key!r}: {value!r} is not {article} {name}{hint}")
    return value


def _unknown_keys_error(unknown: Sequence[str], where: str) -> ValueError:
    names = ", ".join(repr(k) for k in unknown)
    return ValueError(
        f"unknown config key{'s' if len(unknown) > 1 else ''} {names}{where}; "
        f"valid keys: {', '.join(valid_keys())}"
    )


def _nested_key(section: str, name: str, where: str) -> str:
    """The flat key of `name` in feature section `section` (``dp``, ``noise_multiplier`` ->
    ``dp_noise_multiplier``)."""
    feature = _features.section_of(section)
    by_nested = {feature.nested_name(k): k.name for k in feature.keys}
    if name not in by_nested:
        raise ValueError(
            f"unknown key {name!r} in section {section!r}{where}; valid: {', '.join(by_nested)}"
        )
    return by_nested[name]


def _flatten(data: Dict[str, Any], where: str) -> Dict[str, Any]:
    """`data` with every feature section (``dp: {noise_multiplier: 1.0}``) spelled flat."""
    flat: Dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(key, str) and key not in _FIELDS and _features.section_of(key) is not None:
            if not isinstance(value, dict):
                raise ValueError(
                    f"bad value for {key!r}{where}: {value!r} is not a mapping of its "
                    f"keys (e.g. {key}: {{name: value}})"
                )
            for name, inner in value.items():
                flat_key = _nested_key(key, name, where)
                if flat_key in data or flat_key in flat:
                    raise ValueError(
                        f"{flat_key} is set twice{where}: as {flat_key} and in "
                        f"section {key}; set it once"
                    )
                flat[flat_key] = inner
        else:
            if key in flat:
                raise ValueError(
                    f"{key} is set twice{where}: as {key} and in a section; set it once"
                )
            flat[key] = value
    return flat


def config_from_dict(data: Dict[str, Any], where: str = "") -> TrainConfig:
    """Build a `TrainConfig` from a mapping, checking keys and value types (not the specs)."""
    if not isinstance(data, dict):
        raise ValueError(
            f"a config must be a mapping of key: value{where}, got {type(data).__name__}"
        )
    data = _flatten(data, where)
    keys = valid_keys()
    unknown = [k for k in data if k not in keys]
    if unknown:
        raise _unknown_keys_error(unknown, where)
    return TrainConfig(**{k: _coerce(k, v) for k, v in data.items()})


def parse_override(text: str) -> tuple:
    """ "lr=0.05" -> ("lr", 0.05): the value is parsed as YAML (`strict_yaml_load`). A feature's
    key may be spelled with its section: "dp.noise_multiplier=1.0"."""
    key, eq, value = text.partition("=")
    key = key.strip()
    if not eq or not key:
        raise ValueError(
            f"--set expects key=value, got {text!r}; valid keys: {', '.join(valid_keys())}"
        )
    section, dot, name = key.partition(".")
    if dot and _features.section_of(section) is not None:
        key = _nested_key(section, name, " in --set")
    if key not in valid_keys():
        raise _unknown_keys_error([key], " in --set")
    text_key = _kind(key) in ("str", "Optional[str]")
    if text_key and not value.strip():
        # out_dir= would otherwise become None, i.e. the default run directory, without a word
        raise ValueError(
            f"--set {key}= gives no value: give one ({key}=DIR), or {key}=null for its default"
            if key == "out_dir"
            else f"--set {key}= gives no value: give one, or {key}=null for its default"
        )
    parsed = strict_yaml_load(value, f"--set {key}={value}", decimal=not text_key)
    if (
        text_key
        and parsed is not None
        and (not isinstance(parsed, str) and value.strip()[0] not in "[{" or "\n" in value)
    ):
        # A string key takes the text as typed: out_dir=2024-01-01 is a directory, not a date,
        # device=cuda: a device, not a mapping (only [...] and {...} stay a list or mapping), and
        # a line break stays one (YAML folds it into a space; validation names it); null is None.
        parsed = value.strip()
    return key, parsed


def load_config(path, overrides: Sequence[str] = (), deep: bool = True) -> TrainConfig:
    """Read a YAML config, apply `key=value` overrides, validate (see `validate_config`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} not found")
    data = strict_yaml_load(read_config_text(path), str(path))
    config = config_from_dict({} if data is None else data, f" in {path}")  # checks it is a mapping
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
