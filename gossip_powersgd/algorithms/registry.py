"""`make_algorithm("powergossip:rank=2,iters=1", params, comm)`: the CLI spelling of an algorithm.

A spec is `name` or `name:key=value,key=value`. Each algorithm declares the keys it accepts, with the
keyword argument each maps to and how to parse its value; anything else is an error that lists
what is valid.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple

from .. import specs
# Re-exported: algorithm option tables (and the experiments) parse their values with these.
from ..specs import parse_bool, parse_optional_float  # noqa: F401


#: What an algorithm's γ is when its spec does not set one.
GAMMA_KINDS = ("topology", "tuned", "none")


@dataclasses.dataclass
class AlgorithmEntry:
    factory: Callable[..., Any]
    keys: Dict[str, Tuple[str, Callable[[str], Any]]]  # spec key -> (keyword argument, parser)
    summary: str
    #: "topology": an unset γ is the topology's (`Topology.gamma`); "tuned": γ has no good default
    #: and must be swept; "none": the algorithm has no γ (all-reduce baselines).
    gamma: str = "none"
    #: Short legend label from the spec's options (γ left out), e.g. "PowerGossip r1", "Choco sign".
    label: Optional[Callable[[Dict[str, str]], str]] = None


REGISTRY: Dict[str, AlgorithmEntry] = {}


def register(name: str, factory, keys: Dict[str, Tuple[str, Callable[[str], Any]]], summary: str,
             *, gamma: str = "none", label: Optional[Callable[[Dict[str, str]], str]] = None) -> None:
    if gamma not in GAMMA_KINDS:
        raise ValueError(f"register({name!r}): gamma must be one of {', '.join(GAMMA_KINDS)}")
    REGISTRY[name] = AlgorithmEntry(factory, keys, summary, gamma, label)


def split_spec(spec: str) -> Tuple[str, Dict[str, str]]:
    """An algorithm spec's lower-cased name and its options as strings (see `specs.split_spec`):
    "choco:compressor=[randomk:0.1,seed=3],gamma=0.4" -> ("choco", {"compressor": "randomk:0.1,seed=3",
    "gamma": "0.4"})."""
    return specs.split_spec(spec, "algorithm spec")


def algorithm_kwargs(spec: str) -> Tuple[AlgorithmEntry, Dict[str, Any]]:
    """Validate a spec without building anything (so a config can be checked before training)."""
    name, options = split_spec(spec)
    if name not in REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}; valid: {', '.join(sorted(REGISTRY))}")
    entry = REGISTRY[name]
    kwargs: Dict[str, Any] = {}
    for key, value in options.items():
        if key not in entry.keys:
            valid = ", ".join(sorted(entry.keys)) or "none"
            raise ValueError(f"algorithm {name!r} has no option {key!r}; valid: {valid}")
        argument, parse = entry.keys[key]
        try:
            kwargs[argument] = parse(value)
        except ValueError as exc:
            raise ValueError(f"algorithm {name!r}: bad value {value!r} for {key}: {exc}") from None
    return entry, kwargs


def _entry(spec: str) -> Tuple[str, AlgorithmEntry, Dict[str, str]]:
    name, options = split_spec(spec)
    if name not in REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}; valid: {', '.join(sorted(REGISTRY))}")
    return name, REGISTRY[name], options


def algorithm_label(spec: str) -> str:
    """The legend label of a spec: "exact gossip", "PowerGossip r1 K2", "Choco sign", ... (no γ)."""
    name, entry, options = _entry(spec)
    if entry.label is not None:
        return entry.label(options)
    rest = ",".join(f"{k}={v}" for k, v in options.items() if k != "gamma")
    return f"{name} {rest}".strip()


def gamma_kind(spec: str) -> str:
    """What the spec's γ is when it sets none: "topology", "tuned" or "none" (see `AlgorithmEntry`)."""
    return _entry(spec)[1].gamma


def spec_gamma(spec: str, topology) -> Optional[float]:
    """The γ a spec runs with on `topology`: its own, else the topology's for "topology" algorithms,
    else None (a "tuned" algorithm without γ, or one that has no γ)."""
    _, entry, options = _entry(spec)
    value = options.get("gamma")
    gamma = parse_optional_float(value) if value is not None else None
    if gamma is not None:
        return gamma
    if entry.gamma != "topology":
        return None
    # a schedule has no one optimal step: its algorithms take 1 (exact.resolve_gamma)
    return float(topology.gamma) if hasattr(topology, "gamma") else 1.0


def with_option(spec: str, key: str, value: str) -> str:
    """The spec with option `key` set to `value` (added, or replacing the one it had)."""
    name, options = split_spec(spec)
    options[key] = value
    return name + ":" + ",".join(f"{k}=[{v}]" if "," in v else f"{k}={v}" for k, v in options.items())


def make_algorithm(spec: str, params, comm):
    """Build the algorithm a spec names, on `params`, talking through `comm`."""
    entry, kwargs = algorithm_kwargs(spec)
    return entry.factory(params, comm, **kwargs)


def describe_algorithms() -> str:
    lines = []
    for name in sorted(REGISTRY):
        entry = REGISTRY[name]
        keys = ",".join(sorted(entry.keys))
        lines.append(f"{name}{':' + keys if keys else ''}  {entry.summary}")
    return "\n".join(lines)
