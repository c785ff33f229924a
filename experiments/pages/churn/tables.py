"""The churn page from its rows alone (`render_page`): churn.md (page.md, lines.md's verdicts,
soak.md where a soak row exists; mean ± std over seeds), churn.json and churn.png."""

from __future__ import annotations

import datetime
import json
import statistics
from typing import Any, Dict, Iterable, List, Sequence, Tuple

from experiments.engine import Outputs, Rows, made_by
from experiments.pages._figures import png, pyplot
from experiments.pages._markdown import fill, mean_sd, pm, snippets, table_rows, template
from experiments.suite.runs import BASE, QUICK_BASE
from experiments.suite.tables import header

#: The page's words around its numbers (lines.md beside this file), by part.
TEXT = snippets(__file__, "lines.md")
#: The grid's figures aggregated over seeds (mean and std), in the JSON's order.
GRID_FIELDS = ("acc_avg", "acc_local_mean", "acc_local_min", "consensus_distance")
GRID_FIELDS += ("average_shift_total", "departures", "away_share", "membership_changes")
GRID_FIELDS += ("mb_per_peer",)
Cell = Tuple[str, str, float]  # (topology, algorithm label, churn rate per epoch)


def _stats(runs: Sequence[Dict[str, Any]], fields: Iterable[str]) -> Dict[str, Any]:
    """{field: mean, field_std: std (None for one run)} over `runs` for each of `fields`."""
    out: Dict[str, Any] = {}
    for field in fields:
        out[field], out[field + "_std"] = mean_sd(r[field] for r in runs)
    return out


def _sections(rows: Rows, section: str, *names: str) -> Dict[tuple, List[Dict[str, Any]]]:
    """{(config[name], ...): [row, ...]} of the rows of one section, in plan order."""
    grouped: Dict[tuple, List[Dict[str, Any]]] = {}
    for record in rows.records:
        if record.config["section"] == section:
            key = tuple(record.config[n] for n in names)
            grouped.setdefault(key, []).append(record.row)
    return grouped


def grid_cells(rows: Rows) -> Dict[Cell, Dict[str, Any]]:
    """{(topology, label, rate): {seeds: n, field: mean, field_std: std}} in plan order."""
    grouped = _sections(rows, "grid", "topology", "label", "rate_per_epoch")
    return {k: {"seeds": len(runs), **_stats(runs, GRID_FIELDS)} for k, runs in grouped.items()}


def _stat(c: Dict[str, Any], field: str, fmt: str = ".3g") -> str:
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


def grid_table(cells: Dict[Cell, Dict[str, Any]], spe: int) -> str:
    """A line per (topology, algorithm, rate), no churn first, with the accuracy's Δ to it."""

    def line(c: Dict[str, Any]) -> List[str]:
        rate, base = c["rate_per_epoch"], cells.get((c["topology"], c["algorithm"], 0.0))
        out = [c["topology"], c["algorithm"], f"{100 * rate:g} % ({rate / spe:.4g})"]
        out += [_stat(c, "departures", ".1f"), pm(c["away_share"], None, ".1f", 100.0, " %")]
        out += [_acc(c, "acc_avg"), "—" if base is None or rate == 0 else _pp(c, base)]
        out += [_acc(c, "acc_local_mean"), _acc(c, "acc_local_min")]
        return out + [_stat(c, "consensus_distance"), _stat(c, "average_shift_total")]

    return "\n".join([TEXT["grid header"], *table_rows(map(line, grid_list(cells)))]) + "\n"


def join_cells(rows: Rows) -> Dict[Tuple[str, str], Dict[str, Any]]:
    """{(label, mode): the rejoin figures over seeds}, at the join and at each probe after it."""
    out = {}
    for key, runs in _sections(rows, "join", "label", "mode").items():
        fields = ("shift_at_join", "acc_avg", "transfer_mb_sent")
        cell = {"seeds": len(runs), **_stats(runs, fields)}
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


def join_table(joins, cells, topology: str) -> str:
    """The rejoin table: per algorithm and mode, the joiner against the others at the first,
    second and last evaluation after the join (the first four cells on a mode's first line)."""
    lines = [TEXT["join header"]]
    for (label, mode), cell in joins.items():
        base = cells.get((topology, label, 0.0))
        final = _acc(cell, "acc_avg") + (f" ({_acc(base, 'acc_avg')})" if base else "")
        lead = f"| {label} | {mode} | {_stat(cell, 'shift_at_join')} | {final} "
        probes, n = cell["probes"], len(cell["probes"])
        for p in (probes[i] for i in dict.fromkeys(i for i in (0, 1, n - 1) if 0 <= i < n)):
            others = f"{100 * p['others_acc_mean']:.2f} % [{100 * p['others_acc_min']:.2f}, "
            others += f"{100 * p['others_acc_max']:.2f}]"
            shown = [str(p["steps_after_join"]), _acc(p, "joiner_acc"), others]
            shown += [f"{p['caught_up']}/{cell['seeds']}", _stat(p, "joiner_distance2")]
            lines += table_rows([shown + [_stat(p, "others_distance2_mean")]])
            lines[-1] = lead + lines[-1]
            lead = "| | | | "
    return "\n".join(lines) + "\n"


def _spread(a: Dict[str, Any], b: Dict[str, Any], field: str) -> float:
    """The sum of two cells' std of `field` (0 where a cell has one seed)."""
    return (a[field + "_std"] or 0.0) + (b[field + "_std"] or 0.0)


def grid_verdict(cells: Dict[Cell, Dict[str, Any]], rates: Sequence[float]) -> List[str]:
    """A line per (topology, algorithm) at the highest rate vs no churn, then the cells beyond
    the seeds' spread and those whose consensus distance more than doubles."""
    churned = [(k, c, cells.get(k[:2] + (0.0,))) for k, c in cells.items() if k[2] > 0]
    churned = [x for x in churned if x[2] is not None]
    if not churned:
        return []
    lines = []
    for (topology, label, rate), c, b in (x for x in churned if x[0][2] == max(rates)):
        fields = dict(topology=topology, label=label, top=100 * rate, c=c, b=b, pp=_pp(c, b))
        fields.update(acc=_acc(c, "acc_avg"), base_acc=_acc(b, "acc_avg"))
        fields.update(low=_acc(c, "acc_local_min"), base_low=_acc(b, "acc_local_min"))
        lines.append(fill(TEXT["grid"], **fields))
    top = max(k[2] for k, _, _ in churned)
    beyond = sum(abs(c["acc_avg"] - b["acc_avg"]) > _spread(c, b, "acc_avg") for _, c, b in churned)
    grows = [
        fill(TEXT["grows"], label=k[1], topology=k[0], c=c, b=b)
        for k, c, b in churned
        if k[2] == top and c["consensus_distance"] > 2 * b["consensus_distance"]
    ]
    fields = dict(n=len(churned), beyond=beyond, top=100 * top, grows="; ".join(grows) or "none")
    return lines + [fill(TEXT["spread"], **fields)]


def join_verdict(joins) -> List[str]:
    """Average vs copy, per algorithm: the shift and the joiner's gap at the first evaluation."""
    lines = []
    for label in dict.fromkeys(label for label, _ in joins):
        avg, copy = joins.get((label, "average")), joins.get((label, "copy"))
        if avg is None or copy is None:
            continue
        a, c = avg["probes"][0], copy["probes"][0]
        better = "average" if avg["shift_at_join"] < copy["shift_at_join"] else "copy"
        if abs(avg["shift_at_join"] - copy["shift_at_join"]) > _spread(avg, copy, "shift_at_join"):
            better = f"smaller by {better}"
        else:
            better = "no difference beyond the seeds' std"
        gap_a, gap_c = (f"{100 * (p['joiner_acc'] - p['others_acc_mean']):+.2f} pp" for p in (a, c))
        fields = dict(label=label, avg=avg, copy=copy, a=a, c=c, better=better)
        lines.append(fill(TEXT["join"], **fields, gap_a=gap_a, gap_c=gap_c))
    return lines


def _seconds(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f} / {max(values):.2f}" if values else "—"


def soak_section(rows: Rows) -> str:
    """soak.md from the soak's row (`cluster.soak.soak`), a line per fault kind; "" without one."""
    record = next((r for r in rows.records if r.config.get("section") == "soak"), None)
    if record is None:
        return ""
    faults, final = record.row["rows"], record.row["final"]
    last = {str(k): str(k) for k in range(final["hosts"])}
    for f in faults:
        last[str(f["host"])] = f"{f['host']}-rejoin{f['fault']}"
    codes = [final["exit_codes"][name] for name in last.values()]
    detection, kinds = final["detection_to_continuation"], []
    for of in ([f for f in faults if f["kind"] == k] for k in sorted({f["kind"] for f in faults})):
        found = sorted({f["found_as"] for f in of})
        cont = [
            f"{h}: {detection[h]['median_s']:.2f} / {detection[h]['max_s']:.2f}"
            for h in found
            if h in detection
        ]
        kinds.append(
            [of[0]["kind"], str(len(of)), ", ".join(found)]
            + [f"{sum(f['right_peer'] for f in of)} of {len(of)}"]
            + [_seconds([f[k] for f in of]) for k in ("to_membership_line_s", "to_readmission_s")]
            + [" ; ".join(cont) or "—"]
        )
    planned, minutes = record.config["faults"], ("wall_time_s", "reference_wall_time_s")
    acc = ("final_test_acc_avg_model", "reference_test_acc_avg_model")
    return fill(
        template(__file__, "soak.md"),
        f=final,
        last=final["hosts"] - 1,
        faults=len(faults),
        short=fill(TEXT["short"], planned=planned) if len(faults) < planned else "",
        minutes=[final[k] / 60 for k in minutes],
        acc=[100 * final[k] for k in acc],
        ok=sum(code == 0 for code in codes),
        hosts_known=len(codes),
        kinds=table_rows(kinds),
        key=record.key,
    )


def wall_span(rows: Rows) -> str:
    """The wall time from the first start (a finish, to the minute, less its time) to the end."""
    if not rows.records:
        return ""
    ends = [datetime.datetime.strptime(r.finished, "%Y-%m-%d %H:%M UTC") for r in rows.records]
    starts = [e - datetime.timedelta(seconds=r.seconds) for e, r in zip(ends, rows.records)]
    minutes = (max(ends) - min(starts)).total_seconds() / 60
    return fill(TEXT["wall"], span="under a minute" if minutes < 1 else f"about {minutes:.0f} min")


def page_text(rows: Rows, s: Dict[str, Any], cells, joins) -> str:
    """churn.md without its soak section (its fixed text: page.md beside this file)."""
    recipe = QUICK_BASE if s["quick"] else BASE
    title = f"Training through churn, in-process{' (--quick)' if s['quick'] else ''}"
    extra = TEXT["header"] + " " + wall_span(rows)
    text = header(title, made_by(rows), extra)
    spe, still = s["steps_per_epoch"], [c["acc_avg"] for (_, _, r), c in cells.items() if r == 0]
    soaked = any(r.config.get("section") == "soak" for r in rows.records)
    unfinished = fill(TEXT["unfinished"], made=len(rows.records), planned=rows.planned) + "\n\n"
    level = "no no-churn rows yet"
    if still:
        level = fill(TEXT["level"], low=100 * min(still), high=100 * max(still))
    # the recipe's fields (a quick recipe lacks some), then the plan's (their model, epochs)
    fields = {"momentum": 0, "schedule": "constant", "warmup_epochs": 0, **recipe, **s}
    fields["seeds"] = ", ".join(map(str, s["seeds"]))
    fields["rates"] = ", ".join(f"{100 * r:g} % → rate={r / spe:.4g}" for r in s["rates"])
    return text + fill(
        template(__file__),
        **fields,
        unfinished="" if rows.complete else unfinished,
        n=s["topologies"][0].split(":")[1],
        spe=spe,
        steps=s["epochs"] * spe,
        grid_verdict="\n".join(grid_verdict(cells, s["rates"])),
        grid_table=grid_table(cells, spe),
        join_verdict="\n".join(join_verdict(joins)),
        join_table=join_table(joins, cells, s["join_topology"]),
        soak=TEXT["soaked" if soaked else "not soaked"],
        level=level,
    )


def render_page(rows: Rows, s: Dict[str, Any]) -> Outputs:
    """churn.md, churn.json and churn.png."""
    cells, joins = grid_cells(rows), join_cells(rows)
    data = {
        "command": rows.command,
        "complete": rows.complete,
        "setting": {k: v for k, v in s.items() if k != "algorithms"},
        "algorithms": [list(a) for a in s["algorithms"]],
        "grid": grid_list(cells),
        "join": [dict(algorithm=label, mode=mode, **cell) for (label, mode), cell in joins.items()],
    }
    return {
        "churn.md": page_text(rows, s, cells, joins) + soak_section(rows),
        "churn.json": json.dumps(data, indent=1, default=str) + "\n",
        "churn.png": plot(cells, s),
    }


#: The plot's rows: (field, axis label, scale).
PANELS = (
    ("acc_avg", "averaged-model acc (%)", 100.0),
    ("consensus_distance", "consensus distance", 1.0),
    ("average_shift_total", "average shift (sum)", 1.0),
)


def plot(cells: Dict[Cell, Dict[str, Any]], s: Dict[str, Any]) -> bytes:
    """`PANELS` against the churn rate, a column per topology, a line per algorithm (± std)."""
    plt = pyplot()
    n = len(s["topologies"])
    fig, axes = plt.subplots(3, n, figsize=(5.2 * n, 9.5), squeeze=False)
    for col, topology in enumerate(s["topologies"]):
        for row, (field, name, scale) in enumerate(PANELS):
            ax = axes[row][col]
            for label, _ in s["algorithms"]:
                keys = [(topology, label, r) for r in s["rates"] if (topology, label, r) in cells]
                pts = [(100 * k[2], cells[k]) for k in keys]
                if not pts:
                    continue
                xs, ys = [x for x, _ in pts], [scale * c[field] for _, c in pts]
                errors = [scale * (c[field + "_std"] or 0.0) for _, c in pts]
                ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=label)
            values = [cells[c][field] for c in cells if c[0] == topology]
            if field == "consensus_distance" and values and min(values) > 0:
                ax.set_yscale("log")  # exact gossip's and the compressed ones' differ by decades
            ax.set(xlabel="churn (% of peers leaving per epoch)", ylabel=name)
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(topology)
                ax.legend(fontsize=8)
    fig.tight_layout()
    return png(fig)
