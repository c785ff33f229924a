"""Torch optimizers that do not import torch's compiler until something compiles.

In torch 2.x, ``torch.optim`` imports ``torch._dynamo`` (torch.compile's tracer) the first time an
optimizer is built or steps, although nothing is being compiled: ``add_param_group``,
``zero_grad``, ``state_dict`` and ``load_state_dict`` are wrapped by ``torch._disable_dynamo``,
which imports it to mark them "not to be traced", and ``step`` by ``_use_grad_for_differentiable``,
which imports it to call ``torch._dynamo.graph_break()``, a no-op outside a trace. That import
costs as much CPU as ``import torch`` itself (about 1.5 s here) in every process: under
``mpiexec -n 8`` on 2 cores it was most of the "model ... built" set-up phase of an
11,786-parameter CNN (8-13 s).

`defer_compiler_import(cls)` changes those wrappers, for the optimizer class `cls` and the base
class, so that while ``torch._dynamo`` is not imported they call the method directly (``step``
with the same grad mode torch's wrapper sets), and once it is imported they do exactly what torch
does. Nothing can be tracing before ``torch._dynamo`` is imported (tracing imports it), so every
call behaves as before, bit for bit. A torch whose wrappers are not built as recognised here is
left untouched (the import then simply happens, as it always did).
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Callable

#: The methods of torch.optim.Optimizer that torch wraps with torch._disable_dynamo.
DISABLED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")
#: The attribute torch._disable_dynamo caches its disabled function in (torch/_compile.py).
CACHE = "__dynamo_disable"
#: Marks a step this module rebuilt.
MARK = "_gossip_eager_step"

_lock = threading.Lock()


def _compiler_loaded() -> bool:
    return "torch._dynamo" in sys.modules


def _deferred_disable(fn: Callable) -> Callable:
    """What torch._disable_dynamo's wrapper calls for `fn`: `fn` itself until torch._dynamo is
    imported, then (cached, as torch does) torch._dynamo.disable(fn)."""
    disabled = []

    def call(*args, **kwargs):
        if not disabled:
            if not _compiler_loaded():  # nothing compiles: nothing to disable
                return fn(*args, **kwargs)
            import torch._dynamo

            disabled.append(torch._dynamo.disable(fn, True, wrapping=False))
        return disabled[0](*args, **kwargs)

    return call


def _eager_step(use_grad: Callable, raw: Callable) -> Callable:
    """torch's `_use_grad` wrapper of a step (`use_grad`, around `raw`), without its graph breaks
    while torch._dynamo is not imported; torch's own once it is."""
    import torch

    @functools.wraps(raw)
    def step(*args, **kwargs):
        if _compiler_loaded():
            return use_grad(*args, **kwargs)
        previous = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(args[0].defaults["differentiable"])
            return raw(*args, **kwargs)
        finally:
            torch.set_grad_enabled(previous)

    return step


def _patch_step(cls: type) -> None:
    import torch

    step = cls.__dict__.get("step")
    if step is None or getattr(step, MARK, False):
        return
    hooked = getattr(step, "hooked", False)  # wrapped by Optimizer.profile_hook_step already
    use_grad = getattr(step, "__wrapped__", None) if hooked else step
    raw = getattr(use_grad, "__wrapped__", None)
    code = getattr(use_grad, "__code__", None)
    if raw is None or code is None or code.co_name != "_use_grad":
        return  # not torch's wrapper as this module knows it
    new = _eager_step(use_grad, raw)
    if hooked:
        new = torch.optim.Optimizer.profile_hook_step(new)
        new.hooked = True
    setattr(new, MARK, True)
    cls.step = new


def defer_compiler_import(cls: type) -> None:
    """Let optimizers of class `cls` (a torch.optim.Optimizer subclass) build and step without
    importing torch._dynamo until something compiles (idempotent, process-wide)."""
    import torch

    with _lock:
        for name in DISABLED:
            fn = getattr(getattr(torch.optim.Optimizer, name, None), "__wrapped__", None)
            if fn is not None and getattr(fn, CACHE, None) is None:
                setattr(fn, CACHE, _deferred_disable(fn))
        _patch_step(cls)


__all__ = ["defer_compiler_import", "DISABLED"]
