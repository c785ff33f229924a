"""The one spec grammar: how every one-line spelling (a "spec") of the project is cut into parts.

Algorithms, compressors, datasets, models, data partitions (``gossip_powersgd.specs`` re-exports
this module) and topologies (``topologies.parse``) all parse their specs here::

    spec     := name [":" item (SEP item)*]
    item     := key "=" value | value          (positional values first, by convention)
    value    := text without a top-level SEP | "[" any text, brackets balanced "]"
    name     := word | module.path ":" attribute      (bring-your-own: "pkg.mod:fn")

SEP is ``,`` for algorithms, compressors, datasets, models and partitions (``"topk:0.01"``,
``"synthetic_logreg:d=5,n=1000"``, ``"mlp:100,100"``, ``"choco:compressor=[randomk:0.1,seed=3]"``)
and ``:`` for a topology's positional fields (``"small_world:16:4:0.2"``, ``"random_regular:8:3"``;
``cyclic:`` lists its member specs with ``,``: ``"cyclic:ring:8,star:8"``). Square brackets hold a
value that contains the separator and are stripped (``"edge_sampling:[ring:16]:0.5"``). A name
with a dot is a module path whose attribute belongs to the name (``"pkg.mod:fn:width=32"``); any
other name is lower-cased.

Malformed specs raise a one-line ValueError in one style, ``<what> '<spec>': <problem>``
(`spec_error`), whoever parses them: unbalanced brackets, an empty item (two separators in a row,
or one at the end), a key given twice, an option with no name; and, through `unknown_option` and
`unknown_name`, a key or a name the kind does not know.

Why this module lives in ``topologies``: the grammar is plain text handling (no numpy, no torch),
and ``topologies`` is the lowest layer of the project: ``gossip_powersgd`` imports it, never the
reverse. Placing the grammar here lets both packages parse through the same code without a new
import edge (an upward import from ``topologies`` would be a circle) and without a third
distribution package to install and version.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, List, Mapping, Tuple

__all__ = [
    "Spec",
    "parse_spec",
    "parse_items",
    "split_top_level",
    "unbracket",
    "spec_error",
    "unknown_option",
    "unknown_name",
    "check_options",
]


def spec_error(what: str, spec: object, problem: str) -> ValueError:
    """The one error style: ``<what> '<spec>': <problem>`` (e.g. ``dataset spec 'x:y': ...``)."""
    return ValueError(f"{what} {spec!r}: {problem}")


def unknown_option(
    what: str, spec: object, key: str, valid: Iterable[str], hint: str = ""
) -> ValueError:
    """The error for option `key`, which the kind does not take; `valid` lists the ones it does,
    `hint` (if any) follows them: how the kind is spelled instead."""
    valid_text = ", ".join(valid) or "none"
    return spec_error(what, spec, f"unknown option {key!r}; valid: {valid_text}{hint}")


def unknown_name(what: str, spec: object, name: str, valid: Iterable[str]) -> ValueError:
    """The error for a name the kind does not know; `valid` lists the ones it does."""
    return spec_error(what, spec, f"unknown name {name!r}; valid: {', '.join(valid)}")


def split_top_level(text: str, separator: str = ",") -> List[str]:
    """Split on `separator` outside square brackets, so nested specs can carry their own."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == separator and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def unbracket(value: str) -> str:
    """``"[a,b]"`` -> ``"a,b"``: the brackets that protect a value's separators, stripped."""
    return value[1:-1] if value.startswith("[") and value.endswith("]") else value


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        depth += (char == "[") - (char == "]")
        if depth < 0:
            return False
    return depth == 0


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


def _is_key(key: str) -> bool:
    # A key is a plain word: "compressor" in "compressor=topk:0.01"; "[a=b]" or "file:x=y" (a
    # nested spec holding '=') is a positional value.
    return not any(char in key for char in "[]:")


def parse_items(
    text: str, what: str, spec: object, separator: str = ","
) -> Tuple[Tuple[str, ...], Dict[str, str]]:
    """The positional values and options of the part of `spec` after its name (`text`; empty or
    None means none). `what` and `spec` name the spec in errors."""
    positional: List[str] = []
    options: Dict[str, str] = {}
    if text is None or not text.strip():
        return (), options
    if not _balanced(text):
        raise spec_error(what, spec, "unbalanced square brackets")
    for raw in split_top_level(text, separator):
        item = raw.strip()
        if not item:
            raise spec_error(
                what,
                spec,
                f"empty item (two {separator!r} in a row, or one at an end); remove it",
            )
        key, eq, value = item.partition("=")
        if not eq or not _is_key(key):
            positional.append(unbracket(item))
            continue
        key = key.strip()
        if not key:
            raise spec_error(what, spec, f"option {item!r} has no name; write key=value")
        if key in options:
            raise spec_error(what, spec, f"option {key!r} is given twice; give it once")
        options[key] = unbracket(value.strip())
    return tuple(positional), options


def parse_spec(spec: str, what: str = "spec", separator: str = ",", imports: bool = True) -> Spec:
    """`spec` split by the grammar of the module docstring; `what` names it in errors.

    `separator` separates the items (``","``, or ``":"`` for a topology's fields); with
    `imports` False a dotted name is not a bring-your-own module path (topologies have none).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{what} must be a non-empty string, got {spec!r}")
    text = spec.strip()
    if not _balanced(text):
        raise spec_error(what, spec, "unbalanced square brackets")
    name, _, rest = text.partition(":")
    name = name.strip()
    if (
        imports and "." in name and rest
    ):  # "pkg.mod:fn[:options]": the attribute belongs to the name
        attribute, _, rest = rest.partition(":")
        name = f"{name}:{attribute.strip()}"
    else:
        name = name.lower()
    if not name:
        raise spec_error(what, spec, "the name is missing before ':'")
    positional, options = parse_items(rest, what, spec, separator)
    return Spec(name, positional, options)


def check_options(
    parsed: Spec, valid: Iterable[str], what: str, spec: object, hint: str = ""
) -> None:
    """Refuse any option of `parsed` whose key is not in `valid` (`unknown_option`, with `hint`)."""
    valid = list(valid)
    for key in parsed.options:
        if key not in valid:
            raise unknown_option(what, spec, key, valid, hint)
