"""Parsing the one-line spellings ("specs") of algorithms, compressors, datasets and models.

One grammar (`parse_spec`)::

    spec     := name [":" item ("," item)*]
    item     := key "=" value | value          (positional values first, by convention)
    value    := text without a top-level comma | "[" any text, brackets balanced "]"
    name     := word | module.path ":" attribute      (bring-your-own: "pkg.mod:fn")

``"topk:0.01"`` (a positional), ``"synthetic_logreg:d=5,n=1000"``, ``"mlp:100,100"``,
``"choco:compressor=[randomk:0.1,seed=3],gamma=0.4"`` (square brackets hold a value with commas
of its own, and are stripped), ``"resnet20:width=16"``, ``"package.module:function"`` and
``"package.module:function:width=32"`` (a name with a dot is a module path: its attribute belongs to
the name, which keeps its case). Errors are one line: ``<what> '<spec>': <problem>``. `split_spec`
(options only) and `parse_options` (typed options) are built on it; topology specs
(``topologies.parse``) use the same shape with colon-separated positional fields
(``small_world:16:4:0.2``), parsed in the topologies package, which sits below this one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

__all__ = [
    "TRUE_WORDS",
    "FALSE_WORDS",
    "DEFAULT_WORDS",
    "parse_bool",
    "parse_optional_float",
    "parse_typed",
    "SEED_MAX",
    "check_seed",
    "parse_seed",
    "split_name",
    "split_top_level",
    "Spec",
    "parse_spec",
    "split_spec",
    "parse_options",
    "import_object",
    "user_code",
    "UserCodeExit",
    "accepts",
]

#: Spellings of a boolean option, compared case-insensitively.
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
#: Spellings that mean "use the default" for an optional number (e.g. ``gamma=auto``).
DEFAULT_WORDS = ("none", "auto", "default")

#: The largest seed an algorithm or compressor accepts: seeds feed torch generators, whose seed is
#: a signed 64-bit integer, and larger values would otherwise wrap around and alias smaller ones.
SEED_MAX = (1 << 63) - 1

#: How `parse_typed` describes each kind in its error message.
_KIND_WORDS = {bool: "true or false", int: "an integer", float: "a number"}


def parse_bool(text: str) -> bool:
    """``"true"``/``"yes"``/``"on"``/``"1"`` -> True, their opposites -> False (any case)."""
    lowered = text.lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise ValueError(f"expected true/false, got {text!r}")


def parse_optional_float(text: str) -> Optional[float]:
    """A number, or None for ``"none"``/``"auto"``/``"default"`` (any case)."""
    return None if text.lower() in DEFAULT_WORDS else float(text)


def check_seed(seed, name: str = "seed") -> int:
    """`seed` as an int, refusing anything but an integer in [0, SEED_MAX] with a one-line
    ValueError that names `name` and the valid range."""
    valid = f"an integer in [0, {SEED_MAX}]"
    if isinstance(seed, bool):
        raise ValueError(f"{name} must be {valid}, got {seed!r}")
    try:
        value = int(seed)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be {valid}, got {seed!r}") from None
    if value != seed or not 0 <= value <= SEED_MAX:
        raise ValueError(f"{name} must be {valid}, got {seed!r}")
    return value


def parse_seed(text: str) -> int:
    """A seed option's value: a decimal integer in [0, SEED_MAX] (see `check_seed`)."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"seed must be an integer in [0, {SEED_MAX}], got {text!r}") from None
    return check_seed(value)


def _converter(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    # bool("false") is True: a boolean option must go through parse_bool, never through bool().
    return parse_bool if kind is bool else kind


def parse_typed(text: str, kind: Callable[[str], Any], name: str) -> Any:
    """Convert option `name`'s value with `kind` (bool, int, float or any parser).

    A value that does not convert raises a one-line ValueError such as
    ``"levels must be an integer, got '1.5'"``.
    """
    try:
        return _converter(kind)(text)
    except (TypeError, ValueError):
        what = _KIND_WORDS.get(kind, f"a valid {getattr(kind, '__name__', 'value')}")
        raise ValueError(f"{name} must be {what}, got {text!r}") from None


def split_name(spec: str) -> Tuple[str, Optional[str]]:
    """``"name:args"`` -> ``("name", "args")``; ``"name"`` -> ``("name", None)`` (both stripped)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"spec must be a non-empty string, got {spec!r}")
    head, sep, tail = spec.strip().partition(":")
    return head.strip(), (tail.strip() if sep else None)


def split_top_level(text: str) -> List[str]:
    """Split on commas outside square brackets, so nested specs can carry their own options."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


@dataclasses.dataclass(frozen=True)
class Spec:
    """A parsed spec: its name, positional values and key=value options (all text)."""

    name: str
    positional: Tuple[str, ...] = ()
    options: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def is_import(self) -> bool:
        """Whether the name is a bring-your-own ``"package.module:attribute"``."""
        return ":" in self.name


def _unbracket(value: str) -> str:
    return value[1:-1] if value.startswith("[") and value.endswith("]") else value


def parse_spec(spec: str, what: str = "spec") -> Spec:
    """`spec` split by the grammar of the module docstring; `what` names it in errors. A key given
    twice is an error (the intended value would be ambiguous); so are unbalanced brackets."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{what} must be a non-empty string, got {spec!r}")
    text = spec.strip()
    if text.count("[") != text.count("]"):
        raise ValueError(f"{what} {spec!r}: unbalanced square brackets")
    name, _, rest = text.partition(":")
    name = name.strip()
    if "." in name and rest:  # "pkg.mod:fn[:options]": the attribute belongs to the name
        attribute, _, rest = rest.partition(":")
        name = f"{name}:{attribute.strip()}"
    else:
        name = name.lower()
    positional: List[str] = []
    options: Dict[str, str] = {}
    for item in filter(None, (part.strip() for part in split_top_level(rest))):
        key, eq, value = item.partition("=")
        if not eq or "[" in key:  # a positional value (which may hold '=' inside brackets)
            positional.append(_unbracket(item))
            continue
        key = key.strip()
        if key in options:
            raise ValueError(f"{what} {spec!r}: option {key!r} is given twice; give it once")
        options[key] = _unbracket(value.strip())
    return Spec(name, tuple(positional), options)


def split_spec(spec: str, what: str) -> Tuple[str, Dict[str, str]]:
    """``"choco:compressor=topk:0.01,gamma=0.4"`` -> ``("choco", {"compressor": "topk:0.01",
    "gamma": "0.4"})``: the name (lower-cased unless it is a ``"package.module:attribute"``) and
    the options as strings, for a spec that takes options only (`parse_spec`; a positional value is
    refused).

    A value with commas of its own goes in square brackets, which are stripped:
    ``"choco:compressor=[randomk:0.1,seed=3],gamma=0.4"``. `what` names the spec in errors.
    """
    parsed = parse_spec(spec, what)
    if parsed.positional:
        raise ValueError(f"{what} {spec!r}: option {parsed.positional[0]!r} is not key=value")
    return parsed.name, dict(parsed.options)


def parse_options(
    spec: str, text: Optional[str], types: Mapping[str, Callable[[str], Any]]
) -> Dict[str, Any]:
    """Parse ``"k=v,k=v"`` (the part of `spec` after its colon) into a dict, converting each value
    with ``types[k]`` (``bool`` means `parse_bool`).

    Unknown or repeated keys and unparsable values raise a one-line ValueError naming the spec, so
    a typo in a config file is reported instead of silently falling back to a default.
    """
    options: Dict[str, Any] = {}
    if text is None or text == "":
        return options
    for item in split_top_level(text):  # the grammar's items (`parse_spec`)
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(
                f"{spec!r}: expected key=value, got {item!r} (valid keys: {', '.join(types)})"
            )
        if key not in types:
            raise ValueError(f"{spec!r}: unknown option {key!r} (valid keys: {', '.join(types)})")
        if key in options:
            raise ValueError(f"{spec!r}: option {key!r} is given twice; give it once")
        try:
            options[key] = _converter(types[key])(_unbracket(value.strip()))
        except (TypeError, ValueError):
            raise ValueError(
                f"{spec!r}: option {key}={value.strip()!r} is not a valid "
                f"{getattr(types[key], '__name__', 'value')}"
            ) from None
    return options


class UserCodeExit(ValueError):
    """User code called sys.exit/exit (see `user_code`); the callers' own wrapping lets it through."""


@contextlib.contextmanager
def user_code(spec: str, doing: str) -> Iterator[None]:
    """Run code a bring-your-own `spec` supplies (its module's import, its function, its model):
    a `SystemExit` it raises (``sys.exit()``, ``exit()``, even with status 0) becomes a one-line
    ValueError naming the spec. Let through, it would end the run reporting success (status 0)
    with nothing trained, or (from a peer thread) with no message at all."""
    try:
        yield
    except SystemExit as exc:
        code = "" if exc.code is None else repr(exc.code)
        raise UserCodeExit(
            f"{spec!r}: the user code called sys.exit/exit({code}) while {doing}; "
            "a dataset or model function must return its result (or raise an "
            "exception), never exit the process"
        ) from None


def import_object(spec: str, valid: Sequence[str]) -> Any:
    """Resolve a bring-your-own ``"package.module:attribute"`` spec to the callable it names.

    `valid` lists the built-in specs, for the error when `spec` is neither.
    """
    module_name, attr = split_name(spec)
    if not module_name or not attr:
        raise ValueError(f"unknown spec {spec!r}: valid are {', '.join(valid)}")
    try:
        with user_code(spec, f"importing module {module_name!r}"):
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"{spec!r}: cannot import module {module_name!r} ({exc}); "
            f"valid built-in specs are {', '.join(valid)}"
        ) from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{spec!r}: {attr!r} is not callable")
    return obj


def accepts(fn: Callable, name: str) -> bool:
    """Whether ``fn`` can be called with keyword argument ``name``."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # some builtins have no signature
        return False
    return any(
        p.name == name
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        or p.kind == p.VAR_KEYWORD
        for p in params
    )
