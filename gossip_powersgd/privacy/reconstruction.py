"""Model reconstruction: what an observer can estimate of a neighbour's model from its recorded view.

`reconstruct(view, neighbor)` returns, for every recorded step t, an estimate of the neighbour's
parameters as they were when it sent its first message of step t (before that step's gossip),
using only the view (see `views`): the messages from the neighbour, the factors the observer shares
with it, the run's compressor and seeds, and the observer's own model.

  exact gossip   the message is the model: read it off (exact, bit for bit).
  DeepSqueeze    the decoded message c_j = C(x_j + delta_j), the estimate the protocol publishes.
  Choco          the public copy x_hat_j, rebuilt by adding every decoded q_j from step 0 on (so
                 the view must hold every step: observe_every = 1).
  PowerGossip    least squares over the last `window` messages (half-steps) from the neighbour.
                 A right half-step's message is Y = M_j Q, a left one's Z = M_j^T P, with Q, P the
                 shared factors the observer recorded. Assuming M_j constant over the window, the
                 estimate minimises  sum ||M Q - Y||^2 + sum ||M^T P - Z||^2, whose normal equations
                 are the Sylvester equation  A M + M B = C  with A = sum P P^T, B = sum Q Q^T,
                 C = sum Y Q^T + sum P Z^T. It is solved in the eigenbases of A and B; directions no
                 message measured (a_i + b_k = 0) keep the prior, the observer's own matrix, so the
                 estimate is the least-squares solution closest to the trivial one. At full rank one
                 half-step whose factor is square (Q for rows >= cols, P for rows <= cols) determines
                 M_j exactly: use window=1 there. A longer window measures more directions at low
                 rank but mixes measurements of a drifting M_j. Tensors PowerGossip sends exactly
                 are read off the step's first message.

On a schedule or a directed graph an edge may be idle in a step: the view then holds no message of
that neighbour for it (each record lists its `senders`), so there is no estimate for that step;
Choco's copy stays as it was (as it does at both ends of the edge) and PowerGossip's window stacks
the neighbour's last messages, whatever steps they came in, each with the side its edge had reached.

The trivial estimate is the observer's own model (`trivial_estimates`). `reconstruction_errors`
reports the relative error ||x_hat_j - x_j|| / ||x_j|| (all parameters as one vector) of both.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence

import torch

from gossip_powersgd.algorithms.compressed import CompressedMessages
from gossip_powersgd.compressors import parse_compressor
from gossip_powersgd.comm.base import Tensor
from gossip_powersgd.privacy.views import ObservedView

__all__ = ["DEFAULT_WINDOW", "reconstruct", "reconstruction_errors", "relative_error",
           "trivial_estimates"]

#: Half-steps of PowerGossip messages the least-squares estimate stacks by default.
DEFAULT_WINDOW = 4
#: Eigenvalue sums below this fraction of the largest count as directions no message measured.
_UNMEASURED = 1e-10


def _dtype(view: ObservedView) -> torch.dtype:
    return getattr(torch, view.meta["dtype"])


def _unflatten(flat: Tensor, shapes: Sequence[Sequence[int]]) -> List[Tensor]:
    out, offset = [], 0
    for shape in shapes:
        numel = 1
        for d in shape:
            numel *= int(d)
        out.append(flat[offset:offset + numel].reshape(shape).clone())
        offset += numel
    return out


def trivial_estimates(view: ObservedView) -> Dict[int, List[Tensor]]:
    """The trivial estimate of any neighbour: the observer's own model, at every recorded step."""
    return view.own_trajectory()


def _read_off(view: ObservedView, neighbor: int) -> Dict[int, List[Tensor]]:
    shapes = view.meta["shapes"]
    return {m["step"]: _unflatten(m["tensor"], shapes)
            for m in view.messages_from(neighbor) if m["exchange"] == 0}


def _decoder(view: ObservedView) -> CompressedMessages:
    meta = view.meta
    return CompressedMessages(parse_compressor(meta["compressor"]),
                              [torch.Size(s) for s in meta["shapes"]], _dtype(view),
                              torch.device("cpu"), [], int(meta["seed"]))


def _decode(view: ObservedView, decoder: CompressedMessages, message: Dict,
            sender: int) -> List[Tensor]:
    """The tensors `sender` encoded in `message`, decoded with its keys for the message's step."""
    outs = [torch.zeros(s, dtype=_dtype(view)) for s in view.meta["shapes"]]
    payload = message["tensor"]
    views = [payload[a:b] for a, b in zip(decoder.offsets, decoder.offsets[1:])]
    decoder.decode(views, outs, message["step"], sender)
    return outs


def _deepsqueeze(view: ObservedView, neighbor: int) -> Dict[int, List[Tensor]]:
    decoder = _decoder(view)
    return {m["step"]: _decode(view, decoder, m, neighbor) for m in view.messages_from(neighbor)}


def _choco(view: ObservedView, neighbor: int) -> Dict[int, List[Tensor]]:
    steps = view.steps
    if view.meta["observe_every"] != 1 or steps != list(range(len(steps))):
        raise ValueError("a Choco view must hold every step from step 0 (the public copy x_hat "
                         "adds up every message): record it with observe_every=1")
    decoder = _decoder(view)
    x_hat = [torch.zeros(s, dtype=_dtype(view)) for s in view.meta["shapes"]]
    estimates = {}
    for m in view.messages_from(neighbor):
        for total, q in zip(x_hat, _decode(view, decoder, m, neighbor)):
            total.add_(q)
        estimates[m["step"]] = [t.clone() for t in x_hat]
    return estimates


def _solve_group(window: Sequence[Dict], g: int, prior: Tensor, rows: int, cols: int,
                 blocks: Sequence[Tensor]) -> Tensor:
    """Least squares for group g's (batch, rows, cols) matrices from the window's messages and
    their blocks for the group, closest to `prior` in the directions no message measured."""
    batch = prior.shape[0]
    a_sum = torch.zeros(batch, rows, rows, dtype=torch.float64)
    b_sum = torch.zeros(batch, cols, cols, dtype=torch.float64)
    c_sum = torch.zeros(batch, rows, cols, dtype=torch.float64)
    for message, block in zip(window, blocks):
        factor = message["factors"][str(g)].double()
        block = block.double()
        if message["kind"] == "right":  # block = (M Q)^T, factor = Q (batch, cols, r)
            b_sum += factor @ factor.transpose(1, 2)
            c_sum += block.transpose(1, 2) @ factor.transpose(1, 2)
        else:  # block = (M^T P)^T = P^T M, factor = P (batch, rows, r)
            a_sum += factor @ factor.transpose(1, 2)
            c_sum += factor @ block
    m0 = prior.double()
    residual = c_sum - a_sum @ m0 - m0 @ b_sum
    a_eig, u = torch.linalg.eigh(a_sum)
    b_eig, v = torch.linalg.eigh(b_sum)
    denominator = a_eig.unsqueeze(2) + b_eig.unsqueeze(1)
    largest = denominator.flatten(1).amax(dim=1).clamp_min(0).view(batch, 1, 1)
    measured = denominator > _UNMEASURED * largest
    rotated = u.transpose(1, 2) @ residual @ v
    delta = torch.where(measured, rotated / torch.where(measured, denominator, 1.0), 0.0)
    return m0 + u @ delta @ v.transpose(1, 2)


def _powergossip(view: ObservedView, neighbor: int, window: int) -> Dict[int, List[Tensor]]:
    if isinstance(window, bool) or int(window) != window or window < 1:
        raise ValueError(f"window must be an integer >= 1 (half-steps to stack), got {window!r}")
    meta = view.meta
    shapes, groups, exact_indices = meta["shapes"], meta["groups"], meta["exact_indices"]
    dtype = _dtype(view)
    exact_numel = sum(torch.Size(shapes[k]).numel() for k in exact_indices)
    own = view.own_trajectory()
    messages = view.messages_from(neighbor)
    cut = []  # per message: (its block for each group, its exact part or None)
    for m in messages:
        blocks, offset = [], 0
        for indices, rows, cols, r in groups:
            width = rows if m["kind"] == "right" else cols
            size = len(indices) * r * width
            blocks.append(m["tensor"][offset:offset + size].view(len(indices), r, width))
            offset += size
        exact = m["tensor"][offset:offset + exact_numel] if m["tensor"].numel() > offset else None
        cut.append((blocks, exact))
    estimates: Dict[int, List[Tensor]] = {}
    last_of_step = {m["step"]: n for n, m in enumerate(messages)}
    first_of_step = {}
    for n, m in enumerate(messages):
        first_of_step.setdefault(m["step"], n)
    for step, last in last_of_step.items():
        estimate = [t.clone() for t in own[step]]
        chosen = list(range(max(0, last + 1 - int(window)), last + 1))
        for g, (indices, rows, cols, _) in enumerate(groups):
            prior = torch.stack([own[step][k].reshape(rows, cols) for k in indices])
            solved = _solve_group([messages[n] for n in chosen], g, prior, rows, cols,
                                  [cut[n][0][g] for n in chosen])
            for slot, k in enumerate(indices):
                estimate[k] = solved[slot].to(dtype).reshape(shapes[k])
        exact = cut[first_of_step[step]][1]
        if exact is not None and exact_indices:
            for k, value in zip(exact_indices, _unflatten(exact, [shapes[k] for k in exact_indices])):
                estimate[k] = value
        estimates[step] = estimate
    return estimates


def reconstruct(view: ObservedView, neighbor: int, window: int = DEFAULT_WINDOW
                ) -> Dict[int, List[Tensor]]:
    """The observer's estimate of `neighbor`'s parameters at every step the view holds a message
    of it for (see the module docstring; `window` is PowerGossip's only)."""
    name = view.meta["algorithm"]
    if name == "exact":
        return _read_off(view, neighbor)
    if name == "deepsqueeze":
        return _deepsqueeze(view, neighbor)
    if name == "choco":
        return _choco(view, neighbor)
    if name == "powergossip":
        return _powergossip(view, neighbor, window)
    raise ValueError(f"no reconstruction for algorithm {name!r}; supported: exact, powergossip, "
                     "choco, deepsqueeze")


def relative_error(estimate: Sequence[Tensor], truth: Sequence[Tensor]) -> float:
    """||estimate - truth|| / ||truth||, all parameters taken as one vector (in float64)."""
    difference = sum(float((e.double() - t.double()).pow(2).sum()) for e, t in zip(estimate, truth))
    norm = sum(float(t.double().pow(2).sum()) for t in truth)
    return (difference / norm) ** 0.5 if norm > 0 else float("inf") if difference > 0 else 0.0


def reconstruction_errors(view: ObservedView, neighbor: int,
                          truth: Mapping[int, Sequence[Tensor]], window: int = DEFAULT_WINDOW
                          ) -> Dict[str, List[float]]:
    """Relative errors over time of the reconstruction and of the trivial estimate.

    `truth` maps steps to the neighbour's true parameters then (e.g. the neighbour's own recorded
    view's `own_trajectory()`); steps missing from either side are left out. Returns {"steps",
    "estimate", "trivial"}, lists in step order.
    """
    estimates, trivial = reconstruct(view, neighbor, window), trivial_estimates(view)
    steps = [s for s in sorted(estimates) if s in truth]
    return {"steps": steps,
            "estimate": [relative_error(estimates[s], truth[s]) for s in steps],
            "trivial": [relative_error(trivial[s], truth[s]) for s in steps]}
