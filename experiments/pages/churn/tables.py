"""The churn page from its rows alone: the grid's cells (mean ± std over seeds), its table and plot,
the rejoin table, the verdict lines, and the soak section (rendered only when soak rows exist)."""

from __future__ import annotations

import statistics
from typing import Any, Callable, Dict, Iterable, List, Sequence, Tuple

from experiments.engine import Rows
from experiments.pages._figures import png
from experiments.pages._markdown import fill, mean_sd, pm, template, text_table

#: The grid's figures aggregated over seeds (mean and std), in the JSON's order.
GRID_FIELDS = (
    "acc_avg",
    "acc_local_mean",
    "acc_local_min",
    "consensus_distance",
    "average_shift_total",
    "departures",
    "away_share",
    "membership_changes",
    "mb_per_peer",
)
Cell = Tuple[str, str, float]  # (topology, algorithm label, churn rate per epoch)


def _stats(runs: Sequence[Dict[str, Any]], fields: Iterable[str]) -> Dict[str, Any]:
    """{field: mean, field_std: std (None for one run)} over `runs` for each of `fields`."""
    out: Dict[str, Any] = {}
    for field in fields:
        out[field], out[field + "_std"] = mean_sd(r[field] for r in runs)
    return out


def _sections(rows: Rows, section: str, key: Callable[[Dict[str, Any]], tuple]) -> Dict:
    """{key(config): [row, ...]} of the rows of one section, in plan order."""
    grouped: Dict[tuple, List[Dict[str, Any]]] = {}
    for record in rows.records:
        if record.config["section"] == section:
            grouped.setdefault(key(record.config), []).append(record.row)
    return grouped


def grid_cells(rows: Rows) -> Dict[Cell, Dict[str, Any]]:
    """{(topology, label, rate): {seeds: n, field: mean, field_std: std}} in plan order."""
    grouped = _sections(rows, "grid", lambda c: (c["topology"], c["label"], c["rate_per_epoch"]))
    return {
        cell: {"seeds": len(runs), **_stats(runs, GRID_FIELDS)} for cell, runs in grouped.items()
    }


def _stat(c: Dict[str, Any], field: str, fmt: str = ".3g") -> str:
    """Mean ± std of `field` of a cell (or probe)."""
    return pm(c[field], c[field + "_std"], fmt)


def _acc(cell: Dict[str, Any], field: str) -> str:
    return pm(cell[field], cell[field + "_std"], ".2f", 100.0, " %")


def _pp(a: Dict[str, Any], b: Dict[str, Any], field: str = "acc_avg") -> str:
    return f"{100 * (a[field] - b[field]):+.2f} pp"


def grid_list(cells: Dict[Cell, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The grid's cells as the JSON lists them: topology, algorithm, rate, then the figures."""
    return [
        dict(topology=t, algorithm=label, rate_per_epoch=rate, **cell)
        for (t, label, rate), cell in cells.items()
    ]


GRID = (
    "topology | algorithm | churn / epoch (rate / step) | departures | peer-steps away "
    "| averaged-model acc | Δ vs no churn | local acc mean | local acc min "
    "| consensus distance | average shift (sum)"
)


def grid_table(cells: Dict[Cell, Dict[str, Any]], spe: int) -> str:
    """One line per (topology, algorithm, rate), the no-churn line first in each group, with the
    averaged-model accuracy's difference to it."""

    def line(c: Dict[str, Any]) -> List[str]:
        rate, base = c["rate_per_epoch"], cells.get((c["topology"], c["algorithm"], 0.0))
        out = [c["topology"], c["algorithm"], f"{100 * rate:g} % ({rate / spe:.4g})"]
        out += [_stat(c, "departures", ".1f"), pm(c["away_share"], None, ".1f", 100.0, " %")]
        out += [_acc(c, "acc_avg"), "—" if base is None or rate == 0 else _pp(c, base)]
        out += [_acc(c, "acc_local_mean"), _acc(c, "acc_local_min")]
        return out + [_stat(c, "consensus_distance"), _stat(c, "average_shift_total")]

    return text_table(GRID, map(line, grid_list(cells)), "lll" + "r" * 8)


def join_cells(rows: Rows) -> Dict[Tuple[str, str], Dict[str, Any]]:
    """{(label, mode): the rejoin figures over seeds}: the shift at the join and, at each probe
    (steps after the join), the joiner's and the others' accuracy and squared distance."""
    out = {}
    for key, runs in _sections(rows, "join", lambda c: (c["label"], c["mode"])).items():
        cell = {
            "seeds": len(runs),
            **_stats(runs, ("shift_at_join", "acc_avg", "transfer_mb_sent")),
        }
        probes = []
        for i, first in enumerate(runs[0]["probes"]):
            at = [r["probes"][i] for r in runs]
            fields = [f for f in first if f != "steps_after_join"]
            probe = {"steps_after_join": first["steps_after_join"], **_stats(at, fields)}
            # the issue's "within the others' spread", or above it
            probe["caught_up"] = sum(p["joiner_acc"] >= p["others_acc_min"] for p in at)
            probes.append(probe)
        out[key] = dict(cell, probes=probes)
    return out


def shown_probes(probes: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The first, second and last evaluation after the join (each once)."""
    picked = [probes[i] for i in (0, 1, len(probes) - 1) if 0 <= i < len(probes)]
    return [p for i, p in enumerate(picked) if p not in picked[:i]]


JOIN = (
    "| algorithm | join by | shift at the join | final averaged-model acc (no churn) "
    "| steps after join | joiner acc | others acc mean [min, max] | joiner ≥ others' min "
    "| joiner ‖x−x̄‖² | others' mean ‖x−x̄‖² |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def join_table(joins, cells, topology: str) -> str:
    """The rejoin table: per algorithm and mode, the shift at the join, the run's final accuracy
    next to the no-churn grid row's, and the joiner against the others at each shown probe (the
    first three cells only on a mode's first line)."""
    lines = [JOIN]
    for (label, mode), cell in joins.items():
        base = cells.get((topology, label, 0.0))
        final = _acc(cell, "acc_avg") + (f" ({_acc(base, 'acc_avg')})" if base else "")
        lead = f"| {label} | {mode} | {_stat(cell, 'shift_at_join')} | {final} "
        for p in shown_probes(cell["probes"]):
            lines.append(
                lead + f"| {p['steps_after_join']} | {_acc(p, 'joiner_acc')} "
                f"| {100 * p['others_acc_mean']:.2f} % [{100 * p['others_acc_min']:.2f}, "
                f"{100 * p['others_acc_max']:.2f}] | {p['caught_up']}/{cell['seeds']} "
                f"| {_stat(p, 'joiner_distance2')} | {_stat(p, 'others_distance2_mean')} |"
            )
            lead = "| | | | "
    return "\n".join(lines) + "\n"


def grid_verdict(cells: Dict[Cell, Dict[str, Any]], rates: Sequence[float]) -> List[str]:
    """One line per (topology, algorithm): accuracy and shift at the highest rate vs no churn."""
    top, lines = max(rates), []
    for (topology, label, rate), cell in cells.items():
        base = cells.get((topology, label, 0.0))
        if rate != top or base is None:
            continue
        lines.append(
            f"- {topology}, {label}: at {100 * top:g} % churn per epoch the averaged model reaches "
            f"{_acc(cell, 'acc_avg')} against {_acc(base, 'acc_avg')} without churn "
            f"({_pp(cell, base)}); local min "
            f"{_acc(cell, 'acc_local_min')} ({_acc(base, 'acc_local_min')}); consensus distance "
            f"{cell['consensus_distance']:.3g} ({base['consensus_distance']:.3g}); the members' "
            f"average moved {cell['average_shift_total']:.3g} in all at "
            f"{cell['membership_changes']:.1f} changes ({base['average_shift_total']:.3g} at "
            f"{base['membership_changes']:.1f} without churn)."
        )
    return lines


def _spread(a: Dict[str, Any], b: Dict[str, Any], field: str) -> float:
    """The sum of two cells' std of `field` (0 where a cell has one seed)."""
    return (a[field + "_std"] or 0.0) + (b[field + "_std"] or 0.0)


def spread_verdict(cells: Dict[Cell, Dict[str, Any]]) -> List[str]:
    """How many churned cells differ from their no-churn row by more than the seeds' spread, and
    whose consensus distance grows with churn (more than 2x at the highest rate)."""
    churned = [(c, v) for c, v in cells.items() if c[2] > 0 and (c[0], c[1], 0.0) in cells]
    if not churned:
        return []
    top = max(c[2] for c, _ in churned)
    beyond, grows = 0, []
    for (topology, label, rate), cell in churned:
        base = cells[(topology, label, 0.0)]
        beyond += abs(cell["acc_avg"] - base["acc_avg"]) > _spread(cell, base, "acc_avg")
        if rate == top and cell["consensus_distance"] > 2 * base["consensus_distance"]:
            grows.append(
                f"{label} on {topology} ({base['consensus_distance']:.3g} → "
                f"{cell['consensus_distance']:.3g})"
            )
    return [
        f"- Of the {len(churned)} churned cells, {beyond} differ from their no-churn row's "
        "averaged-model accuracy by more than the sum of the two rows' std over seeds.",
        f"- Consensus distance more than doubled at {100 * top:g} % churn: "
        + ("; ".join(grows) if grows else "none")
        + ". (A repair makes new edges; an edge's state starts fresh at both ends, so Choco's "
        "per-edge public copies of a new edge start from zero, `membership/algorithm.py`.)",
    ]


def _gap(probe: Dict[str, Any]) -> str:
    return f"{100 * (probe['joiner_acc'] - probe['others_acc_mean']):+.2f} pp"


def join_verdict(joins) -> List[str]:
    """Average vs copy, per algorithm: the shift at the join and the joiner's gap to the others'
    mean accuracy at the first evaluation after the join."""
    lines = []
    for label in dict.fromkeys(label for label, _ in joins):
        avg, copy = joins.get((label, "average")), joins.get((label, "copy"))
        if avg is None or copy is None:
            continue
        a, c = avg["probes"][0], copy["probes"][0]
        gap = abs(avg["shift_at_join"] - copy["shift_at_join"])
        better = "average" if avg["shift_at_join"] < copy["shift_at_join"] else "copy"
        if gap > _spread(avg, copy, "shift_at_join"):
            better = f"smaller by {better}"
        else:
            better = "no difference beyond the seeds' std"
        lines.append(
            f"- {label}: shift at the join {avg['shift_at_join']:.3g} (average) vs "
            f"{copy['shift_at_join']:.3g} (copy): {better}; {a['steps_after_join']} "
            f"step(s) after it the joiner is {_gap(a)} (average) vs "
            f"{_gap(c)} (copy) from "
            f"the others' mean accuracy, at squared distance {a['joiner_distance2']:.3g} vs "
            f"{c['joiner_distance2']:.3g} from the members' average (others' mean "
            f"{a['others_distance2_mean']:.3g} / {c['others_distance2_mean']:.3g})."
        )
    return lines


def _seconds(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f} / {max(values):.2f}" if values else "—"


def _short_of(made: int, planned: int) -> str:
    """' (of N planned: ...)' when the soak made fewer faults than its plan, else ''."""
    if made >= planned:
        return ""
    return f" (of {planned} planned: the pause before the next one ended past 85 % of the steps)"


def soak_section(rows: Rows) -> str:
    """The emulated-cluster soak (the row whose config's section is "soak",
    `cluster.soak.soak`; its fixed text: soak.md beside this file): what happened to the run,
    then one line per fault kind. Empty while there is no soak row."""
    soak = [r for r in rows.records if r.config.get("section") == "soak"]
    if not soak:
        return ""
    record = soak[0]
    faults, final = record.row["rows"], record.row["final"]
    last = {str(k): str(k) for k in range(final["hosts"])}
    for f in faults:
        last[str(f["host"])] = f"{f['host']}-rejoin{f['fault']}"
    codes = [final["exit_codes"][name] for name in last.values()]
    detection, kinds = final["detection_to_continuation"], []
    for of in ([f for f in faults if f["kind"] == k] for k in sorted({f["kind"] for f in faults})):
        found = sorted({f["found_as"] for f in of})
        cont = " ; ".join(
            f"{h}: {detection[h]['median_s']:.2f} / {detection[h]['max_s']:.2f}"
            for h in found
            if h in detection
        )
        kinds.append(
            f"| {of[0]['kind']} | {len(of)} | {', '.join(found)} | "
            f"{sum(f['right_peer'] for f in of)} of {len(of)} | "
            f"{_seconds([f['to_membership_line_s'] for f in of])} | "
            f"{_seconds([f['to_readmission_s'] for f in of])} | {cont or '—'} |"
        )
    return fill(
        template(__file__, "soak.md"),
        **{k: final[k] for k in ("hosts", "epochs", "seed", "steps", "reference_steps", "cpus")},
        comm_timeout=final["comm_timeout_s"],
        last=final["hosts"] - 1,
        faults=len(faults),
        short=_short_of(len(faults), record.config["faults"]),
        minutes=final["wall_time_s"] / 60,
        changes=final["membership_changes"],
        reference_minutes=final["reference_wall_time_s"] / 60,
        members=final["members_at_end"],
        ok=sum(code == 0 for code in codes),
        hosts_known=len(codes),
        acc=100 * final["final_test_acc_avg_model"],
        reference_acc=100 * final["reference_test_acc_avg_model"],
        load_before=final["load_before"][0],
        load_after=final["load_after"][0],
        kinds=kinds,
        key=record.key,
    )


def plot(cells: Dict[Cell, Dict[str, Any]], s: Dict[str, Any]) -> bytes:
    """Averaged-model accuracy, consensus distance and average shift against the churn rate,
    one column per topology, one line per algorithm (error bars: std over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("acc_avg", "averaged-model acc (%)", 100.0),
        ("consensus_distance", "consensus distance", 1.0),
        ("average_shift_total", "average shift (sum)", 1.0),
    )
    topologies = s["topologies"]
    fig, axes = plt.subplots(
        3, len(topologies), figsize=(5.2 * len(topologies), 9.5), squeeze=False
    )
    for col, topology in enumerate(topologies):
        for row, (field, name, scale) in enumerate(panels):
            ax = axes[row][col]
            for label, _ in s["algorithms"]:
                pts = [
                    (100 * r, cells[(topology, label, r)])
                    for r in s["rates"]
                    if (topology, label, r) in cells
                ]
                if not pts:
                    continue
                ax.errorbar(
                    [p[0] for p in pts],
                    [scale * p[1][field] for p in pts],
                    yerr=[scale * (p[1][field + "_std"] or 0.0) for p in pts],
                    marker="o",
                    capsize=3,
                    label=label,
                )
            values = [cells[c][field] for c in cells if c[0] == topology]
            if field == "consensus_distance" and values and min(values) > 0:
                ax.set_yscale("log")  # exact gossip's and the compressed ones' differ by decades
            ax.set_xlabel("churn (% of peers leaving per epoch)")
            ax.set_ylabel(name)
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(topology)
                ax.legend(fontsize=8)
    fig.tight_layout()
    return png(fig)
