"""`Registry`: the one shape of every extension point (transports, datasets, models, privacy
mechanisms; algorithms have their own, `algorithms/registry.py`, which this follows).

An entry is a class that describes itself: its `name` (what a config or spec writes), a one-line
`summary`, its `options` (spec key -> `Setting`: type, default, help) and whatever its kind asks
for (`Registry.required`). `register(cls)` checks the declaration and refuses an incomplete or
clashing one with a message naming what is missing, so a new entry is one file plus one
`register(...)` line; lookups refuse an unknown name with the list of the registered ones, and
`--help-config` prints every registry (`cli.help.describe_registries`). This module imports none
of the registries' modules (they import it) and not torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from .specs import parse_spec

__all__ = ["Setting", "Registry", "REGISTRIES", "HELP_ORDER"]


@dataclasses.dataclass(frozen=True)
class Setting:
    """One option of an entry's spec (``name:key=value``): its type, its default (None: the
    entry's own choice, said in `help`) and one line of help."""

    type: type
    default: Any = None
    help: str = ""


def option_types(options: Dict[str, Setting]) -> Dict[str, type]:
    """{key: type} of an entry's options (what `specs.typed_options` parses with)."""
    return {key: setting.type for key, setting in options.items()}


def with_defaults(options: Dict[str, Setting], given: Dict[str, Any]) -> Dict[str, Any]:
    """The options a spec gave, with every other option's default (None where it has none)."""
    return {**{key: setting.default for key, setting in options.items()}, **given}


def _usage(entry, with_options: bool = True) -> str:
    """How a config spells `entry`: its own `usage`, else its name and options with their types
    (``vgg16[:bn=<bool>,width=<int>,dropout=<float>]``), or the bare name."""
    usage = getattr(entry, "usage", None)
    if usage:
        return usage
    options = getattr(entry, "options", None) or {}
    if not (with_options and options):
        return entry.name
    return f"{entry.name}[:{','.join(f'{k}=<{s.type.__name__}>' for k, s in options.items())}]"


class Registry:
    """The entries of one kind, by name, in registration order.

    `kind` names an entry in errors ("transport"); `key` is the config key that selects one
    ("backend"); `required` maps each attribute an entry must declare to what it is; `base` is the
    class every entry derives from; `extra` the accepted values that are no entry (a
    bring-your-own ``package.module:function``), listed after the names."""

    def __init__(
        self,
        kind: str,
        key: str,
        base: type,
        required: Optional[Dict[str, str]] = None,
        extra: Sequence[str] = (),
        check: Optional[Callable[[type], List[str]]] = None,
    ):
        self.kind, self.key, self.base = kind, key, base
        self.required = {
            "name": "the name a config gives",
            "summary": "one line",
            **(required or {}),
        }
        self.extra = tuple(extra)
        self._check = check
        self.entries: Dict[str, Any] = {}
        REGISTRIES.append(self)

    # ---- registration ----------------------------------------------------------------------------

    def problems(self, cls) -> List[str]:
        """What `cls` fails to declare (empty when it may be registered)."""
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            return [f"{cls!r} is not a {self.base.__name__} subclass"]
        found = []
        name = vars(cls).get("name")
        if not isinstance(name, str) or not name or name != name.lower() or set(name) & set(":,="):
            found.append("its own `name` (lower case, no ':', ',' or '=')")
        for attribute, what in self.required.items():
            value = getattr(cls, attribute, None)
            inherited = callable(value) and value is getattr(self.base, attribute, None)
            if attribute != "name" and (value is None or inherited):  # a method: overridden
                found.append(f"`{attribute}` ({what})")
        options = getattr(cls, "options", {})
        if not isinstance(options, dict) or not all(
            isinstance(s, Setting) for s in options.values()
        ):
            found.append("`options` (a dict of spec key -> Setting; {} for none)")
        return found + (self._check(cls) if self._check else [])

    def register(self, cls: type) -> type:
        """Add the entry class `cls` (checked, see `problems`); returns it (a decorator too)."""
        problems = self.problems(cls)
        if problems:
            raise TypeError(
                f"{self.kind} {getattr(cls, '__name__', cls)!s} cannot be registered: it does "
                f"not declare {'; '.join(problems)} (see {self.base.__name__})"
            )
        taken = self.entries.get(cls.name)
        if taken is not None and type(taken) is not cls:
            raise TypeError(f"{self.kind} name {cls.name!r} is taken by {type(taken).__name__}")
        self.entries[cls.name] = cls()
        return cls

    def unregister(self, name: str) -> None:
        """Remove an entry (tests that register a toy one put the registry back as shipped)."""
        self.entries.pop(name, None)

    # ---- lookups ---------------------------------------------------------------------------------

    def names(self) -> tuple:
        return tuple(self.entries)

    def accepted(self) -> tuple:
        """What a config may write: each entry's usage, then `extra`."""
        return tuple(_usage(e) for e in self.entries.values()) + self.extra

    def get(self, name: str):
        """The entry named `name`; an unknown name is a one-line ValueError listing the valid."""
        entry = self.entries.get(name)
        if entry is None:
            raise ValueError(
                f"unknown {self.key} {name!r}; valid: {', '.join(self.names() + self.extra)}"
            )
        return entry

    def meaning(self, spec: str) -> tuple:
        """What `spec` (a value of `key`) selects, whatever its spelling, for a resume to compare:
        an entry with options, its name and every option's value (defaults filled in by the
        entry's `parse`: "synthetic_logreg:d=20,classes=4" and "synthetic_logreg:classes=4,d=20,
        noise=0.1" mean the same); anything else (an entry without options, a bring-your-own
        spec) its name, positional values and options in sorted order. A ValueError for a spec
        that does not parse."""
        what = f"{self.key} spec"
        parsed = parse_spec(spec, what)
        entry = self.entries.get(parsed.name)
        if entry is not None and getattr(entry, "options", None) and hasattr(entry, "parse"):
            values = entry.parse(spec, parsed)
            return parsed.name, tuple(sorted((k, repr(v)) for k, v in values.items()))
        return parsed.name, parsed.positional, tuple(sorted(parsed.options.items()))

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __iter__(self) -> Iterator[Any]:
        return iter(self.entries.values())

    def describe(self) -> str:
        """`key` values, one entry a line: usage, summary, then each option with its default."""
        lines = [f"{self.key}: one of"]
        for entry in self.entries.values():
            lines.append(f"  {_usage(entry, with_options=False)}  {entry.summary}")
            for key, setting in (getattr(entry, "options", None) or {}).items():
                default = "" if setting.default is None else f" (default {setting.default!r})"
                lines.append(f"      {key}: {setting.type.__name__}{default}  {setting.help}")
        lines += [f"  {extra}" for extra in self.extra]
        return "\n".join(lines)


#: Every registry, in the order their modules were imported.
REGISTRIES: List[Registry] = []
#: The config keys in the order `--help-config` lists their registries (any other after them).
HELP_ORDER = ("backend", "dataset", "model", "dp_mechanism")
