"""`make_algorithm("powergossip:rank=2,iters=1", params, comm)`: the CLI spelling of an algorithm.

The registry is the list `ALGORITHMS` of algorithm classes, each describing itself (see
`GossipAlgorithm`): its spec name, summary, options, γ source, whether it runs on directed
graphs, its label, its message layout and its config-time checks. `register(cls)` checks that a
class declares all of them and refuses it otherwise, with a message naming what is missing, so a
new algorithm is one file plus one line (`register(MyAlgorithm)`), checked at import.

A spec is `name` or `name:key=value,key=value` (`specs.split_spec`); anything but the class's
options is an error that lists what is valid.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Tuple, Union

from .. import specs

# Re-exported: algorithm option tables (and the experiments) parse their values with these.
from ..specs import parse_bool, parse_optional_float  # noqa: F401
from .allreduce import AllReduce, PowerSGDAllReduce
from .base import GossipAlgorithm, Option, constructor_defaults
from .choco import ChocoGossip
from .deepsqueeze import DeepSqueeze
from .exact import ExactGossip
from .layout import MessageLayout
from .powergossip import PowerGossip
from .pushsum import PushSum

if TYPE_CHECKING:
    from ..comm.base import Comm
    from topologies import AnyTopology

#: What an algorithm's γ is when its spec does not set one (`GossipAlgorithm.gamma_source`).
GAMMA_KINDS = ("topology", "tuned", "none")

#: The algorithms of the CLI, in the order `describe_algorithms` lists them (sorted by name).
ALGORITHMS = [
    ExactGossip,
    PowerGossip,
    ChocoGossip,
    DeepSqueeze,
    PushSum,
    AllReduce,
    PowerSGDAllReduce,
]

REGISTRY: Dict[str, type] = {}


def _takes_any_keyword(cls) -> bool:
    return any(p.kind == p.VAR_KEYWORD for p in inspect.signature(cls.__init__).parameters.values())


def declaration_problems(cls) -> list:
    """What `cls` fails to declare for the registry (empty when it is complete)."""
    if not (isinstance(cls, type) and issubclass(cls, GossipAlgorithm)):
        return [f"{cls!r} is not a GossipAlgorithm subclass"]
    problems = []
    own = vars(cls)
    name = own.get("name")
    if not isinstance(name, str) or not name or name != name.lower() or ":" in name or "," in name:
        problems.append("its own `name` (the spec name: lower case, no ':' or ',')")
    if not isinstance(own.get("summary"), str) or not own["summary"]:
        problems.append("its own `summary` (one line)")
    if not isinstance(cls.options, dict):
        problems.append("`options` (a dict of spec key -> Option; {} for none)")
    else:
        defaults = constructor_defaults(cls)
        for key, option in cls.options.items():
            if not isinstance(option, Option) or not callable(option.parse):
                problems.append(f"option {key!r} as an Option(argument, parse)")
            elif option.argument not in defaults and not _takes_any_keyword(cls):
                problems.append(
                    f"option {key!r}: its argument {option.argument!r} is not a keyword "
                    "of the constructor"
                )
    if cls.gamma_source not in GAMMA_KINDS:
        problems.append(f"`gamma_source` (one of {', '.join(GAMMA_KINDS)})")
    if not isinstance(cls.directed, bool):
        problems.append("`directed` (True if it runs on directed graphs)")
    if not callable(cls.label):
        problems.append("`label` (a classmethod: spec options -> legend label)")
    if not (
        isinstance(cls.layout, type)
        and issubclass(cls.layout, MessageLayout)
        and cls.layout is not MessageLayout
    ):
        problems.append("`layout` (a MessageLayout subclass saying what its messages hold)")
    return problems


def register(cls, *legacy, **legacy_keywords) -> type:
    """Add an algorithm class to the registry, after checking that it describes itself fully;
    returns the class (usable as a decorator). `register(name, factory, keys, summary, ...)`, the
    earlier form, still works (`register_factory`)."""
    if isinstance(cls, str):
        return register_factory(cls, *legacy, **legacy_keywords)
    problems = declaration_problems(cls)
    if problems:
        raise TypeError(
            f"algorithm class {getattr(cls, '__name__', cls)!s} cannot be registered: it "
            f"does not declare {'; '.join(problems)} (see GossipAlgorithm)"
        )
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise TypeError(f"algorithm name {cls.name!r} is taken by {REGISTRY[cls.name].__name__}")
    REGISTRY[cls.name] = cls
    return cls


for _cls in ALGORITHMS:
    register(_cls)


def split_spec(spec: str) -> Tuple[str, Dict[str, str]]:
    """An algorithm spec's lower-cased name and its options as strings (see `specs.split_spec`):
    "choco:compressor=[randomk:0.1,seed=3],gamma=0.4" -> ("choco", {"compressor": "randomk:0.1,seed=3",
    "gamma": "0.4"})."""
    return specs.split_spec(spec, "algorithm spec")


@dataclasses.dataclass(frozen=True, eq=False)
class AlgorithmSpec:
    """An algorithm spec parsed once (`parse_algorithm`): its text as written, the registered class
    it names, its options as written and the class's typed constructor keywords (PowerGossip's
    rank an int). A config's is `TrainConfig.algorithm_spec`; every function of this module takes
    one or the text."""

    text: str
    name: str
    cls: type
    options: Mapping[str, str]
    kwargs: Mapping[str, Any]

    def __str__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AlgorithmSpec) and (self.text, self.cls) == (other.text, other.cls)

    __hash__ = None

    def meaning(self) -> Tuple[str, Tuple[Tuple[str, str], ...]]:
        """What the spec builds, whatever its spelling: its name and the value of every option's
        constructor argument, the default where it sets none ("powergossip:iters=1,rank=1" and
        "powergossip:rank=1" mean the same). Values are compared by `repr` (a compressor's is its
        canonical spec)."""
        defaults = constructor_defaults(self.cls)
        values = {}
        for option in self.cls.options.values():
            value = self.kwargs.get(option.argument, defaults.get(option.argument))
            values[option.argument] = repr(value)
        return self.name, tuple(sorted(values.items()))

    def label(self) -> str:
        """The legend label: "exact gossip", "PowerGossip r1 K2", "Choco sign", ... (no γ)."""
        return self.cls.label(dict(self.options))

    def build(self, params, comm: Comm):
        """The algorithm on `params`, talking through `comm`."""
        return self.cls(params, comm, **self.kwargs)


#: {text: AlgorithmSpec}: each spec text is parsed once per process.
_PARSED: Dict[str, AlgorithmSpec] = {}


def parse_algorithm(spec: Union[str, AlgorithmSpec]) -> AlgorithmSpec:
    """The spec parsed and validated without building anything (so a config can be checked before
    training): an unknown name or option, or a bad value, is a one-line ValueError listing what is
    valid. An `AlgorithmSpec` is returned as it is; a text parsed before is not parsed again
    (while its name still names the same class)."""
    if isinstance(spec, AlgorithmSpec):
        return spec
    parsed = _PARSED.get(spec)
    if parsed is not None and REGISTRY.get(parsed.name) is parsed.cls:
        return parsed
    name, options = split_spec(spec)
    if name not in REGISTRY:
        raise specs.unknown_name("algorithm spec", spec, name, sorted(REGISTRY))
    cls = REGISTRY[name]
    kwargs: Dict[str, Any] = {}
    for key, value in options.items():
        if key not in cls.options:
            raise specs.unknown_option("algorithm spec", spec, key, sorted(cls.options))
        option = cls.options[key]
        try:
            kwargs[option.argument] = option.parse(value)
        except ValueError as exc:
            raise specs.spec_error(
                "algorithm spec", spec, f"bad value {value!r} for {key}: {exc}"
            ) from None
    parsed = AlgorithmSpec(
        spec, name, cls, types.MappingProxyType(options), types.MappingProxyType(kwargs)
    )
    _PARSED[spec] = parsed
    return parsed


def algorithm_class(name: str) -> type:
    """The registered class of an algorithm name (e.g. a recorded view's "algorithm")."""
    key = split_spec(name)[0]
    if key not in REGISTRY:
        raise specs.unknown_name("algorithm spec", name, key, sorted(REGISTRY))
    return REGISTRY[key]


def algorithm_kwargs(spec: Union[str, AlgorithmSpec]) -> Tuple[type, Dict[str, Any]]:
    """The spec's class and its constructor keywords (`parse_algorithm`)."""
    parsed = parse_algorithm(spec)
    return parsed.cls, dict(parsed.kwargs)


def algorithm_label(spec: Union[str, AlgorithmSpec]) -> str:
    """The legend label of a spec: "exact gossip", "PowerGossip r1 K2", "Choco sign", ... (no γ)."""
    return parse_algorithm(spec).label()


def gamma_kind(spec: Union[str, AlgorithmSpec]) -> str:
    """What the spec's γ is when it sets none: "topology", "tuned" or "none"."""
    return parse_algorithm(spec).cls.gamma_source


def spec_gamma(spec: Union[str, AlgorithmSpec], topology: AnyTopology) -> Optional[float]:
    """The γ a spec runs with on `topology`: its own, else the topology's for "topology" algorithms,
    else None (a "tuned" algorithm without γ, or one that has no γ)."""
    parsed = parse_algorithm(spec)
    value = parsed.options.get("gamma")
    gamma = parse_optional_float(value) if value is not None else None
    if gamma is not None:
        return gamma
    if parsed.cls.gamma_source != "topology":
        return None
    # a schedule has no one optimal step: its algorithms take 1 (exact.resolve_gamma)
    return float(topology.gamma) if hasattr(topology, "gamma") else 1.0


def check_directed(
    spec: Union[str, AlgorithmSpec], topology: AnyTopology, topology_spec: str
) -> None:
    """Refuse a directed topology (or schedule) for an algorithm that needs symmetric edges."""
    parsed = parse_algorithm(spec)
    if topology.is_directed and not parsed.cls.directed:
        raise ValueError(
            f"{parsed.name!r} needs symmetric edges, but topology {topology_spec!r} is "
            "directed; use algorithm pushsum (or an undirected topology)"
        )


def check_config(spec: Union[str, AlgorithmSpec], topology: AnyTopology) -> None:
    """The algorithm's own config-time checks (`GossipAlgorithm.check_config`) of a spec on the
    run's topology."""
    parsed = parse_algorithm(spec)
    parsed.cls.check_config(dict(parsed.kwargs), topology)


def with_option(spec: Union[str, AlgorithmSpec], key: str, value: str) -> str:
    """The spec with option `key` set to `value` (added, or replacing the one it had)."""
    name, options = split_spec(str(spec))
    options[key] = value
    return (
        name + ":" + ",".join(f"{k}=[{v}]" if "," in v else f"{k}={v}" for k, v in options.items())
    )


def make_algorithm(spec: Union[str, AlgorithmSpec], params, comm: Comm):
    """Build the algorithm a spec names, on `params`, talking through `comm`."""
    return parse_algorithm(spec).build(params, comm)


def describe_algorithms() -> str:
    lines = []
    for name in sorted(REGISTRY):
        cls = REGISTRY[name]
        keys = ",".join(sorted(cls.options))
        lines.append(f"{name}{':' + keys if keys else ''}  {cls.summary}")
    return "\n".join(lines)


def register_factory(
    name: str,
    factory: Callable[..., Any],
    keys: Dict[str, Tuple[str, Callable]],
    summary: str,
    *,
    gamma: str = "none",
    label: Optional[Callable[[Dict[str, str]], str]] = None,
) -> type:
    """Compatibility: the registry's earlier `register(name, factory, keys, summary, gamma=,
    label=)`. Declares those on a subclass of `factory` (a GossipAlgorithm class) whose messages
    observers cannot decode, and registers it."""
    from .layout import Undeclared

    declared = {
        "name": name,
        "summary": summary,
        "gamma_source": gamma,
        "options": {k: Option(argument, parse) for k, (argument, parse) in keys.items()},
        "directed": bool(factory.directed) if factory.directed is not None else False,
        "layout": factory.layout or Undeclared,
        "label": classmethod(lambda cls, options: label(options) if label else name),
        "__module__": factory.__module__,
        "__qualname__": factory.__qualname__,
    }
    return register(type(factory.__name__, (factory,), declared))
