"""The report page's method section: what the numbers are, as the records say they were made."""

from __future__ import annotations

from typing import Dict, List, Sequence

from .measure import DIVERGE_FACTOR, FLOOR_MARGIN, FLOOR_ULPS
from .models import SAVED_EPOCHS, TRAINING
from .report import budget_name, fmt_gamma


def _grids(records: Sequence[Dict]) -> str:
    grids = sorted({tuple(r["gammas"]) for r in records if r.get("sweep")})
    return "; ".join("{" + ", ".join(fmt_gamma(g) for g in grid) + "}" for grid in grids) or "—"


def method_lines(records: Sequence[Dict]) -> List[str]:
    """The paragraphs between the page's header and its winner map."""
    dtypes = sorted({r.get("dtype", "float32") for r in records})
    first = records[0]
    screen = first.get("screen_bits")
    stop = first.get("stop_relative")
    lines = [
        "Problems (each peer's tensors; seed s, peer i draws from generator 42 + 1000·s + i, shared "
        "components from 7000000 + s): `matrix` 100×100 N(0,1); `cnn` N(0,1) tensors shaped like "
        "MNIST-1D's `cnn1d` parameters; `spectral:alpha=α` X_i = κ·U_i·diag(k^−α)·V_iᵀ (k = 1..100, "
        "U_i, V_i orthonormal from the QR of Gaussian matrices, κ such that ‖X_i‖² = 100², the "
        "`matrix` problem's expected ‖X_i‖²); `lowrank:r=r,sigma=σ` X_i = U·diag(c_i)·Vᵀ/√r + σ·E_i "
        "(U, V 100×r N(0,1) shared, c_i and E_i N(0,1) per peer; no shared matrix A is added, the "
        "`offset` problem measures that on its own); `offset:beta=β` the `matrix` problem + β·A, "
        "A N(0,1) shared (gossip sees only x_i − x_j, so the consensus distance is the `matrix` "
        "problem's; β = 0 is the `matrix` problem itself); `models:epoch=E` the peers' `cnn1d` "
        f"parameters after E epochs of D-PSGD (exact gossip, lr {TRAINING['lr']}, momentum "
        f"{TRAINING['momentum']}, cosine, batch {TRAINING['batch_size']}, the demo recipe) on MNIST-1D "
        f"with a {TRAINING['partition'].replace(':', '(')}) label partition, trained on the consensus "
        f"topology itself (as many peers as it has), saved at epochs "
        f"{', '.join(map(str, SAVED_EPOCHS))} of one 30-epoch run (training seed 0; cached, not "
        "committed; the consensus problem has no other randomness, so it runs on one seed). Choco and "
        "DeepSqueeze start their public copies x̂_i at 0, so where the peers share a large component "
        "(`offset`, trained models) their first bits go to sending it, which gossip on x_i − x_j "
        "(exact, PowerGossip) never does; inside training the copies would have tracked it from "
        "the start, so those rows measure gossip started from such states, not training.",
        "",
        "Scope (cut to fit the time; one added instance takes about 150 s on ring:8 and twice "
        "that on torus:4x4 on 2 shared cores): "
        + "; ".join(
            f"{topology}: "
            + ", ".join(f"`{r['problem']}`" for r in records if r["topology"] == topology)
            for topology in dict.fromkeys(r["topology"] for r in records)
        )
        + ". Not run: "
        + "; ".join(
            f"{topology}: " + (", ".join(f"`{p}`" for p in missing) if missing else "nothing")
            for topology, missing in _not_run(records).items()
        )
        + " (`offset:beta=0` is the `matrix` problem). The trained models come from one training "
        "on ring:8 (8 peers), so that problem is on ring:8 only.",
        "",
        f"State dtype: {', '.join(dtypes)} (the consensus state, and what every algorithm sends: "
        "exact gossip and PowerGossip send floats of the state's dtype, so a float64 float costs 8 "
        "bytes; sign sends 1 bit per entry plus a scale, top-k its values plus int32 indices). "
        "Error = mean over peers of ‖x_i − x̄‖²_F (`consensus_distance`, float64); tables and plots "
        "give the relative error, error ÷ its initial value (the CSV keeps both). Bits per peer = 8 "
        "× the transport's `comm.stats.bytes_sent`. Mixing weights W = uniform (1/(degree+1)). "
        "Exact gossip and PowerGossip use the topology's γ (2/(λmin+λmax) of I−W), untuned.",
        "",
        "Matched bits: a budget column is each run's error at exactly that many bits per peer, "
        "log-log interpolated between the two recorded steps around it (every run records the last "
        "step within and the first step beyond each budget), so algorithms whose steps cost "
        'different bits are compared at the same bits; "bits to 1e-2 / 1e-4" is the bits per peer '
        "at which the relative error first falls to that value (interpolated the same way). Every "
        "ratio on this page is between values at the same bits.",
        "",
        f"Precision floor: F = {FLOOR_ULPS:g}·eps(dtype)²·mean_i ‖x_i‖² (about one rounding error per "
        "entry of the state and of the copies an algorithm keeps, squared; float32 Choco-sign "
        "stalled at 1.17e-8 absolute on the previous page's ring:8 `matrix`, 83·eps²·mean‖x_i‖²). A value ≤ "
        f'{FLOOR_MARGIN:g}·F is marked "(floor)"/"at precision floor" and its run stops there '
        '("floor"). The floor scales with ‖x_i‖², not with the initial error: a shared offset '
        "raises it. "
        + (
            f'A run also stops once its relative error is ≤ {stop:g} ("reached"); its last error is '
            'then an upper bound at larger budgets, written "≤". '
            if stop
            else ""
        )
        + f"A run stops after the first step beyond {budget_name(first['max_bits'])} bits, or as "
        f"*diverged* once its error exceeds {DIVERGE_FACTOR:g}× the initial error.",
        "",
        f"γ sweeps: Choco and DeepSqueeze γ ∈ {_grids(records)}, on seed 0 only"
        + (
            f", in two stages: every γ runs to {budget_name(screen)} bits per peer, then the "
            f"{first['finalists']} best γ at that budget (one that already reached the stopping error "
            f"ranks first) run to {budget_name(first['max_bits'])} bits; a budget column shows the "
            f"best γ's value (γ per cell): over the whole grid up to {budget_name(screen)} bits, over "
            "the finalist beyond. "
            if screen
            else ". "
        )
        + "Seeds 1 and 2 rerun each algorithm once, a tuned one at the γ that is best on seed 0 at "
        "the largest budget (the γ the plots show); the per-instance tables are seed 0, the winner "
        "map is the mean over seeds. The original problems (`matrix`, `cnn`) run the full algorithm "
        "list on seed 0 (PowerGossip r2 and r1 restart, DeepSqueeze, low-rank compressors included) "
        "and the winner-map algorithms on seeds 1-2; the added problems run the winner-map "
        "algorithms only. Top-k keeps k matched to PowerGossip rank 1's floats per message "
        "(measured from its traffic, ratio per section) and also sends k int32 indices. "
        "`lowrank:1` is a rank-1 approximation by one power iteration from a fresh random start "
        "each round.",
        "",
    ]
    return lines


__all__ = ["method_lines"]


def _not_run(records) -> dict:
    """Per topology of the page, the problems of the full grid it has no instance of."""
    from .driver import FULL_GRID

    ran = {}
    for r in records:
        ran.setdefault(r["topology"], set()).add(r["problem"])
    return {
        topology: [
            p
            for p in FULL_GRID
            if p not in problems and not (p.startswith("models:") and topology != "ring:8")
        ]
        for topology, problems in ran.items()
    }
