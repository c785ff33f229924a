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

import inspect
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

from .. import specs

# Re-exported: algorithm option tables (and the experiments) parse their values with these.
from ..specs import parse_bool, parse_optional_float  # noqa: F401
from .allreduce import AllReduce, PowerSGDAllReduce
from .base import GossipAlgorithm, Option
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


def constructor_defaults(cls) -> Dict[str, Any]:
    """The constructor's keyword arguments and their defaults (`inspect.Parameter.empty` for
    none): the defaults of the spec options that set them."""
    parameters = inspect.signature(cls.__init__).parameters
    return {
        name: p.default
        for name, p in parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


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


def _entry(spec: str) -> Tuple[str, type, Dict[str, str]]:
    name, options = split_spec(spec)
    if name not in REGISTRY:
        raise specs.unknown_name("algorithm spec", spec, name, sorted(REGISTRY))
    return name, REGISTRY[name], options


def algorithm_class(name: str) -> type:
    """The registered class of an algorithm name (e.g. a recorded view's "algorithm")."""
    return _entry(name)[1]


def algorithm_kwargs(spec: str) -> Tuple[type, Dict[str, Any]]:
    """The spec's class and its constructor keywords, validated without building anything (so a
    config can be checked before training)."""
    name, cls, options = _entry(spec)
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
    return cls, kwargs


def algorithm_label(spec: str) -> str:
    """The legend label of a spec: "exact gossip", "PowerGossip r1 K2", "Choco sign", ... (no γ)."""
    _, cls, options = _entry(spec)
    return cls.label(options)


def gamma_kind(spec: str) -> str:
    """What the spec's γ is when it sets none: "topology", "tuned" or "none"."""
    return _entry(spec)[1].gamma_source


def spec_gamma(spec: str, topology: AnyTopology) -> Optional[float]:
    """The γ a spec runs with on `topology`: its own, else the topology's for "topology" algorithms,
    else None (a "tuned" algorithm without γ, or one that has no γ)."""
    _, cls, options = _entry(spec)
    value = options.get("gamma")
    gamma = parse_optional_float(value) if value is not None else None
    if gamma is not None:
        return gamma
    if cls.gamma_source != "topology":
        return None
    # a schedule has no one optimal step: its algorithms take 1 (exact.resolve_gamma)
    return float(topology.gamma) if hasattr(topology, "gamma") else 1.0


def check_directed(spec: str, topology: AnyTopology, topology_spec: str) -> None:
    """Refuse a directed topology (or schedule) for an algorithm that needs symmetric edges."""
    name, cls, _ = _entry(spec)
    if topology.is_directed and not cls.directed:
        raise ValueError(
            f"{name!r} needs symmetric edges, but topology {topology_spec!r} is "
            "directed; use algorithm pushsum (or an undirected topology)"
        )


def check_config(spec: str, topology: AnyTopology) -> None:
    """The algorithm's own config-time checks (`GossipAlgorithm.check_config`) of a spec on the
    run's topology."""
    cls, kwargs = algorithm_kwargs(spec)
    cls.check_config(kwargs, topology)


def with_option(spec: str, key: str, value: str) -> str:
    """The spec with option `key` set to `value` (added, or replacing the one it had)."""
    name, options = split_spec(spec)
    options[key] = value
    return (
        name + ":" + ",".join(f"{k}=[{v}]" if "," in v else f"{k}={v}" for k, v in options.items())
    )


def make_algorithm(spec: str, params, comm: Comm):
    """Build the algorithm a spec names, on `params`, talking through `comm`."""
    cls, kwargs = algorithm_kwargs(spec)
    return cls(params, comm, **kwargs)


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
