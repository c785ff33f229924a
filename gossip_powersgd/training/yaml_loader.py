"""`strict_yaml_load`: yaml.safe_load with the limits a config file needs.

PyYAML's safe loader builds only plain data, but it still lets a duplicate key silently replace the
first one (`lr: 0.1` ... `lr: 0.5` trains with 0.5) and an alias bomb (nine anchors, each a list of
nine aliases of the previous one) stand for 9**9 values that the first walk over the config (its
hash, its validation) expands until the machine runs out of memory. Both are refused here, before
anything walks the data, as is a file far larger than any config. So is a number that YAML 1.1
reads otherwise than a reader does (`lr: 1:30` is base 60, 90; `peers: 010` octal, 8): a config's
numbers are written in decimal, and the refusal names the key (`_check_decimal`). `read_config_text`
reads a config file as UTF-8, naming the file where it is not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional, Set

import yaml

#: A config is a few hundred bytes; anything past this is not a config.
MAX_CONFIG_BYTES = 1 << 20
#: Values a config may stand for once every alias is expanded (a real one has a few dozen).
MAX_EXPANDED_NODES = 100_000


class _StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: Dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    continue  # the base class reports unhashable keys itself
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (lines {seen[key]} and {line}): each key "
                        "may appear once",
                        key_node.start_mark,
                    )
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node, memo: Dict[int, int]) -> int:
    """Number of values `node` stands for with every alias expanded (shared nodes counted each time)."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 1  # a cycle (a recursive anchor) counts once instead of recursing forever
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(child, memo) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    else:
        size = 1
    memo[key] = size
    return size


_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"


def _non_decimal(node) -> Optional[str]:
    """What kind of number the int or float scalar `node` is where YAML 1.1 reads its text in
    another base than 10 (None for a decimal number or anything else)."""
    if not isinstance(node, yaml.ScalarNode) or node.tag not in (_INT_TAG, _FLOAT_TAG):
        return None
    text = node.value.replace("_", "").lstrip("+-")
    if ":" in text:
        return "a base-60 (sexagesimal) number"
    if node.tag == _FLOAT_TAG:
        return None
    if text.startswith("0x"):
        return "a hexadecimal number"
    if text.startswith("0b"):
        return "a binary number"
    return "an octal number" if len(text) > 1 and text.startswith("0") else None


def _check_decimal(node, key: Optional[str], where: str, loader, seen: Set[int]) -> None:
    """Refuse a number written in another base than 10 anywhere under `node` (the value of `key`;
    None: the document itself), naming its key: YAML 1.1 reads `1:30` as 90 and `010` as 8, which
    is not what its writer meant (`lr: 1:30`, `peers: 010`). Hexadecimal and binary numbers are
    refused alike: one rule, numbers in decimal, and the message gives the value YAML read."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key_node, value in node.value:
            name = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
            _check_decimal(value, name if key is None else f"{key}.{name}", where, loader, seen)
    elif isinstance(node, yaml.SequenceNode):
        for child in node.value:
            _check_decimal(child, key, where, loader, seen)
    else:
        kind = _non_decimal(node)
        if kind is None:
            return
        read = loader.construct_object(node)
        at = "" if key is None else f"{key}: "
        line = "" if key is None else f" (line {node.start_mark.line + 1})"
        raise ValueError(
            f"{where}: {at}{node.value} is {kind} in YAML 1.1, read as {read}{line}; a config's "
            f"numbers are decimal: write the number you mean, or quote '{node.value}' for text"
        )


def _describe(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong and where (the library's text spans several lines)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        text = " ".join(filter(None, (exc.context, exc.problem)))
        if exc.problem_mark is not None and "line" not in exc.problem:
            text += f" at line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1}"
        return text
    return " ".join(str(exc).split())


def strict_yaml_load(text: str, where: str, decimal: bool = True) -> Any:
    """Parse YAML text as `yaml.safe_load` does, refusing duplicate keys, alias bombs, huge input
    and (`decimal`) a number not written in decimal (`_check_decimal`; off for the text of a string
    key's --set, which is taken as typed).

    Errors are `ValueError`s of one line that start with `where` (a file name or "--set key").
    """
    if len(text.encode("utf-8", errors="replace")) > MAX_CONFIG_BYTES:
        raise ValueError(
            f"{where}: {len(text)} characters is far more than a config holds "
            f"(the limit is {MAX_CONFIG_BYTES} bytes); is this the right file?"
        )
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {})
        if size > MAX_EXPANDED_NODES:
            raise ValueError(
                f"{where}: the YAML expands to {size} values through its aliases (a "
                f"YAML alias bomb?); a config may stand for at most "
                f"{MAX_EXPANDED_NODES}: write the values out"
            )
        if decimal:
            _check_decimal(node, None, where, loader, set())
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ValueError(f"{where}: not valid YAML ({_describe(exc)})") from None
    finally:
        loader.dispose()


def yaml11_float(value: Any, from_yaml: bool) -> Any:
    """`value` as a float where it is YAML text of one (YAML 1.1 reads 1e-3 and 1.5e2, without a
    dot or an exponent's sign, as strings); anything else, or a value set in code, as it is."""
    if from_yaml and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def read_config_text(path) -> str:
    """The text of the config file `path`, read as UTF-8; a one-line ValueError naming the file
    and the first byte that is not UTF-8 (Python's own message names neither)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"config file {str(path)!r} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} "
            f"at offset {exc.start}): save it as UTF-8"
        ) from None


__all__ = [
    "read_config_text",
    "strict_yaml_load",
    "yaml11_float",
    "MAX_CONFIG_BYTES",
    "MAX_EXPANDED_NODES",
]
