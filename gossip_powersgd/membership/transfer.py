"""Handing a joining peer its state: live transfer through the transport, raw tensors only.

At its admission step a joining peer (a new one, or one coming back) gets its state — model,
optimizer state, step counters: whatever the caller's `pack()` holds — from the members that
were members before the change (the survivors), in one of two modes (`JOIN_MODES`):

* ``average``: from every survivor among its neighbours in the new graph (its union graph, on a
  schedule), each floating tensor averaged over them in float64 (a complex one in complex128) in
  id order, every other tensor (counters) taken from the lowest id;
* ``copy``: from the lowest-id survivor among them alone.

A joiner without a surviving neighbour (all of them join with it) gets the state of the
lowest-id survivor. Each sender sends two messages: a header (two int64: the byte lengths of the
layout and of the data) and a body (the layout, a JSON list of [name, shape, dtype], then every
tensor's raw bytes back to back). Nothing is pickled; the layout is plain text, checked (known
dtypes: those the transports carry, `comm.dtypes`; sizes that add up) before any byte is read as a tensor. The messages go through
`MemberCommunicator.transfer`, counted as transfer traffic. A joiner waits for its first message
without a deadline (the survivors may be far behind it), the second one with the run's timeout.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Dict, List, Sequence, Tuple

import torch

from ..comm.base import DTYPE_CODES, CommunicationError

if TYPE_CHECKING:
    from ..comm.membership import MemberCommunicator

__all__ = ["JOIN_MODES", "senders_of", "pack_state", "unpack_state", "hand_over"]

JOIN_MODES = ("average", "copy")
#: The largest layout a joiner accepts (bytes of JSON text): far above any model's.
MAX_LAYOUT_BYTES = 1 << 24
_DTYPE_NAMES = {str(dtype): dtype for dtype in DTYPE_CODES}


def senders_of(joiner: int, graph, survivors: Sequence[int], mode: str) -> Tuple[int, ...]:
    """Who hands `joiner` its state (module docstring): survivors among its neighbours in
    `graph`'s union, the lowest of them in mode "copy"; the lowest survivor if there is none."""
    around = [j for j in graph.union.neighbors(joiner) if j in set(survivors)]
    if not around:
        return (min(survivors),)
    return (around[0],) if mode == "copy" else tuple(around)


def pack_state(state: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(header, body) of `state` (module docstring)."""
    layout = [[name, list(t.shape), str(t.dtype)] for name, t in state.items()]
    for name, _, dtype in layout:
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"state {name!r} has dtype {dtype}, which cannot be transferred")
    text = torch.frombuffer(bytearray(json.dumps(layout).encode()), dtype=torch.uint8)
    parts = [
        t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8) for t in state.values()
    ]
    data = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)
    header = torch.tensor([text.numel(), data.numel()], dtype=torch.int64)
    return header, torch.cat([text, data])


def _layout(header: torch.Tensor, body: torch.Tensor, source: int) -> List[tuple]:
    size = int(header[0])
    try:
        layout = json.loads(bytes(body[:size].numpy().tobytes()).decode())
        entries = [(str(n), tuple(int(d) for d in s), _DTYPE_NAMES[t]) for n, s, t in layout]
    except (ValueError, KeyError, TypeError) as exc:
        raise CommunicationError(f"the state from peer {source} has a bad layout ({exc})") from None
    total = sum(
        torch.Size(s).numel() * torch.empty((), dtype=t).element_size() for _, s, t in entries
    )
    if any(d < 0 for _, s, _ in entries for d in s) or total != int(header[1]):
        raise CommunicationError(f"the state from peer {source} does not add up to its size")
    return entries


def unpack_state(header: torch.Tensor, body: torch.Tensor, source: int) -> Dict[str, torch.Tensor]:
    """The tensors of one sender's (header, body), checked against the layout it describes."""
    entries = _layout(header, body, source)
    offset, state = int(header[0]), {}
    for name, shape, dtype in entries:
        count = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        state[name] = body[offset : offset + count].clone().view(dtype).view(shape)
        offset += count
    return state


def _combine(
    states: List[Dict[str, torch.Tensor]], senders: Sequence[int]
) -> Dict[str, torch.Tensor]:
    first = states[0]
    for source, other in zip(senders[1:], states[1:]):
        if [(k, v.shape, v.dtype) for k, v in other.items()] != [
            (k, v.shape, v.dtype) for k, v in first.items()
        ]:
            raise CommunicationError(
                f"peers {senders[0]} and {source} handed different state layouts to a joiner"
            )
    out = {}
    for name, tensor in first.items():
        if (tensor.is_floating_point() or tensor.is_complex()) and len(states) > 1:
            wide = torch.complex128 if tensor.is_complex() else torch.float64
            total = torch.zeros(tensor.shape, dtype=wide)
            for state in states:  # in id order: the same bits wherever it runs
                total.add_(state[name].to(wide))
            out[name] = total.div_(len(states)).to(tensor.dtype)
        else:
            out[name] = tensor
    return out


def hand_over(
    comm: MemberCommunicator,
    me: int,
    joiners: Sequence[int],
    graph,
    survivors: Sequence[int],
    mode: str,
    pack,
):
    """One membership change's transfers, on every member of the new epoch (collective over
    them): a survivor sends `pack()` to each joiner it serves; a joiner returns what it got
    (combined by `mode`), everyone else None. `comm` is the `MemberCommunicator`."""
    if mode not in JOIN_MODES:
        raise ValueError(f"unknown join mode {mode!r}; valid: {', '.join(JOIN_MODES)}")
    plan = {k: senders_of(k, graph, survivors, mode) for k in joiners}
    served = [k for k, senders in plan.items() if me in senders]
    mine = plan.get(me, ())
    if not served and not mine:
        return None
    header, body = pack_state(pack()) if served else (None, None)
    headers = {j: torch.empty(2, dtype=torch.int64) for j in mine}
    comm.transfer({k: header for k in served}, headers, wait=bool(mine))
    if mine:  # what a header may announce: a few times this peer's own state (model, optimizer)
        limit = 4 * sum(t.numel() * t.element_size() for t in pack().values()) + (1 << 20)
    for j, h in headers.items():
        if not (0 <= int(h[0]) <= MAX_LAYOUT_BYTES and 0 <= int(h[1]) <= limit):
            raise CommunicationError(
                f"the state header from peer {j} announces {h.tolist()} bytes (layout, data): "
                f"out of range (at most {MAX_LAYOUT_BYTES}, {limit})"
            )
    bodies = {j: torch.empty(int(h.sum()), dtype=torch.uint8) for j, h in headers.items()}
    comm.transfer({k: body for k in served}, bodies)
    if not mine:
        return None
    return _combine([unpack_state(headers[j], bodies[j], j) for j in mine], list(mine))
