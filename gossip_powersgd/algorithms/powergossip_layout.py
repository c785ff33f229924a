"""PowerGossip's message layout (`algorithms.layout`): what each of its messages holds, for the
observers. Split from `powergossip` by job; `powergossip` re-exports `LowRankProducts`.
"""

from __future__ import annotations

from .layout import MessageLayout, Part, unflatten


class LowRankProducts(MessageLayout):
    """A PowerGossip message. On its edge's right half-step it holds, for each group of stacked
    matrices (the `groups` field: [indices, rows, cols, r] each, in order), the products
    (M Q)^T as batch x r x rows; on a left half-step (M^T P)^T as batch x r x cols; then, in the
    first half-step of a step only, the exactly gossiped tensors (`exact_indices`), flattened.

    The side is the edge's: on a static topology every edge takes the same one (an odd half-step
    count is right), on a schedule each edge keeps its own counter (an idle edge skips steps), so
    `annotate` asks the algorithm (`PowerGossip.edge_side`) and records, with the side, the shared
    factor the products were computed with (Q on a right half-step, P on a left one, as both ends
    hold it). How a peer keeps its factors (at rank 1, side by side in rows laid out like the
    messages) does not change what a message holds.
    """

    @classmethod
    def run_fields(cls, algorithm):
        return {
            "groups": algorithm.groups,
            "exact_indices": [
                k for k in range(len(algorithm.params)) if k not in algorithm.compressed_indices
            ],
        }

    def annotate(self, algorithm, sender):
        kind = algorithm.edge_side(sender)
        letter = "Q" if kind == "right" else "P"
        factors = algorithm.factors(sender)
        return {
            "kind": kind,
            "factors": {
                str(g): factors[f"{g}.{letter}"].detach().cpu().clone()
                for g in range(len(self.meta["groups"]))
            },
        }

    def decode(self, message):
        tensor, kind = message["tensor"], message["kind"]
        parts, offset = [], 0
        for g, (indices, rows, cols, r) in enumerate(self.meta["groups"]):
            width = rows if kind == "right" else cols
            size = len(indices) * r * width
            block = tensor[offset : offset + size].view(len(indices), r, width)
            parts.append(
                Part(
                    kind,
                    list(indices),
                    block=block,
                    factor=message["factors"][str(g)],
                    rows=rows,
                    cols=cols,
                )
            )
            offset += size
        exact = self.meta["exact_indices"]
        if exact and tensor.numel() > offset:  # the first half-step of a step
            parts.append(
                Part(
                    "model",
                    list(exact),
                    unflatten(tensor[offset:], [self.shapes[k] for k in exact]),
                )
            )
        return parts
