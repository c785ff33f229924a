"""The bandwidth page's sections, as lines of markdown, from `figures.collect`'s numbers, and the
answer in words (`answer`: the numbers say which is faster, and by how much, at each rate)."""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence

from experiments.pages._markdown import Column, columns, fill, grid_end, snippets, table

from .compose import rate_text, seconds_text
from .recipe import BY_KEY, COMPARED, Setting, algorithms_on, rates_on
from .recipe import grid as _grid

#: The page's fixed text (page.md beside this file), by part.
TEXT = snippets(__file__, "page.md")


def lines(part: str, **fields: Any) -> List[str]:
    """A part of page.md filled in, as lines."""
    return fill(TEXT[part], **fields).split("\n")


def paragraph(part: str, **fields: Any) -> List[str]:
    """A one-paragraph part filled in, then a blank line."""
    return [fill(TEXT[part], **fields), ""]


def _label(key: Optional[str]) -> str:
    return "—" if key is None else BY_KEY[key].label


def _labels(keys) -> str:
    return ", ".join(map(_label, keys))


def _pct(value: Optional[float]) -> str:
    return "—" if value is None else f"{100 * value:.2f} %"


def _mb(value: float) -> str:
    return f"{value / 1e6:.4g}"


def method(s: Setting, f: Mapping[str, Any]) -> List[str]:
    """ "What was run, and how"."""
    first = next((e for per in f["accuracy"].values() for e in per.values() if "steps" in e), {})
    target = f["target"]
    return lines(
        "method",
        **s.base,
        quick=lines("quick") if s.quick else [],
        parameters=first.get("parameters", "?"),
        steps=first.get("steps", "?"),
        topologies=", ".join(s.topologies),
        seeds=", ".join(f"{t}: {len(v)}" for t, v in s.seeds.items()),
        tune_topology=s.tune_topology,
        target=lines("target", target=_pct(target))
        if target is not None
        else ["- No target: the compared rows are missing."],
        cuts=cuts(s, f),
    ) + [""]


def cuts(s: Setting, f: Mapping[str, Any]) -> List[str]:
    """What the full plan leaves out to fit this machine, and why (from the plan and the rows)."""
    if s.quick:
        return []
    seeds = ", ".join(f"{len(v)} on {t}" for t, v in s.seeds.items())
    cut = [fill(TEXT["cut seeds"], seeds=seeds, compared=_labels(COMPARED))]
    gossip = [k for k in s.algorithms if not BY_KEY[k].over_all_hosts]
    for topology in s.topologies:
        own = [k for k in algorithms_on(s, topology) if not BY_KEY[k].over_all_hosts]
        if len(own) < len(gossip):
            cut.append(
                fill(TEXT["cut only"], topology=topology, own=_labels(own), tune=s.tune_topology)
            )
        missing = ", ".join(rate_text(r) for r in s.rates if r not in rates_on(s, topology))
        if missing:
            cut.append(fill(TEXT["cut rates"], topology=topology, rates=missing))
    for rate, keys in s.untimed_at.items():
        cut.append(fill(TEXT["cut untimed"], rate=rate_text(rate), keys=_labels(keys)))
    if s.eval_untimed_at:
        rates = ", ".join(map(rate_text, s.eval_untimed_at))
        cut.append(fill(TEXT["cut eval"], rates=rates))
    if s.slow is not None and s.slow_algorithms:
        where = ", ".join(s.slow_topologies)
        cut.append(fill(TEXT["cut slow"], topologies=where, keys=_labels(s.slow_algorithms)))
    cut.append(TEXT["cut e2e"])  # the full plan (`recipe.FULL`) makes none: --quick does
    sizes = sorted({len(_grid(s, BY_KEY[a])) for a in s.algorithms})
    cut.append(fill(TEXT["cut grids"], sizes=" to ".join(map(str, (sizes[0], sizes[-1])))))
    costs = f.get("costs", {}).get(s.tune_topology, {}).get(s.rates[-1], {})
    slow_step, why = costs.get("steps", {}).get("exact"), []
    if f.get("run_seconds"):
        why.append(f"an in-process training run took {seconds_text(f['run_seconds'])} (median)")
    if slow_step:
        why.append(
            f"an exact-gossip step on {s.tune_topology} at {rate_text(s.rates[-1])} "
            f"{seconds_text(slow_step['measured'])} measured"
        )
    why_text = f" ({'; '.join(why)})" if why else ""
    return lines("cuts", why=why_text, parts="; ".join(cut))


def _ratio(times: Mapping[str, Optional[float]], key: str) -> str:
    """`key`'s time ÷ PowerGossip r1's."""
    mine, theirs = times.get("pg-r1"), times.get(key)
    return "—" if mine is None or theirs is None else f"{theirs / mine:.3g}×"


def answer_section(s: Setting, f: Mapping[str, Any]) -> List[str]:
    lines = ["## The answer", ""]
    if not f["answer"]:
        return lines + ["Not measured (see below).", ""]
    lines += [f"- {line}" for line in f["answer"]] + [""]
    shown = [k for k in ("pg-r1", "exact", "allreduce") if k in s.algorithms]
    # an item: (rate, {algorithm: mean seconds to the target, core each})
    spec: List[Column] = [("rate", lambda x: rate_text(x[0]))]
    spec += [(_label(k), lambda x, k=k: seconds_text(x[1].get(k))) for k in shown]
    spec += [(f"{_label(k)} ÷ PowerGossip r1", lambda x, k=k: _ratio(x[1], k)) for k in shown[1:]]
    spec += [("fastest of all rows", lambda x: _label(fastest(x[1])))]
    for topology, by_rate in f["times"].items():
        core = table_of(f["times"], topology, [r for r in s.rates if r in by_rate], "core_each")
        lines += [
            f"{topology}, time to {_pct(f['target'])}, hosts with a core each, training time:",
            "",
        ]
        lines += columns(spec, core.items())
    return lines


def _tuning_row(t: Mapping[str, Any]) -> List[str]:
    tried = [
        f"{v['value']:g}: " + ("failed" if v["error"] else _pct(v["acc_avg"])) for v in t["values"]
    ]
    end = grid_end(t["chosen"], [v["value"] for v in t["values"]])
    chosen = (
        "—" if t["chosen"] is None else f"{t['chosen']:g}" + (f" (the grid's {end})" if end else "")
    )
    return [t["label"], t["tuned"], "; ".join(tried), chosen]


def _accuracy_row(e: Mapping[str, Any]) -> List[str]:
    if "finals" not in e:
        return [e["label"], "", "", "", "failed: " + "; ".join(e["errors"])[:120]]
    mean, low, high = e["final_mean"], min(e["finals"]), max(e["finals"])
    final = f"{100 * mean:.2f} % [{100 * low:.2f}, {100 * high:.2f}]"
    return [
        e["label"],
        f"{e['lr']:g} / " + ("—" if e.get("gamma") is None else f"{e['gamma']:.3g}"),
        _pct(mean) if len(e["finals"]) == 1 else final,
        ", ".join("never" if x is None else str(x) for x in e["steps_to_target"]),
        ", ".join("—" if x is None else f"{x:.4g}" for x in e["mb_to_target"]),
        f"{e['mb_total']:.4g}",
        f"{e['metric_mb_total']:.4g}",
    ]


def accuracy_section(s: Setting, f: Mapping[str, Any]) -> List[str]:
    lines = ["## Tuning (tuning topology " + s.tune_topology + ", seed 0)", ""]
    head = ["algorithm", "tuned", "final averaged-model accuracy", "chosen"]
    lines += table(head, map(_tuning_row, f["tuning"])) + paragraph("tuning")
    p = f["plateau"]
    if p:
        low, high = (_pct(a) for a in p["acc"])
        fields = dict(p, label=_label(p["algorithm"]), topology=s.tune_topology, low=low)
        lines += paragraph("plateau", **fields, high=high, gain=100 * (p["acc"][1] - p["acc"][0]))
    for topology, per in f["accuracy"].items():
        n = list(per.values())[-1].get("evaluations", "?")
        head = fill(TEXT["accuracy header"], target=_pct(f["target"]), n=n)
        lines += [f"## Accuracy against steps: {topology}", ""]
        lines += table(head, map(_accuracy_row, per.values()))
    return lines


#: The time tables: (figure, with the evaluations, what the title says).
TIME_TABLES = (
    ("core_each", False, "hosts with a core each, training time"),
    ("core_each", True, "hosts with a core each, with an evaluation after every epoch"),
    ("measured", False, "measured on the cluster (cores shared), training time"),
    ("projected", False, "projected (compute alone + the project's projected comm)"),
)


def time_sections(s: Setting, f: Mapping[str, Any]) -> List[str]:
    lines = []
    for topology, by_rate in f["times"].items():
        rates = [r for r in s.rates if r in by_rate]
        for figure, evals, what in TIME_TABLES:
            key = figure + ("_with_evals" if evals else "")
            spec: List[Column] = [("algorithm", _label)]
            spec += [
                (rate_text(r), lambda k, r=r: _seconds_cell(by_rate[r].get(k, {}).get(key)))
                for r in rates
            ]
            lines += [f"## Time to {_pct(f['target'])}: {topology}, {what}", ""]
            lines += columns(spec, algorithms_on(s, topology))
        lines += paragraph("time note")
    return lines


def _seconds_cell(entry: Optional[Mapping]) -> str:
    if entry is None:
        return "—"
    if entry["mean"] is None:
        return "not reached"
    if entry["min"] == entry["max"]:
        return seconds_text(entry["mean"])
    return f"{seconds_text(entry['mean'])} [{seconds_text(entry['min'])}, {seconds_text(entry['max'])}]"


# ---- the answer in words ----------------------------------------------------------------------
def table_of(t: Mapping, topology: str, rates, figure: str, evals: bool = False):
    """{rate: {algorithm: mean seconds or None}} of one topology and figure."""
    suffix = "_with_evals" if evals else ""
    return {
        rate: {
            k: v.get(figure + suffix, {}).get("mean")
            for k, v in t.get(topology, {}).get(rate, {}).items()
        }
        for rate in rates
    }


def answer(
    s: Setting, t: Mapping, target: Optional[float], acc: Optional[Mapping] = None
) -> List[str]:
    """The answer in words, per topology, from the core-each figure (training only), with what
    the measured figure and the evaluations change."""
    if target is None or not t:
        return []
    lines = []
    pct = f"{100 * target:.0f} %"
    for topology in s.topologies:
        rates = [r for r in s.rates if r in t.get(topology, {})]
        if not rates:
            continue
        core = table_of(t, topology, rates, "core_each")
        versus = compare_line(core, rates) + " " + compare_line(core, rates, "allreduce")
        lines.append(f"**{topology}**, to {pct}, hosts with a core each (training time): {versus}")
        finals = {k: acc_of(acc, topology, k) for k in COMPARED}
        if None not in finals.values():
            line = f"Final accuracy ({topology}, mean over seeds): "
            line += ", ".join(f"{_label(k)} {100 * v:.2f} %" for k, v in finals.items())
            if finals["pg-r1"] < min(finals["exact"], finals["allreduce"]):
                best = 100 * max(acc[topology]["pg-r1"]["peaks"])
                line += fill(TEXT["below"], best=best, epochs=s.base["epochs"])
            lines.append(line + ".")
        fast = [(r, fastest(core[r])) for r in rates]
        fast_text = ", ".join(f"{rate_text(r)}: {_label(k)}" for r, k in fast if k)
        lines.append(f"Fastest to {pct} at each rate ({topology}, core each): {fast_text}.")
        lines += _other_figures(t, topology, rates, core)
    return lines


def _other_figures(t: Mapping, topology: str, rates, core: Mapping) -> List[str]:
    """Whether the measured figure, and a core each with the evaluations, change the verdicts."""
    measured = f"the step as measured here ({_hosts(topology)} hosts on this machine's cores)"
    evaluated = "a core each, with an evaluation after every epoch"
    lines = []
    for figure, evals, what in (("measured", False, measured), ("core_each", True, evaluated)):
        other = table_of(t, topology, rates, figure, evals)
        compared = [r for r in rates if other[r].get("pg-r1") is not None]
        if not compared:
            continue
        changed = [
            rate_text(r)
            for r in compared
            for against in ("exact", "allreduce")
            if _ahead(core[r], "pg-r1", against) != _ahead(other[r], "pg-r1", against)
        ]
        verdict = "other verdicts at " + ", ".join(dict.fromkeys(changed))
        verdict = verdict if changed else "the same verdicts"
        missing = [rate_text(r) for r in rates if r not in compared]
        if missing:
            verdict += f" (not timed at {', '.join(missing)})"
        lines.append(f"With {what}: {verdict}.")
    return lines


def acc_of(acc: Optional[Mapping], topology: str, key: str) -> Optional[float]:
    """Algorithm `key`'s final accuracy on `topology`, mean over seeds (None if unknown)."""
    return (acc or {}).get(topology, {}).get(key, {}).get("final_mean")


def _hosts(topology: str) -> int:
    import topologies

    return topologies.parse(topology).size


def _ahead(row: Mapping[str, Optional[float]], who: str, against: str) -> Optional[bool]:
    mine, theirs = row.get(who), row.get(against)
    if mine is None:
        return False
    return theirs is None or mine < theirs


def compare_line(
    times: Mapping[str, Mapping[str, Optional[float]]],
    rates: Sequence[str],
    against: str = "exact",
    who: str = "pg-r1",
) -> str:
    """One sentence: at which rates `who` reaches the target before `against`, and by what factor
    (their times, `times[rate][algorithm]`, None where the target is not reached)."""
    name, other = _label(who), _label(against)
    ahead, behind, open_ = [], [], []
    for rate in rates:
        mine, theirs = times[rate].get(who), times[rate].get(against)
        if mine is None and theirs is None:
            open_.append(f"{rate_text(rate)} (neither reaches it)")
        elif theirs is None:
            ahead.append(f"{rate_text(rate)} ({other} never reaches it)")
        elif mine is None:
            behind.append(f"{rate_text(rate)} ({name} never reaches it)")
        elif mine < theirs:
            ahead.append(f"{rate_text(rate)} ({theirs / mine:.3g}× sooner)")
        else:
            behind.append(f"{rate_text(rate)} ({other} {mine / theirs:.3g}× sooner)")
    parts = []
    if ahead:
        parts.append(f"{name} reaches it before {other} at " + ", ".join(ahead))
    if behind:
        parts.append(
            ("and not at " if ahead else f"{name} is not ahead of {other} at ") + ", ".join(behind)
        )
    if open_:
        parts.append("; at " + ", ".join(open_))
    return " ".join(parts) + "."


def fastest(times: Mapping[str, Optional[float]]) -> Optional[str]:
    reached = {k: v for k, v in times.items() if v is not None}
    return min(reached, key=reached.get) if reached else None
