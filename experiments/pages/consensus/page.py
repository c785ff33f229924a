"""consensus.md: the page's text from its instances (the dicts `render` rebuilds from the rows)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Dict, List, Sequence

from .compare import columns, target_name, winner_cell, winner_text
from .files import CURVES, budget_name, family, fmt_err, fmt_gamma, format_table
from .instance import FULL_GRID
from .measure import DIVERGE_FACTOR, FLOOR_MARGIN, FLOOR_ULPS
from .models import SAVED_EPOCHS, TRAINING
from .problems import problem_shapes

PROBLEMS = (
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
    "the start, so those rows measure gossip started from such states, not training."
)
MATCHED = (
    "Matched bits: a budget column is each run's error at exactly that many bits per peer, "
    "log-log interpolated between the two recorded steps around it (every run records the last "
    "step within and the first step beyond each budget), so algorithms whose steps cost "
    'different bits are compared at the same bits; "bits to 1e-2 / 1e-4" is the bits per peer '
    "at which the relative error first falls to that value (interpolated the same way). Every "
    "ratio on this page is between values at the same bits."
)
WINNER_MAP = (
    "Per instance and column: the winner among exact gossip, PowerGossip r1 and r4, Choco sign and "
    "Choco top-k (matched), and its margin over the runner-up: runner-up ÷ winner of the mean over "
    "seeds of the relative error at exactly that many bits (budget columns) or of the bits per "
    "peer to reach that relative error (last two columns); in brackets the range of the per-seed "
    'margins, which seeds\' own winner differs, and "≥" when the winner stopped early below '
    "the stopping error (its value is an upper bound). Tuned baselines run at the γ that is "
    "best on seed 0 at the largest budget."
)


def page(instances: Sequence[Dict], made_by: str, meta: Dict) -> str:
    """The page; `meta`: seconds (running time), cpu_count, machine, from the rows."""
    counts = Counter(r["commit"] for r in instances)
    commits = (
        f"commit {next(iter(counts))}"
        if len(counts) == 1
        else "commits " + ", ".join(f"{c} ({n} instance{'s' * (n > 1)})" for c, n in counts.items())
    )
    lines = [
        "# Consensus experiment (PowerGossip paper §5)",
        "",
        f"{made_by}  ",
        f"Date: {max(r['finished'] for r in instances)} · {commits} · backend: local (LocalCluster, "
        f"one thread per peer), torch threads 1 · running time {meta['seconds'] / 60:.1f} min on "
        f"{meta['cpu_count']} shared cores ({meta['machine']}) · {len(instances)} instances",
        "",
        *method_lines(instances),
        "## Winner map",
        "",
        WINNER_MAP,
        "",
        *winner_map(instances),
    ]
    for r in instances:
        shapes, where = problem_shapes(r["problem"]), r["folder"]
        seed0 = [x for x in r["results"] if x["seed"] == 0 and not x["swept"]]
        steps = ", ".join(f"{x['label']}: {x['steps']} ({x['stop']})" for x in seed0)
        lines += [
            f"## {r['topology']}, {r['problem']} ({len(shapes)} tensor(s), "
            f"{sum(math.prod(s) for s in shapes)} floats per peer)",
            "",
            f"γ (topology) = {r['gamma_topology']:.4g} · dtype {r['dtype']}"
            + (f" · top-k ratio {r['topk_ratio']:g}" if r["topk_ratio"] else "")
            + f" · seeds {', '.join(map(str, r['seeds']))} · {len(r['results'])} runs in "
            f"{r['seconds']:.0f} s · seed 0 steps run (stop): {steps}",
            "",
            "Seed 0: relative error at exactly each budget; bits per peer to reach each relative error.",
            "",
            format_table(r["summary"], r["budgets"]),
            "",
            *headline(r),
            *edge_notes(r),
            "",
            f"![error vs bits]({where}/error_vs_bits.png) ![error vs steps]({where}/error_vs_steps.png)",
            "",
            f"Data: [`{where}/table.csv`]({where}/table.csv) (every run and seed at every budget, "
            f"absolute and relative errors), `{where}/{CURVES}` (every run's curve: gzipped JSON "
            f"lines, one per run; seeds after 0 named `seed<k>/...`), `{where}/summary.json`.",
            "",
        ]
    return "\n".join(lines)


def method_lines(instances: Sequence[Dict]) -> List[str]:
    """The paragraphs between the page's header and its winner map."""
    first, dtypes = instances[0], sorted({r["dtype"] for r in instances})
    screen, stop = first["screen_bits"], first["stop_relative"]
    grids = sorted({tuple(r["gammas"]) for r in instances if r["sweep"]})
    grids = "; ".join("{" + ", ".join(fmt_gamma(g) for g in grid) + "}" for grid in grids) or "—"
    by_topology = {
        t: [r["problem"] for r in instances if r["topology"] == t]
        for t in dict.fromkeys(r["topology"] for r in instances)
    }
    scope = "; ".join(f"{t}: " + ", ".join(f"`{p}`" for p in ps) for t, ps in by_topology.items())
    missing = "; ".join(
        f"{t}: " + (", ".join(f"`{p}`" for p in ps) if ps else "nothing")
        for t, ps in not_run(instances).items()
    )
    return [
        PROBLEMS,
        "",
        "Scope (cut to fit the time; one added instance takes about 150 s on ring:8 and twice "
        f"that on torus:4x4 on 2 shared cores): {scope}. Not run: {missing} (`offset:beta=0` is "
        "the `matrix` problem). The trained models come from one training on ring:8 (8 peers), "
        "so that problem is on ring:8 only.",
        "",
        f"State dtype: {', '.join(dtypes)} (the consensus state, and what every algorithm sends: "
        "exact gossip and PowerGossip send floats of the state's dtype, so a float64 float costs 8 "
        "bytes; sign sends 1 bit per entry plus a scale, top-k its values plus int32 indices). "
        "Error = mean over peers of ‖x_i − x̄‖²_F (`consensus_distance`, float64); tables and plots "
        "give the relative error, error ÷ its initial value (the CSV keeps both). Bits per peer = 8 "
        "× the transport's `comm.stats.bytes_sent`. Mixing weights W = uniform (1/(degree+1)). "
        "Exact gossip and PowerGossip use the topology's γ (2/(λmin+λmax) of I−W), untuned.",
        "",
        MATCHED,
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
        f"γ sweeps: Choco and DeepSqueeze γ ∈ {grids}, on seed 0 only"
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


def not_run(instances: Sequence[Dict]) -> Dict[str, List[str]]:
    """Per topology of the page, the problems of the full grid it has no instance of (the trained
    models exist for ring:8 only)."""
    ran: Dict[str, set] = {}
    for r in instances:
        ran.setdefault(r["topology"], set()).add(r["problem"])
    return {
        t: [
            p
            for p in FULL_GRID
            if p not in done and not (p.startswith("models:") and t != "ring:8")
        ]
        for t, done in ran.items()
    }


def winner_map(instances: Sequence[Dict]) -> List[str]:
    cols = columns(instances[0]["budgets"])
    header = ["topology", "problem", "seeds"] + [
        f"@ {budget_name(key)} bits" if kind == "budget" else f"bits to {target_name(key)}"
        for kind, key in cols
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in instances:
        cells = [winner_text(winner_cell(r, kind, key)) for kind, key in cols]
        lines.append(
            f"| {r['topology']} | {r['problem']} | {len(r['seeds'])} | " + " | ".join(cells) + " |"
        )
    return lines + ["", "![PowerGossip ÷ best baseline](consensus/winner_map.png)", ""]


def _ratio_text(pg: Dict, other: Dict) -> str:
    """'PowerGossip's error is k× lower/higher' at matched bits, with bounds and floors."""
    a, b = pg["row"], other["row"]
    if a["at_floor"] and b["at_floor"]:
        return "both at the precision floor"
    if a["bound"] and b["bound"]:
        return "both stopped earlier below the stopping error"
    lower = a["relative"] < b["relative"]
    factor = b["relative"] / a["relative"] if lower else a["relative"] / b["relative"]
    # An upper bound on the smaller error makes the factor a lower bound, on the larger undefined.
    small, large = (a, b) if lower else (b, a)
    prefix = "≥ " if small["bound"] else ("≤ " if large["bound"] else "")
    text = f"PowerGossip's error is {prefix}{factor:.3g}× {'lower' if lower else 'higher'}"
    floor = [name for name, row in (("PowerGossip", a), ("the other", b)) if row["at_floor"]]
    return text + (f" ({' and '.join(floor)} at precision floor)" if floor else "")


def headline(instance: Dict) -> List[str]:
    """At each budget (seed 0): the best PowerGossip against exact gossip, the best tuned
    baseline, and the best baseline whose compressor has PowerGossip's float count."""
    summary, lines = instance["summary"], []
    families = {label: family(entry) for label, entry in summary.items()}
    picks = (
        ("exact gossip", lambda f: f[0] == "exact"),
        ("best tuned baseline", lambda f: f[1] == "tuned"),
        (
            "best top-k / low-rank baseline",
            lambda f: f[1] == "tuned" and f[2] in ("topk", "lowrank"),
        ),
    )
    for budget in instance["budgets"]:

        def best(pick):
            cells = [
                (label, e["budgets"][budget])
                for label, e in summary.items()
                if pick(families[label]) and e["budgets"][budget]["status"] == "ok"
            ]
            return min(cells, key=lambda c: c[1]["row"]["relative"]) if cells else None

        pg = best(lambda f: f[0] == "powergossip")
        if pg is None:
            continue
        parts = [f"best PowerGossip ({pg[0]}) {fmt_err(pg[1]['row']['relative'])}"]
        verdicts = []
        for name, pick in picks:
            found = best(pick)
            if found is None:
                continue
            tuned = found[1].get("gamma") is not None and families[found[0]][1] == "tuned"
            gamma = f", γ={fmt_gamma(found[1]['gamma'])}" if tuned else ""
            label = "exact gossip" if name == "exact gossip" else f"{name} ({found[0]}{gamma})"
            parts.append(f"{label} {fmt_err(found[1]['row']['relative'])}")
            verdicts.append(f"vs {name}: {_ratio_text(pg[1], found[1])}")
        lines.append(
            f"- at {budget_name(budget)} bits per peer (relative errors): "
            + " · ".join(parts)
            + ". "
            + "; ".join(verdicts)
            + "."
        )
    return lines


def edge_notes(instance: Dict) -> List[str]:
    """Swept algorithms whose best γ at the largest budget is an end of the grid."""
    grid, last, lines = instance["gammas"], instance["budgets"][-1], []
    for label, entry in instance["summary"].items():
        cell = entry["budgets"][last]
        if entry["swept"] and cell["status"] == "ok" and cell["gamma"] in (min(grid), max(grid)):
            side = "largest" if cell["gamma"] == max(grid) else "smallest"
            lines.append(
                f"- {label}: the best γ at {budget_name(last)} bits is the grid's {side} value "
                f"({fmt_gamma(cell['gamma'])}): not interior, a γ beyond the grid might do better."
            )
    return lines
