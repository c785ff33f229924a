"""Every config key, documented from where it is declared: the one generator behind
`gossip-train --help-config` and the documentation's configuration reference.

The core keys' documentation is the ``#:`` comment above each field of `config._CoreConfig`; a
feature's keys carry theirs (`features.Key.doc`). `key_reference()` returns one `KeyDoc` per key
(name, type, default, meaning, the names a value may take where the code holds such a list, and
the feature and section it belongs to); `describe_keys()` prints them one a line.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, Dict, List, Optional, Tuple

from . import features as _features

__all__ = ["KeyDoc", "key_reference", "describe_keys", "CORE"]

#: `KeyDoc.group` of the core keys (a feature's keys carry the feature's name).
CORE = "core"


@dataclasses.dataclass(frozen=True)
class KeyDoc:
    """One config key as a reader needs it."""

    name: str
    #: how errors name its type ("string", "integer or null", "list of numbers", ...)
    type_name: str
    default: Any
    #: the documentation comment where the key is declared
    doc: str
    #: the values or spellings it accepts, where the code holds such a list (else empty)
    choices: Tuple[str, ...] = ()
    #: "core", or the name of the feature that declares it
    group: str = CORE
    #: the feature's section (``dp`` for ``dp: {noise_multiplier: 1.0}``) and the key's name in it
    section: Optional[str] = None
    nested: Optional[str] = None


def _core_docs() -> Dict[str, str]:
    """The ``#:`` comment above each field of `_CoreConfig`, joined into one line."""
    from .config import _FIELDS, _CoreConfig

    docs: Dict[str, str] = {}
    pending: List[str] = []
    for line in inspect.getsource(_CoreConfig).splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = re.match(r"(\w+):", stripped)
        if match and match.group(1) in _FIELDS and pending:
            docs[match.group(1)] = " ".join(pending)
        pending = []
    return docs


def _core_choices() -> Dict[str, Tuple[str, ...]]:
    """The names a core key accepts, from the lists the validation checks against."""
    from topologies import SPEC_USAGE

    from ..algorithms.registry import REGISTRY
    from .data import DATASET_NAMES
    from .models import MODEL_NAMES
    from .partition import PARTITION_NAMES
    from .validation import BACKENDS, OPTIMIZERS, SCHEDULES

    def algorithm(name: str) -> str:
        options = ",".join(f"{key}=..." for key in sorted(REGISTRY[name].options))
        return f"{name}:{options}" if options else name

    return {
        "topology": tuple(SPEC_USAGE.values()),
        "algorithm": tuple(algorithm(name) for name in sorted(REGISTRY)),
        "dataset": tuple(DATASET_NAMES),
        "partition": tuple(PARTITION_NAMES),
        "model": tuple(MODEL_NAMES),
        "optimizer": tuple(OPTIMIZERS),
        "schedule": tuple(SCHEDULES),
        "backend": tuple(BACKENDS),
        "device": ("cpu", "cuda", "cuda:K", "auto"),
    }


def key_reference() -> List[KeyDoc]:
    """Every key a config may set, in `valid_keys()` order: the core keys, then each feature's."""
    from .config import TrainConfig, _type_name, valid_keys

    docs = _core_docs()
    choices = _core_choices()
    defaults = TrainConfig().to_dict()
    owners = {key.name: (feature, key) for feature in _features.features() for key in feature.keys}
    out = []
    for name in valid_keys():
        if name in owners:
            feature, key = owners[name]
            section = feature.section
            out.append(
                KeyDoc(
                    name=name,
                    type_name=_type_name(name),
                    default=defaults[name],
                    doc=key.doc,
                    group=feature.name,
                    section=section,
                    nested=feature.nested_name(key) if section else None,
                )
            )
        else:
            out.append(
                KeyDoc(
                    name=name,
                    type_name=_type_name(name),
                    default=defaults[name],
                    doc=docs.get(name, ""),
                    choices=choices.get(name, ()),
                )
            )
    return out


def describe_keys() -> str:
    """`key (default)  documentation` for every key (`gossip-train --help-config`)."""
    return "\n".join(f"{k.name} ({k.default!r})  {k.doc}" for k in key_reference())
