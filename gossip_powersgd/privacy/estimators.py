"""Stronger reconstructions of a PowerGossip neighbour: least squares on the model difference.

Every PowerGossip message from neighbour j is an exact linear measurement of the difference
D = M_j - M_i between its matrix and the observer's own, with a factor the observer knows:

  right half-step  Y = M_j Q   so   D Q   = Y   - M_i Q
  left half-step   Z = M_j^T P so   P^T D = Z^T - P^T M_i

(M_i the observer's own matrix when the message was computed: the view's `own` of that step).
The models drift, but their difference drifts much more slowly than either (gossip pulls them
together), so stacking a long window of measurements of D determines it far better than stacking
measurements of the moving M_j (`reconstruction.reconstruct`).

`difference_estimates(view, neighbor, window, forget)` solves, for each matrix group at step T,

  min_D  sum_n w_n ||D Q_n - (Y_n - M_i,n Q_n)||^2 + sum_n w_n ||P_n^T D - (Z_n^T - P_n^T M_i,n)||^2

over the last `window` messages up to T (w_n = forget ** age in half-steps: forget = 1 is the
static-D estimate, forget < 1 the drift-aware one that trusts recent measurements more, each
corrected by the observer's own model history M_i,n), whose normal equations are the Sylvester
equation A D + D B = C (A = sum w P P^T, B = sum w Q Q^T); directions no message measured keep
D = 0. The estimate of M_j(T) is M_i(T) + D. `oracle_estimates` is the ceiling of any estimator
built on the same factors: the true D(T) projected on the span the window's factors measure,
D - (I - Pi_P) D (I - Pi_Q). Tensors PowerGossip sends exactly are read off the step's first
message. Built on the recorded view only (messages, factors, own trajectory, the meta's layout).
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

import torch

from gossip_powersgd.privacy.views import ObservedView

__all__ = ["difference_estimates", "oracle_estimates", "prediction_agreement"]

#: Eigenvalue sums below this fraction of the largest count as directions no message measured.
_UNMEASURED = 1e-10


def _layout(view: ObservedView):
    meta = view.meta
    if meta["algorithm"] != "powergossip":
        raise ValueError(
            f"difference estimates are for PowerGossip views, not {meta['algorithm']!r}"
        )
    return meta["shapes"], meta["groups"], meta["exact_indices"]


def _cut(view: ObservedView, message: Dict) -> tuple:
    """A message's (block per group, exact part or None)."""
    shapes, groups, exact_indices = _layout(view)
    blocks, offset = [], 0
    for indices, rows, cols, r in groups:
        width = rows if message["kind"] == "right" else cols
        size = len(indices) * r * width
        blocks.append(
            message["tensor"][offset : offset + size].view(len(indices), r, width).double()
        )
        offset += size
    numel = sum(torch.Size(shapes[k]).numel() for k in exact_indices)
    exact = (
        message["tensor"][offset : offset + numel] if message["tensor"].numel() > offset else None
    )
    return blocks, exact


def _matrices(own: Sequence[torch.Tensor], indices, rows, cols) -> torch.Tensor:
    return torch.stack([own[k].double().reshape(rows, cols) for k in indices])


def _solve(a_sum, b_sum, c_sum) -> torch.Tensor:
    a_eig, u = torch.linalg.eigh(a_sum)
    b_eig, v = torch.linalg.eigh(b_sum)
    denominator = a_eig.unsqueeze(2) + b_eig.unsqueeze(1)
    largest = denominator.flatten(1).amax(dim=1).clamp_min(0).view(-1, 1, 1)
    measured = denominator > _UNMEASURED * largest
    rotated = u.transpose(1, 2) @ c_sum @ v
    return (
        u
        @ torch.where(measured, rotated / torch.where(measured, denominator, 1.0), 0.0)
        @ v.transpose(1, 2)
    )


def _window(view: ObservedView, neighbor: int, step: int, window: int) -> List[Dict]:
    messages = [m for m in view.messages_from(neighbor) if m["step"] <= step]
    if not messages or messages[-1]["step"] != step:
        raise ValueError(f"the view holds no message of neighbour {neighbor} at step {step}")
    return messages[-int(window) :]


def _with_exact(view, estimate, neighbor, step):
    """`estimate` with the tensors PowerGossip sends exactly read off the step's first message
    (whatever the least-squares window: a window shorter than a step's messages leaves it out)."""
    shapes, _, exact_indices = _layout(view)
    first = next(m for m in view.messages_from(neighbor) if m["step"] == step)
    exact = _cut(view, first)[1]
    if exact is not None and exact_indices:
        offset = 0
        for k in exact_indices:
            numel = torch.Size(shapes[k]).numel()
            estimate[k] = exact[offset : offset + numel].reshape(shapes[k]).clone()
            offset += numel
    return estimate


def difference_estimates(
    view: ObservedView,
    neighbor: int,
    steps: Optional[Sequence[int]] = None,
    window: int = 64,
    forget: float = 1.0,
) -> Dict[int, List[torch.Tensor]]:
    """The estimate M_i(T) + D of `neighbor`'s parameters at each step T of `steps` (default: the
    last one the view holds a message of it for); see the module docstring."""
    if isinstance(window, bool) or int(window) != window or window < 1:
        raise ValueError(f"window must be an integer >= 1 (messages to stack), got {window!r}")
    if not 0 < forget <= 1:
        raise ValueError(f"forget must lie in (0, 1], got {forget}")
    shapes, groups, _ = _layout(view)
    own = view.own_trajectory()
    if steps is None:
        steps = [view.messages_from(neighbor)[-1]["step"]]
    dtype = getattr(torch, view.meta["dtype"])
    out = {}
    for step in steps:
        messages = _window(view, neighbor, step, window)
        cuts = [_cut(view, m)[0] for m in messages]
        estimate = [t.clone() for t in own[step]]
        for g, (indices, rows, cols, _) in enumerate(groups):
            batch = len(indices)
            a_sum = torch.zeros(batch, rows, rows, dtype=torch.float64)
            b_sum = torch.zeros(batch, cols, cols, dtype=torch.float64)
            c_sum = torch.zeros(batch, rows, cols, dtype=torch.float64)
            for age, (message, blocks) in enumerate(zip(reversed(messages), reversed(cuts))):
                w = forget**age
                factor = message["factors"][str(g)].double()
                mine = _matrices(own[message["step"]], indices, rows, cols)
                if message["kind"] == "right":  # block = (M_j Q)^T, factor Q (batch, cols, r)
                    measured = blocks[g].transpose(1, 2) - mine @ factor  # D Q
                    b_sum += w * factor @ factor.transpose(1, 2)
                    c_sum += w * measured @ factor.transpose(1, 2)
                else:  # block = P^T M_j, factor P (batch, rows, r)
                    measured = blocks[g] - factor.transpose(1, 2) @ mine  # P^T D
                    a_sum += w * factor @ factor.transpose(1, 2)
                    c_sum += w * factor @ measured
            d = _solve(a_sum, b_sum, c_sum)
            base = _matrices(own[step], indices, rows, cols)
            for slot, k in enumerate(indices):
                estimate[k] = (base[slot] + d[slot]).to(dtype).reshape(shapes[k])
        out[step] = _with_exact(view, estimate, neighbor, step)
    return out


def _projector(factors: List[torch.Tensor], size: int) -> torch.Tensor:
    """(batch, size, size) projector on the span of the factors' columns."""
    stacked = torch.cat(factors, dim=2)  # (batch, size, r * n)
    u, s, _ = torch.linalg.svd(stacked, full_matrices=False)
    keep = s > _UNMEASURED**0.5 * s[:, :1]
    u = u * keep.unsqueeze(1)
    return u @ u.transpose(1, 2)


def oracle_estimates(
    view: ObservedView,
    neighbor: int,
    truth: Mapping[int, Sequence[torch.Tensor]],
    steps: Optional[Sequence[int]] = None,
    window: int = 64,
) -> Dict[int, List[torch.Tensor]]:
    """M_i(T) + the true D(T) projected on what the window's factors measure (a ceiling: it uses
    the truth, which no observer has)."""
    shapes, groups, _ = _layout(view)
    own = view.own_trajectory()
    if steps is None:
        steps = [view.messages_from(neighbor)[-1]["step"]]
    dtype = getattr(torch, view.meta["dtype"])
    out = {}
    for step in steps:
        messages = _window(view, neighbor, step, window)
        estimate = [t.clone() for t in own[step]]
        for g, (indices, rows, cols, _) in enumerate(groups):
            qs = [m["factors"][str(g)].double() for m in messages if m["kind"] == "right"]
            ps = [m["factors"][str(g)].double() for m in messages if m["kind"] == "left"]
            batch = len(indices)
            eye_r = torch.eye(rows, dtype=torch.float64).expand(batch, rows, rows)
            eye_c = torch.eye(cols, dtype=torch.float64).expand(batch, cols, cols)
            pi_q = _projector(qs, cols) if qs else torch.zeros_like(eye_c)
            pi_p = _projector(ps, rows) if ps else torch.zeros_like(eye_r)
            base = _matrices(own[step], indices, rows, cols)
            d = _matrices(truth[step], indices, rows, cols) - base
            seen = d - (eye_r - pi_p) @ d @ (eye_c - pi_q)
            for slot, k in enumerate(indices):
                estimate[k] = (base[slot] + seen[slot]).to(dtype).reshape(shapes[k])
        out[step] = _with_exact(view, estimate, neighbor, step)
    return out


@torch.no_grad()
def prediction_agreement(
    model_a: torch.nn.Module, model_b: torch.nn.Module, x: torch.Tensor
) -> float:
    """The share of samples on which the two models predict the same class."""
    model_a.eval()
    model_b.eval()
    return float((model_a(x).argmax(1) == model_b(x).argmax(1)).double().mean())
