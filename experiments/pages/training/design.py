"""The design of the training page (`training.py` runs it, `training_markdown.py` and
`training_plots.py` write it): the rows compared, the stages, the state's run lists."""

from __future__ import annotations

from typing import Any, Dict, List

EXACT, POWERGOSSIP = "exact gossip", "PowerGossip r1 (1 iter)"
ALLREDUCE, POWERGOSSIP_R4 = "all-reduce", "PowerGossip r4 (1 iter)"
CHOCO_SIGN, CHOCO_TOPK = "Choco sign", "Choco top-k 1%"
#: (label, spec, or a spec template with {gamma} for a swept γ); the order of the tables.
ROWS = [
    (ALLREDUCE, "allreduce"),
    (EXACT, "exact"),
    (POWERGOSSIP, "powergossip:rank=1,iters=1"),
    (POWERGOSSIP_R4, "powergossip:rank=4,iters=1"),
    (CHOCO_SIGN, "choco:compressor=sign,gamma={gamma}"),
    (CHOCO_TOPK, "choco:compressor=topk:0.01,gamma={gamma}"),
]
#: γ values swept (short runs, ring:8 iid, seed 0) for the algorithms whose γ must be tuned.
GAMMA_GRID = {CHOCO_SIGN: (0.5, 1.0, 1.3), CHOCO_TOPK: (0.05, 0.1, 0.2)}
#: The rows whose extra seeds are optional (`choco_seeds`): each costs ~4x an exact-gossip run here.
SLOW_ROWS = (CHOCO_SIGN, CHOCO_TOPK)
TOPOLOGY, IID, NONIID = "ring:8", "iid", "dirichlet:0.5"
#: A wider model, where PowerGossip's saving is larger (its matrices are 512x512).
WIDE_MODEL = "mlp:512,512"
WIDE_ROWS = [
    (EXACT, "exact"),
    (POWERGOSSIP, "powergossip:rank=1,iters=1"),
    (ALLREDUCE, "allreduce"),
    ("PowerGossip r1 (2 iters)", "powergossip:rank=1,iters=2"),
]
#: The reference runs: the same recipe with the demo's 100 epochs, to show how far `epochs` is.
REFERENCE_ROWS = [(EXACT, "exact"), (POWERGOSSIP, "powergossip:rank=1,iters=1")]
STAGES = (
    "γ sweep",
    "iid, first seed",
    "Dirichlet and the non-IID grid",
    "wide model",
    "iid, further seeds",
    "reference runs",
)
#: The state's lists of runs, in the CSV's order.
RUN_LISTS = ("sweeps", "iid", "noniid", "noniid_extra", "wide", "reference")


def noniid_grid(state) -> List[Dict[str, Any]]:
    """The non-IID grid's rows, in NONIID_ROWS order, reusing the main Dirichlet runs."""
    by_spec = {r["spec"]: r for r in state["noniid"] + state["noniid_extra"]}
    return [
        dict(by_spec[spec], label=label)
        for label, spec in state["plan"]["noniid_rows"]
        if spec in by_spec
    ]
