"""The CLI spelling of a compressor (``"topk:0.01"``, ``"lowrank:2,iterations=2"``): :func:`parse_compressor`."""

from __future__ import annotations

from typing import Dict, Tuple, Type

from ..specs import parse_spec, parse_typed, spec_error, unknown_name, unknown_option
from .base import Compressor, Identity
from .lowrank import LowRank
from .quantized import QSGD, SignNorm
from .sparse import RandomK, TopK


_SPECS: Dict[str, Tuple[Type[Compressor], Tuple[Tuple[str, type], ...]]] = {
    "identity": (Identity, ()),
    "topk": (TopK, (("ratio", float),)),
    "randomk": (RandomK, (("ratio", float), ("seed", int), ("scaled", bool))),
    "sign": (SignNorm, ()),
    "qsgd": (QSGD, (("levels", int),)),
    "lowrank": (LowRank, (("rank", int), ("iterations", int))),
}


def parse_compressor(spec) -> Compressor:
    """Build a compressor from its CLI spelling, e.g. ``"topk:0.01"`` or ``"lowrank:2,iterations=2"``.

    Grammar: ``name[:arg][,key=value...]`` (or ``name:key=value,...``), where the positional ``arg``
    is the first parameter: ``identity``, ``topk:RATIO``, ``randomk:RATIO[,seed=INT][,scaled=BOOL]``,
    ``sign``, ``qsgd:LEVELS``, ``lowrank:RANK[,iterations=INT]``. ``repr()`` of every compressor
    returns this spelling. A :class:`Compressor` instance is returned unchanged.
    """
    if isinstance(spec, Compressor):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"compressor spec must be a string, got {spec!r}")
    what = "compressor spec"
    parsed = parse_spec(spec, what)  # the one spec grammar (topologies.grammar, via specs.py)
    name = parsed.name
    if name not in _SPECS:
        raise unknown_name(what, spec, name, _SPECS)
    cls, params = _SPECS[name]
    kinds = dict(params)
    kwargs = {}
    if len(parsed.positional) > (1 if params else 0):
        item = parsed.positional[1 if params else 0]
        raise spec_error(what, spec, f"cannot parse {item!r}; expected key=value")
    items = [(params[0][0], value) for value in parsed.positional] + list(parsed.options.items())
    for key, value in items:
        if key not in kinds:
            raise unknown_option(what, spec, key, kinds)
        if key in kwargs:
            raise spec_error(what, spec, f"option {key!r} is given twice; give it once")
        try:
            kwargs[key] = parse_typed(value, kinds[key], key)
        except ValueError as exc:
            raise spec_error(what, spec, str(exc)) from None
    if params and params[0][0] not in kwargs:
        required = params[0][0]
        raise spec_error(what, spec, f"{name} needs {required}, e.g. {name}:<{required}>")
    return cls(**kwargs)
