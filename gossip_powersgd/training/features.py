"""Config-driven features: what a config section turns on, registered like algorithms.

Differential privacy, curious-neighbour observers, experiment trackers and user hooks are each a
`Feature` declared in its own module and registered there with `register(Feature(...))`. A feature
declares

* its config keys (`Key`: the flat name, its type, default and documentation; with a `section`,
  the keys may also be written nested, ``dp: {noise_multiplier: 1.0}`` for ``dp_noise_multiplier``);
* `validate(config)`: a one-line ValueError for a bad value of its keys;
* `hooks(config)`: the `TrainingHooks` a run with this config needs (none when it is off);
* `summary_rows(summary)`: its rows of the summary table; `eval_text(record)`: what it adds to the
  progress line of an eval record;
* `private(config)`: whether it keeps each peer's statistics (shard size, label histogram,
  training loss) on that peer.

The trainer, the config and the summary go through this registry only: `training/` names no
feature. A feature module registers when it is imported; the modules are listed by path with
`declare(module)` (the package's own in ``gossip_powersgd/__init__.py``, one line each, in the
order their hooks run) and imported on first use, so that no module under `training/` imports the
packages above it. A new feature is one file plus one `declare` line (or one `register` call before
the run, e.g. in the script that calls `cli.train.main`).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

__all__ = [
    "Key",
    "Feature",
    "register",
    "declare",
    "features",
    "feature_keys",
    "section_of",
    "feature_hooks",
    "summary_rows",
    "eval_text",
    "peer_statistics_private",
]


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key of a feature.

    `kind` is the type as the core keys spell it ("str", "int", "float", "bool", "Optional[float]",
    ...); a key of another type gives `coerce` (the YAML value -> the stored value, one-line
    ValueError for a bad one) and `type_name` (how errors name the type).
    """

    name: str
    kind: str
    default: Any = None
    doc: str = ""
    #: The key's name inside the feature's section (``dp: {noise_multiplier: ...}``); None: the flat
    #: name without the section's prefix.
    nested: Optional[str] = None
    coerce: Optional[Callable[[Any], Any]] = None
    type_name: Optional[str] = None
    #: Changes no bit of the run (like `RECORDING_KEYS`): left out of the checkpoint's config hash.
    recording: bool = False
    #: For a spec-valued key: (spec, world size) -> what it means whatever its spelling, so that a
    #: resume accepts a spec written otherwise (`resume.check_header`); None: compared as written.
    meaning: Optional[Callable[[str, int], Any]] = None

    def fresh_default(self) -> Any:
        """The default, copied when it is mutable (each config gets its own list)."""
        return list(self.default) if isinstance(self.default, list) else self.default


def _none(config) -> List[Any]:
    return []


@dataclasses.dataclass
class Feature:
    """A plug-in that a config turns on (see the module docstring)."""

    name: str
    keys: Sequence[Key] = ()
    #: Nested spelling of the keys: ``<section>: {<nested name>: value}``; None: flat keys only.
    section: Optional[str] = None
    validate: Callable[[Any], None] = lambda config: None
    hooks: Callable[[Any], List[Any]] = _none
    summary_rows: Callable[[Dict[str, Any]], List[tuple]] = lambda summary: []
    eval_text: Callable[[Dict[str, Any]], str] = lambda record: ""
    private: Callable[[Any], bool] = lambda config: False

    def nested_name(self, key: Key) -> str:
        if key.nested is not None:
            return key.nested
        prefix = f"{self.section}_"
        return key.name[len(prefix) :] if key.name.startswith(prefix) else key.name


_REGISTRY: Dict[str, Feature] = {}
_HOMES: Dict[str, str] = {}  # feature name -> the module that registered it
_MODULES: List[str] = []
_loaded = 0  # how many of _MODULES are imported


def register(feature: Feature) -> Feature:
    """Add `feature`; call it at the top level of the feature's module. A key already declared
    by another feature, or a name taken, is refused."""
    if not isinstance(feature, Feature):
        raise TypeError(f"register expects a Feature, got {type(feature).__name__}")
    if feature.name in _REGISTRY and _REGISTRY[feature.name] is not feature:
        raise ValueError(f"a feature named {feature.name!r} is already registered")
    taken = {k.name: f.name for f in _REGISTRY.values() if f is not feature for k in f.keys}
    for key in feature.keys:
        if key.name in taken:
            raise ValueError(
                f"feature {feature.name!r} declares config key {key.name!r}, which "
                f"feature {taken[key.name]!r} already declares"
            )
    _REGISTRY[feature.name] = feature
    _HOMES[feature.name] = sys._getframe(1).f_globals.get("__name__", "")
    return feature


def declare(module: str) -> None:
    """Name a module that registers features when imported; it is imported on first use."""
    if module not in _MODULES:
        _MODULES.append(module)


def _load() -> None:
    global _loaded
    while _loaded < len(_MODULES):
        module = _MODULES[_loaded]
        _loaded += 1  # first: a module that reads the registry while it imports must not recurse
        importlib.import_module(module)


def features() -> List[Feature]:
    """Every registered feature: those of the declared modules in the declared order, then any
    other in registration order. Their hooks run in this order."""
    _load()
    position = {module: k for k, module in enumerate(_MODULES)}
    order = {name: k for k, name in enumerate(_REGISTRY)}
    names = sorted(_REGISTRY, key=lambda n: (position.get(_HOMES[n], len(position)), order[n]))
    return [_REGISTRY[n] for n in names]


def feature_keys() -> Dict[str, Key]:
    """Every feature's keys by flat name, in feature order."""
    return {k.name: k for f in features() for k in f.keys}


def section_of(name: str) -> Optional[Feature]:
    """The feature whose section is `name` (``dp``), or None."""
    return next((f for f in features() if f.section is not None and f.section == name), None)


def feature_hooks(config) -> List[Any]:
    """The hooks every feature builds for `config`, in feature order."""
    return [h for f in features() for h in f.hooks(config)]


def summary_rows(summary: Dict[str, Any]) -> List[tuple]:
    """Every feature's rows of the summary table, in feature order."""
    return [row for f in features() for row in f.summary_rows(summary)]


def eval_text(record: Dict[str, Any]) -> str:
    """What the features add to the progress line of an eval record."""
    return "".join(f.eval_text(record) for f in features())


def peer_statistics_private(config) -> bool:
    """Whether each peer's shard size, label histogram and training loss stay on that peer.

    They are functions of its private data, so under a feature that protects the data (differential
    privacy) and under `partition: local` (where the data exists only on its peer) nothing gathers
    them to other peers, the summary or rank 0's output, unless `release_peer_statistics: true`.
    """
    private = config.partition == "local" or any(f.private(config) for f in features())
    return private and not config.release_peer_statistics
