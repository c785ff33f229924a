"""The bandwidth page's sections on accuracy and time (lines of markdown from `figures.collect`'s
numbers) and the answer in words (`answer`: which is faster, by how much, at each rate)."""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence

from experiments.pages._markdown import Column, columns, fill, grid_end, snippets, table

from .recipe import BY_KEY, COMPARED, Setting, algorithms_on, rates_on, tuning_keys

#: The page's fixed text (page.md beside this file), by part.
TEXT = snippets(__file__, "page.md")


def rate_text(rate: str) -> str:
    """ "1 Gbit/s", "100 Mbit/s"."""
    for unit in ("kbit", "mbit", "gbit"):
        if rate.endswith(unit):
            return f"{rate[: -len(unit)]} {unit[0].upper()}bit/s"
    return rate


def seconds_text(seconds: Optional[float]) -> str:
    """A duration as a reader takes it in: 0.84 s, 12.3 s, 41 min, 5.2 h, 3.1 d."""
    if seconds is None:
        return "not reached"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


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
    target = ["- No target: the compared rows are missing."]
    if f["target"] is not None:
        target = lines("target", target=_pct(f["target"]))
    return lines(
        "method",
        **s.base,
        **{k: first.get(k, "?") for k in ("parameters", "steps")},
        quick=lines("quick") if s.quick else [],
        topologies=", ".join(s.topologies),
        seeds=", ".join(f"{t}: {len(v)}" for t, v in s.seeds.items()),
        tune_topology=s.tune_topology,
        target=target,
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
            fields = dict(topology=topology, own=_labels(own), tune=s.tune_topology)
            cut.append(fill(TEXT["cut only"], **fields))
        missing = ", ".join(rate_text(r) for r in s.rates if r not in rates_on(s, topology))
        if missing:
            cut.append(fill(TEXT["cut rates"], topology=topology, rates=missing))
    for rate, keys in s.untimed_at.items():
        cut.append(fill(TEXT["cut untimed"], rate=rate_text(rate), keys=_labels(keys)))
    if s.eval_untimed_at:
        cut.append(fill(TEXT["cut eval"], rates=", ".join(map(rate_text, s.eval_untimed_at))))
    if s.slow is not None and s.slow_algorithms:
        where, keys = ", ".join(s.slow_topologies), _labels(s.slow_algorithms)
        cut.append(fill(TEXT["cut slow"], topologies=where, keys=keys))
    cut.append(TEXT["cut e2e"])  # the full plan (`recipe.FULL`) makes none: --quick does
    sizes = sorted({len(tuning_keys(s, BY_KEY[a])) for a in s.algorithms})
    cut.append(fill(TEXT["cut grids"], sizes=f"{sizes[0]} to {sizes[-1]}"))
    costs = f.get("costs", {}).get(s.tune_topology, {}).get(s.rates[-1], {})
    step, why = costs.get("steps", {}).get("exact"), []
    if f.get("run_seconds"):
        why.append(fill(TEXT["why run"], run=seconds_text(f["run_seconds"])))
    if step:
        where = f"{s.tune_topology} at {rate_text(s.rates[-1])}"
        why.append(fill(TEXT["why step"], where=where, step=seconds_text(step["measured"])))
    why_text = f" ({'; '.join(why)})" if why else ""
    return lines("cuts", why=why_text, parts="; ".join(cut))


def _ratio(times: Mapping[str, Optional[float]], key: str) -> str:
    """`key`'s time ÷ PowerGossip r1's."""
    mine, theirs = times.get("pg-r1"), times.get(key)
    return "—" if mine is None or theirs is None else f"{theirs / mine:.3g}×"


def answer_section(s: Setting, f: Mapping[str, Any]) -> List[str]:
    """ "The answer": its lines, and per topology the compared rows' times at each rate."""
    out = ["## The answer", ""]
    if not f["answer"]:
        return out + ["Not measured (see below).", ""]
    out += [f"- {line}" for line in f["answer"]] + [""]
    shown = [k for k in COMPARED if k in s.algorithms]
    # an item: (rate, {algorithm: mean seconds to the target, core each})
    spec: List[Column] = [("rate", lambda x: rate_text(x[0]))]
    spec += [(_label(k), lambda x, k=k: seconds_text(x[1].get(k))) for k in shown]
    spec += [(f"{_label(k)} ÷ PowerGossip r1", lambda x, k=k: _ratio(x[1], k)) for k in shown[1:]]
    spec += [("fastest of all rows", lambda x: _label(fastest(x[1])))]
    for topology, by_rate in f["times"].items():
        core = table_of(f["times"], topology, [r for r in s.rates if r in by_rate], "core_each")
        out += [fill(TEXT["answer table"], topology=topology, target=_pct(f["target"])), ""]
        out += columns(spec, core.items())
    return out


def _tuning_row(t: Mapping[str, Any]) -> List[str]:
    tried = ["failed" if v["error"] else _pct(v["acc_avg"]) for v in t["values"]]
    tried = "; ".join(f"{v['value']:g}: {x}" for v, x in zip(t["values"], tried))
    end = grid_end(t["chosen"], [v["value"] for v in t["values"]])
    chosen = "—" if t["chosen"] is None else f"{t['chosen']:g}"
    return [t["label"], t["tuned"], tried, chosen + (f" (the grid's {end})" if end else "")]


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
    """The tuning table, the plateau run, and per topology the accuracy table."""
    out = [f"## Tuning (tuning topology {s.tune_topology}, seed 0)", ""]
    head = ["algorithm", "tuned", "final averaged-model accuracy", "chosen"]
    out += table(head, map(_tuning_row, f["tuning"])) + paragraph("tuning")
    p = f["plateau"]
    if p:
        low, high = (_pct(a) for a in p["acc"])
        fields = dict(p, label=_label(p["algorithm"]), topology=s.tune_topology, low=low)
        out += paragraph("plateau", **fields, high=high, gain=100 * (p["acc"][1] - p["acc"][0]))
    for topology, per in f["accuracy"].items():
        n = list(per.values())[-1].get("evaluations", "?")
        head = fill(TEXT["accuracy header"], target=_pct(f["target"]), n=n)
        out += [f"## Accuracy against steps: {topology}", ""]
        out += table(head, map(_accuracy_row, per.values()))
    return out


#: The time tables' figures, in the page's order (their titles: page.md's "time FIGURE").
TIME_TABLES = ("core_each", "core_each_with_evals", "measured", "projected")


def time_sections(s: Setting, f: Mapping[str, Any]) -> List[str]:
    """Per topology the time to the target under each figure (`TIME_TABLES`), rates as columns."""
    out = []
    for topology, by_rate in f["times"].items():
        for key in TIME_TABLES:
            spec: List[Column] = [("algorithm", _label)]
            spec += [
                (rate_text(r), lambda k, r=r: _seconds_cell(by_rate[r].get(k, {}).get(key)))
                for r in s.rates
                if r in by_rate
            ]
            out += [f"## Time to {_pct(f['target'])}: {topology}, {TEXT['time ' + key]}", ""]
            out += columns(spec, algorithms_on(s, topology))
        out += paragraph("time note")
    return out


def _seconds_cell(entry: Optional[Mapping]) -> str:
    if entry is None or entry["mean"] is None:
        return "—" if entry is None else "not reached"
    low, high = (seconds_text(entry[k]) for k in ("min", "max"))
    same = entry["min"] == entry["max"]
    return seconds_text(entry["mean"]) + ("" if same else f" [{low}, {high}]")


def table_of(t: Mapping, topology: str, rates, figure: str):
    """{rate: {algorithm: mean seconds or None}} of one topology and figure."""
    at = t.get(topology, {})
    return {r: {k: v.get(figure, {}).get("mean") for k, v in at.get(r, {}).items()} for r in rates}


def answer(s: Setting, t: Mapping, target: Optional[float], acc=None) -> List[str]:
    """The answer in words per topology (core each, training only) and what other figures change."""
    if target is None or not t:
        return []
    out, pct = [], f"{100 * target:.0f} %"
    for topology in s.topologies:
        rates = [r for r in s.rates if r in t.get(topology, {})]
        if not rates:
            continue
        core = table_of(t, topology, rates, "core_each")
        versus = compare_line(core, rates) + " " + compare_line(core, rates, "allreduce")
        out.append(f"**{topology}**, to {pct}, hosts with a core each (training time): {versus}")
        per = (acc or {}).get(topology, {})
        finals = {k: per.get(k, {}).get("final_mean") for k in COMPARED}
        if None not in finals.values():
            line = f"Final accuracy ({topology}, mean over seeds): "
            line += ", ".join(f"{_label(k)} {100 * v:.2f} %" for k, v in finals.items())
            if finals["pg-r1"] < min(finals["exact"], finals["allreduce"]):
                best = 100 * max(per["pg-r1"]["peaks"])
                line += fill(TEXT["below"], best=best, epochs=s.base["epochs"])
            out.append(line + ".")
        fast = [(rate_text(r), fastest(core[r])) for r in rates]
        fast_text = ", ".join(f"{r}: {_label(k)}" for r, k in fast if k)
        out.append(f"Fastest to {pct} at each rate ({topology}, core each): {fast_text}.")
        out += _other_figures(t, topology, rates, core)
    return out


def _other_figures(t: Mapping, topology: str, rates, core: Mapping) -> List[str]:
    """Whether the measured figure, and a core each with the evaluations, change the verdicts."""
    import topologies

    out, hosts = [], topologies.parse(topology).size
    for figure in ("measured", "core_each_with_evals"):
        other = table_of(t, topology, rates, figure)
        compared = [r for r in rates if other[r].get("pg-r1") is not None]
        if not compared:
            continue
        changed = [
            rate_text(r)
            for r in compared
            for against in ("exact", "allreduce")
            if _ahead(core[r], against) != _ahead(other[r], against)
        ]
        verdict = "other verdicts at " + ", ".join(dict.fromkeys(changed))
        verdict = verdict if changed else "the same verdicts"
        missing = [rate_text(r) for r in rates if r not in compared]
        if missing:
            verdict += f" (not timed at {', '.join(missing)})"
        out.append(fill(TEXT[f"with {figure}"], hosts=hosts, verdict=verdict))
    return out


def _ahead(row: Mapping[str, Optional[float]], against: str) -> bool:
    """Whether PowerGossip r1 reaches the target, and before `against`."""
    mine, theirs = row.get("pg-r1"), row.get(against)
    return mine is not None and (theirs is None or mine < theirs)


def compare_line(times: Mapping, rates: Sequence[str], against="exact") -> str:
    """One sentence: at which rates PowerGossip r1 reaches the target before `against`, and by what
    factor (their times, `times[rate][algorithm]`, None where the target is not reached)."""
    name, other = _label("pg-r1"), _label(against)
    ahead, behind, open_ = [], [], []
    for rate in rates:
        mine, theirs, r = times[rate].get("pg-r1"), times[rate].get(against), rate_text(rate)
        if mine is None and theirs is None:
            open_.append(f"{r} (neither reaches it)")
        elif theirs is None or (mine is not None and mine < theirs):
            why = f"{other} never reaches it" if theirs is None else f"{theirs / mine:.3g}× sooner"
            ahead.append(f"{r} ({why})")
        else:
            why = f"{name} never reaches it" if mine is None else f"{other} {mine / theirs:.3g}×"
            behind.append(f"{r} ({why}{'' if mine is None else ' sooner'})")
    parts = [f"{name} reaches it before {other} at " + ", ".join(ahead)] if ahead else []
    if behind:
        lead = "and not at " if ahead else f"{name} is not ahead of {other} at "
        parts.append(lead + ", ".join(behind))
    if open_:
        parts.append("; at " + ", ".join(open_))
    return " ".join(parts) + "."


def fastest(times: Mapping[str, Optional[float]]) -> Optional[str]:
    """The algorithm with the shortest time, None if none reaches the target."""
    reached = {k: v for k, v in times.items() if v is not None}
    return min(reached, key=reached.get) if reached else None
