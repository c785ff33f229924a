"""Parsing the one-line spellings ("specs") of algorithms, compressors, datasets, models and
data partitions.

The grammar itself lives in `topologies.grammar` (the lowest layer, so that topologies parse through
the same code; its docstring says why) and is re-exported here: `Spec`, `parse_spec`,
`parse_items`, `split_top_level`, `unbracket` and the error helpers `spec_error`,
`unknown_option`, `unknown_name` and `check_options`::

    spec     := name [":" item (SEP item)*]        SEP is "," here, ":" for topologies' fields
    item     := key "=" value | value          (positional values first, by convention)
    value    := text without a top-level SEP | "[" any text, brackets balanced "]"
    name     := word | module.path ":" attribute      (bring-your-own: "pkg.mod:fn")

``"topk:0.01"`` (a positional), ``"synthetic_logreg:d=5,n=1000"``, ``"mlp:100,100"``,
``"choco:compressor=[randomk:0.1,seed=3],gamma=0.4"`` (square brackets hold a value with commas
of its own, and are stripped), ``"resnet20:width=16"``, ``"package.module:function"`` and
``"package.module:function:width=32"`` (a name with a dot is a module path: its attribute belongs to
the name, which keeps its case). Topologies use ':' between positional fields
(``"small_world:16:4:0.2"``).

Every malformed spec of every kind fails with one line in one style, ``<what> '<spec>': <problem>``,
where `what` is ``"algorithm spec"``, ``"compressor spec"``, ``"topology spec"``,
``"dataset spec"``, ``"model spec"`` or ``"partition spec"``: unbalanced brackets, an empty item, a repeated key, an
unknown option, an unknown name. This module adds what the kinds above topologies share:
`split_spec` (options only), `parse_options` / `typed_options` (typed options), the value
parsers (`parse_bool`, `parse_typed`, `parse_seed`, ...) and bring-your-own imports
(`import_object`, `user_code`).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple

from topologies.grammar import (
    Spec,
    check_options,
    parse_items,
    parse_spec,
    spec_error,
    split_top_level,
    unbracket,
    unknown_name,
    unknown_option,
)

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
    "parse_items",
    "unbracket",
    "spec_error",
    "unknown_option",
    "unknown_name",
    "check_options",
    "split_spec",
    "parse_options",
    "typed_options",
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
        raise spec_error(what, spec, f"option {parsed.positional[0]!r} is not key=value")
    return parsed.name, dict(parsed.options)


def parse_options(
    spec: str,
    text: Optional[str],
    types: Mapping[str, Callable[[str], Any]],
    what: str = "spec",
) -> Dict[str, Any]:
    """Parse ``"k=v,k=v"`` (the part of `spec` after its name) by the grammar's items
    (`parse_items`) into a dict, converting each value with ``types[k]`` (``bool`` means
    `parse_bool`); `what` names the spec in errors (``"dataset spec"``).

    A positional value, an unknown or repeated key and an unparsable value raise a one-line
    ValueError in the grammar's style, so a typo in a config file is reported instead of silently
    falling back to a default.
    """
    positional, raw = parse_items(text, what, spec)
    return typed_options(Spec("", positional, raw), types, what, spec)


def typed_options(
    parsed: Spec, types: Mapping[str, Callable[[str], Any]], what: str, spec: str
) -> Dict[str, Any]:
    """The options of a parsed spec that takes ``key=value`` options only, each converted with
    ``types[key]`` (see `parse_options`)."""
    if parsed.positional:
        raise spec_error(
            what,
            spec,
            f"expected key=value, got {parsed.positional[0]!r} (valid keys: {', '.join(types)})",
        )
    check_options(parsed, types, what, spec)
    options: Dict[str, Any] = {}
    for key, value in parsed.options.items():
        try:
            options[key] = parse_typed(value, types[key], key)
        except ValueError as exc:
            raise spec_error(what, spec, str(exc)) from None
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
