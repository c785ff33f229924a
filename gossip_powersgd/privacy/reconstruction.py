"""Model reconstruction: what an observer can estimate of a neighbour's model from its recorded view.

`reconstruct(view, neighbor)` returns, for every recorded step t, an estimate of the neighbour's
parameters as they were when it sent its first message of step t (before that step's gossip),
using only the view (see `views`): the messages from the neighbour, decoded through the layout
the algorithm declares (`algorithms.layout`: no algorithm is named here), the factors the
observer shares with it, the run's compressor and seeds, and the observer's own model. Each
decoded `Part` says what it carries, and that alone decides the estimate of its tensors:

  "model"        the message holds the tensors: read them off (exact gossip: bit for bit; the
                 tensors PowerGossip sends exactly, from the step's first message; push-sum's x/w).
  "estimate"     a published estimate of them (DeepSqueeze's c_j = C(x_j + delta_j)): take it.
  "increment"    an increment of the copy the observer keeps (Choco's q_j; x_hat_j starts at
                 zero): the sum of every increment from step 0 on, so the view must hold every
                 step (observe_every = 1).
  "right"/"left" low-rank products (PowerGossip): least squares over the last `window` such
                 messages from the neighbour. A right half-step's message is Y = M_j Q, a left
                 one's Z = M_j^T P, with Q, P the shared factors the observer recorded. Assuming
                 M_j constant over the window, the estimate minimises
                 sum ||M Q - Y||^2 + sum ||M^T P - Z||^2, whose normal equations are the Sylvester
                 equation  A M + M B = C  with A = sum P P^T, B = sum Q Q^T,
                 C = sum Y Q^T + sum P Z^T. It is solved in the eigenbases of A and B; directions no
                 message measured (a_i + b_k = 0) keep the prior, the observer's own matrix, so the
                 estimate is the least-squares solution closest to the trivial one. At full rank one
                 half-step whose factor is square (Q for rows >= cols, P for rows <= cols) determines
                 M_j exactly: use window=1 there. A longer window measures more directions at low
                 rank but mixes measurements of a drifting M_j.

Tensors no part carries keep the trivial estimate.

On a schedule or a directed graph an edge may be idle in a step: the view then holds no message of
that neighbour for it (each record lists its `senders`), so there is no estimate for that step;
an increment copy stays as it was (as it does at both ends of the edge) and the least-squares
window stacks the neighbour's last messages, whatever steps they came in, each with the side its
edge had reached.

The trivial estimate is the observer's own model (`trivial_estimates`). `reconstruction_errors`
reports the relative error ||x_hat_j - x_j|| / ||x_j|| (all parameters as one vector) of both.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence

import torch

from gossip_powersgd.comm.base import Tensor
from gossip_powersgd.privacy.views import ObservedView

__all__ = [
    "DEFAULT_WINDOW",
    "decoded_messages",
    "reconstruct",
    "reconstruction_errors",
    "relative_error",
    "trivial_estimates",
]

#: Half-steps of PowerGossip messages the least-squares estimate stacks by default.
DEFAULT_WINDOW = 4
#: Eigenvalue sums below this fraction of the largest count as directions no message measured.
_UNMEASURED = 1e-10
_PRODUCTS = ("right", "left")


def trivial_estimates(view: ObservedView) -> Dict[int, List[Tensor]]:
    """The trivial estimate of any neighbour: the observer's own model, at every recorded step."""
    return view.own_trajectory()


def decoded_messages(view: ObservedView, neighbor: int) -> List[tuple]:
    """`neighbor`'s messages in arrival order, each as (message, its decoded parts)."""
    return [(m, view.decode(m)) for m in view.messages_from(neighbor)]


def _solve_group(window: Sequence, prior: Tensor) -> Tensor:
    """Least squares for a group's (batch, rows, cols) matrices from the window's product parts,
    closest to `prior` in the directions no message measured."""
    batch, rows, cols = prior.shape
    a_sum = torch.zeros(batch, rows, rows, dtype=torch.float64)
    b_sum = torch.zeros(batch, cols, cols, dtype=torch.float64)
    c_sum = torch.zeros(batch, rows, cols, dtype=torch.float64)
    for part in window:
        factor, block = part.factor.double(), part.block.double()
        if part.kind == "right":  # block = (M Q)^T, factor = Q (batch, cols, r)
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


def _require_every_step(view: ObservedView) -> None:
    steps = view.steps
    if view.meta["observe_every"] != 1 or steps != list(range(len(steps))):
        raise ValueError(
            f"a {view.meta['algorithm']} view must hold every step from step 0 (the "
            "copy the observer keeps adds up every message): record it with "
            "observe_every=1"
        )


def reconstruct(
    view: ObservedView, neighbor: int, window: int = DEFAULT_WINDOW
) -> Dict[int, List[Tensor]]:
    """The observer's estimate of `neighbor`'s parameters at every step the view holds a message
    of it for (see the module docstring; `window` is for low-rank products only)."""
    if isinstance(window, bool) or int(window) != window or window < 1:
        raise ValueError(f"window must be an integer >= 1 (half-steps to stack), got {window!r}")
    decoded = decoded_messages(view, neighbor)
    if any(p.kind == "increment" for _, parts in decoded for p in parts):
        _require_every_step(view)
    shapes, dtype = view.meta["shapes"], getattr(torch, view.meta["dtype"])
    own = view.own_trajectory()
    copies: Dict[int, Tensor] = {}  # the increment copy of each parameter, from step 0 on
    products: Dict[tuple, List] = {}  # (kind-free) group key -> its product parts in arrival order
    estimates: Dict[int, List[Tensor]] = {}
    for n, (message, parts) in enumerate(decoded):
        step = message["step"]
        first_of_step = step not in estimates
        if first_of_step:
            estimates[step] = [t.clone() for t in own[step]]
        estimate = estimates[step]
        for part in parts:
            if part.kind in ("model", "estimate"):
                if first_of_step or part.kind == "estimate":
                    for k, value in zip(part.indices, part.values):
                        estimate[k] = value.to(dtype)
            elif part.kind == "increment":
                for k, value in zip(part.indices, part.values):
                    copies[k] = copies[k] + value if k in copies else value.clone()
                    estimate[k] = copies[k].clone()
            elif part.kind in _PRODUCTS:
                products.setdefault((tuple(part.indices), part.rows, part.cols), []).append(
                    (n, part)
                )
            else:
                raise ValueError(f"a message part of kind {part.kind!r} has no estimator")
    # Low-rank products: per group, the window ending at the step's last message.
    last_of_step = {m["step"]: n for n, (m, _) in enumerate(decoded)}
    for (indices, rows, cols), parts in products.items():
        for step, last in last_of_step.items():
            chosen = [part for n, part in parts if n <= last][-int(window) :]
            if not chosen:
                continue
            prior = torch.stack([own[step][k].reshape(rows, cols) for k in indices])
            solved = _solve_group(chosen, prior)
            for slot, k in enumerate(indices):
                estimates[step][k] = solved[slot].to(dtype).reshape(shapes[k])
    return estimates


def relative_error(estimate: Sequence[Tensor], truth: Sequence[Tensor]) -> float:
    """||estimate - truth|| / ||truth||, all parameters taken as one vector (in float64)."""
    difference = sum(float((e.double() - t.double()).pow(2).sum()) for e, t in zip(estimate, truth))
    norm = sum(float(t.double().pow(2).sum()) for t in truth)
    return (difference / norm) ** 0.5 if norm > 0 else float("inf") if difference > 0 else 0.0


def reconstruction_errors(
    view: ObservedView,
    neighbor: int,
    truth: Mapping[int, Sequence[Tensor]],
    window: int = DEFAULT_WINDOW,
) -> Dict[str, List[float]]:
    """Relative errors over time of the reconstruction and of the trivial estimate.

    `truth` maps steps to the neighbour's true parameters then (e.g. the neighbour's own recorded
    view's `own_trajectory()`); steps missing from either side are left out. Returns {"steps",
    "estimate", "trivial"}, lists in step order.
    """
    estimates, trivial = reconstruct(view, neighbor, window), trivial_estimates(view)
    steps = [s for s in sorted(estimates) if s in truth]
    return {
        "steps": steps,
        "estimate": [relative_error(estimates[s], truth[s]) for s in steps],
        "trivial": [relative_error(trivial[s], truth[s]) for s in steps],
    }
