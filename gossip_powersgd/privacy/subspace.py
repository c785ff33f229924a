"""DP-SGD whose private update stays where PowerGossip's next messages read it
(``dp_exchanged_subspace: true``).

Why: under DP-SGD every peer adds isotropic noise, which is full rank. A rank-r PowerGossip step
exchanges, per matrix and per neighbour, the model difference along r directions only, so most of
each step's noise is averaged late or never, and the peers' models drift apart
(experiments/results/privacy_dp_subspace.md: consensus distance 5.67 for rank 1 at epsilon = 8
after 30 epochs, where exact gossip's is 2.5e-8).

What it does: after the optimizer step, the change of every matrix PowerGossip compresses,
``Delta = M_after - M_before``, is replaced by its projection on the subspace the next half-step's
messages read. On a right half-step, whose message to neighbour j is ``M Q_j``, that is
``Delta B B^T`` with B an orthonormal basis of the span of all neighbours' Q_j; on a left half-step
(``M^T P_j``), ``B B^T Delta`` with B spanning the P_j. The noise of the update then lies entirely
in what the step exchanges, and the gossip of that half-step removes it from each edge's
difference as far as its weight allows: on a single edge with ``2 gamma W = 1`` the two models are
equal again after every step, whatever the noise (the test). Tensors PowerGossip gossips exactly
(vectors, small matrices) are exchanged whole anyway and are left alone.

Privacy: the projection is post-processing of DP-SGD's output, so the epsilon is DP-SGD's, from
the same accountant, unchanged. The basis is a function of the edge factors, which are formed
from earlier messages and the neighbours' models: information the step may depend on under
adaptive composition, exactly as the model its gradient is taken at. The optimizer keeps the
whole private gradient in its momentum; only the move of the parameters is projected.

Two nearby designs give no epsilon, or none of use, which is why this is the form built here:

* projecting the noise only and keeping the whole gradient: the part of a record's gradient
  outside the subspace enters the model with no noise on it, and later messages, whose factors
  move, read it (no epsilon);
* noise on what is sent instead of on the gradient: one record's effect on a message has no bound
  (it moves the model through all later steps, and non-convex training bounds none of that) short
  of clipping the message itself to a norm B; then any message may become any other of norm <= B,
  so each message is a Gaussian mechanism of sensitivity 2B with no amplification by subsampling,
  composed over every message a neighbour receives. The committed page computes the noise that
  needs at its own epsilons and step counts: tens of B on every coordinate of a message of norm
  at most B.

Projecting the whole private update is the valid form of both: every message carries only
DP-SGD's output, and the noise in a message is that of the part of the update it reads.

``dp_subspace_feedback: true`` keeps the part of each update the projection cut off, privately on
the peer, and adds it to the next step's update before projecting (error feedback, as PowerSGD
keeps what it did not send): the gradient is then applied in full, late, and still only along what
is exchanged. Still post-processing, so the same epsilon.

The cost: between two steps a compressed matrix moves in ``deg * r`` directions of one side only,
so the part of its gradient outside them moves it only through momentum at a later step whose
subspace reaches it. On the committed page that costs more accuracy than the lower consensus
distance gains (rank 1 at epsilon = 8: 60 % against 86 % without the projection).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from gossip_powersgd.launch import collectively
from gossip_powersgd.training.hooks import SetupContext, TrainingHooks

__all__ = ["ExchangedSubspace", "keep_exchanged_change_", "check_subspace_algorithm"]


def keep_exchanged_change_(
    matrices: torch.Tensor,
    before: torch.Tensor,
    factors: torch.Tensor,
    side: str,
    wanted: Optional[torch.Tensor] = None,
) -> None:
    """Set ``matrices`` (batch, rows, cols), in place, to ``before`` plus the projection of its
    change on the span of ``factors``: (batch, k, cols) on the "right" side (the change keeps
    ``Delta B B^T``), (batch, k, rows) on the "left" (``B B^T Delta``), B an orthonormal basis of
    the factors' span (from a reduced QR; a rank-deficient set of factors gives a basis of a
    larger span, which is still a projection of the private update). With ``wanted`` the change
    projected is ``wanted - before`` instead (error feedback: the update plus what earlier
    projections cut off)."""
    if side not in ("right", "left"):
        raise ValueError(f"side must be 'right' or 'left', got {side!r}")
    basis = torch.linalg.qr(factors.transpose(1, 2)).Q  # (batch, cols or rows, k)
    change = (matrices if wanted is None else wanted) - before
    if side == "right":
        kept = torch.bmm(torch.bmm(change, basis), basis.transpose(1, 2))
    else:
        kept = torch.bmm(basis, torch.bmm(basis.transpose(1, 2), change))
    matrices.copy_(before + kept)


def check_subspace_algorithm(algorithm: Any) -> None:
    """One-line ValueError unless ``algorithm`` is a PowerGossip this projection works with."""
    from gossip_powersgd.algorithms.powergossip import PowerGossip

    if not isinstance(algorithm, PowerGossip):
        raise ValueError(
            "dp_exchanged_subspace works with algorithm powergossip (its messages read a "
            f"subspace), not {getattr(algorithm, 'name', type(algorithm).__name__)}"
        )
    if not algorithm.comm.is_static:
        raise ValueError(
            "dp_exchanged_subspace needs a static topology (on a schedule the edges, and so "
            "the subspace a step exchanges, change): use a static graph or drop the key"
        )
    if not algorithm.warm_start:
        raise ValueError(
            "dp_exchanged_subspace needs powergossip's warm start (with warm=false the next "
            "factors are drawn only when the half-step begins): drop warm=false"
        )


class ExchangedSubspace(TrainingHooks):
    """Keeps each step's private update of the compressed matrices in the subspace the step's
    messages read (see the module doc). Runs after the `DifferentialPrivacy` hook."""

    name = "dp_exchanged_subspace"

    def __init__(self, feedback: bool = False):
        self.algorithm = None
        self.feedback = bool(feedback)
        self._before: Optional[List[torch.Tensor]] = None
        #: With feedback, per group the part of the updates not yet applied (private state).
        self._residual: Optional[List[torch.Tensor]] = None

    def setup(self, context: SetupContext) -> None:
        collectively(context.comm, check_subspace_algorithm, context.algorithm)
        self.algorithm = context.algorithm

    def after_backward(self, step: int) -> None:
        """Keep the compressed matrices as they are before the optimizer moves them."""
        with torch.no_grad():
            self._before = [m.clone() for m, _, _ in self.algorithm.next_exchange()]

    def after_optimizer_step(self, step: int) -> None:
        """Project each compressed matrix's move on what the next half-step exchanges."""
        with torch.no_grad():
            exchange = self.algorithm.next_exchange()
            if self.feedback and self._residual is None:
                self._residual = [torch.zeros_like(m) for m, _, _ in exchange]
            for k, ((matrices, factors, side), before) in enumerate(zip(exchange, self._before)):
                if self.feedback:
                    wanted = matrices + self._residual[k]
                    keep_exchanged_change_(matrices, before, factors, side, wanted)
                    self._residual[k] = wanted - matrices
                else:
                    keep_exchanged_change_(matrices, before, factors, side)
        self._before = None

    def state_dict(self) -> Dict[str, Any]:
        """With feedback, the parts of the updates not yet applied (a resumed run goes on with
        them); nothing without."""
        if self._residual is None:
            return {}
        return {"residual": [r.detach().cpu().clone() for r in self._residual]}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        residual = state.get("residual")
        if residual is None:
            return
        exchange = self.algorithm.next_exchange()
        shapes = [tuple(m.shape) for m, _, _ in exchange]
        if [tuple(r.shape) for r in residual] != shapes:
            raise ValueError(
                "the checkpoint's dp_subspace_feedback residual does not fit this model's "
                "compressed matrices: resume with the run's own model and algorithm"
            )
        self._residual = [r.to(m.device, m.dtype) for r, (m, _, _) in zip(residual, exchange)]


def subspace_hook(config) -> Optional[ExchangedSubspace]:
    """The hook for a config with ``dp_exchanged_subspace: true`` (validated with DP on)."""
    if not config.dp_exchanged_subspace:
        return None
    return ExchangedSubspace(feedback=config.dp_subspace_feedback)
