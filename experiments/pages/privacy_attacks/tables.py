"""The attack pages' tables (headers: page.md), the one-run audit section (Steinke, Nasr and
Jagielski 2023: audit.md) and a log-scale ROC, figures as mean ± sd over seeds."""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Sequence

from gossip_powersgd.privacy.attacks import ATTACKS, null_band_of
from gossip_powersgd.privacy.audit import audit_ceiling

from experiments.pages._markdown import fill, mean_sd, pm, snippets, table_rows, template
from experiments.pages._privacy import quarters

from .regimes import ALGORITHMS

#: The attack the headline columns use (the strongest here on average; every attack is in the rows).
HEADLINE = "LiRA offline"
#: The pages' sentences and optional sections shown where their rows call for them.
WORDS = snippets(__file__, "words.md")
#: The audit's best bound without DP, through the victims' own models and the reconstructions.
BEST = (("best", "victim"), ("seen", "observer"))


def label(spec: str) -> str:
    return dict((s, name) for name, s in ALGORITHMS).get(spec, spec)


def groups(rows: Sequence[Dict[str, Any]]) -> List[List[Dict[str, Any]]]:
    """Rows of the same (algorithm, target epsilon), in plan order."""
    out: Dict[tuple, List[Dict[str, Any]]] = {}
    for r in rows:
        if "failure" not in r:
            out.setdefault((r["spec"], r["target"]), []).append(r)
    return list(out.values())


def _stat(values: Sequence[float], digits: int = 3, pct: bool = False) -> str:
    """mean ± sd of `values` (None and nan left out; "n/a" where none is left), `pct`: in %."""
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return pm(*mean_sd(values), f".{digits}f", 100 if pct else 1) if values else "n/a"


def _last(r: Dict[str, Any]) -> Dict[str, Any]:
    return r["rounds"][str(r["last"])]


def _reconstructions(r: Dict[str, Any]) -> List[str]:
    return [k for k in _last(r)["quality"] if k != "observer's own"]


def _strongest(group: Sequence[Dict[str, Any]]) -> str:
    """The observer's estimator of highest mean headline AUC (not the oracle: it uses the truth)."""
    names = [n for n in _reconstructions(group[0]) if not n.startswith("oracle")]
    return max(names, key=lambda n: statistics.fmean(_flats(group, f"auc/{n}/{HEADLINE}")))


def _models(group: Sequence[Dict[str, Any]]) -> List[str]:
    """The victim's own model, then the strongest reconstruction where the observer forms any."""
    return ["victim"] + ([_strongest(group)] if _reconstructions(group[0]) else [])


def _band(r: Dict[str, Any]) -> Dict[str, list]:
    return null_band_of(r["members"], r["nonmembers"])


def _flats(group, key: str) -> List[float]:
    return [_last(r)["flat"][key] for r in group]


def _flat(group, key: str, digits: int = 3) -> str:
    """mean ± sd over the group's seeds of a flat figure at the last round."""
    return _stat(_flats(group, key), digits)


def _head(group: Sequence[Dict[str, Any]]) -> List[str]:
    """A group's first cells: its algorithm, and its DP (the victims' own ε over the seeds)."""
    r = group[0]
    if r["target"] is None:
        return [label(r["spec"]), "none"]
    eps = [e for g in group for e in (g["eps_victims"] or [g["eps_max"]])]
    low, high = f"{min(eps):.3g}", f"{max(eps):.3g}"
    dp = f"ε = {low if low == high else f'{low}–{high}'} (victims' own; target {r['target']:g})"
    return [label(r["spec"]), dp]


def blind_check(group: Sequence[Dict[str, Any]]) -> str:
    """How many seeds have the class prior's AUC and the blind model's figures in the null band."""
    ok = 0
    for r in group:
        band, blind = _band(r), _last(r)["evaluation"]["blind_model"][HEADLINE]
        pairs = [(_last(r)["flat"]["auc/class prior"], band["auc"]), (blind["auc"], band["auc"])]
        ok += all(lo <= x <= hi for x, (lo, hi) in pairs + list(zip(blind["tpr"], band["tpr"])))
    return f"{ok}/{len(group)}"


def plateau(group: Sequence[Dict[str, Any]]) -> tuple:
    """Accuracy at ½ and ¾ of the run and the last quarter's change, mean ± sd over seeds."""
    at = [quarters(r.get("evals") or (), r["epochs"]) for r in group]
    change = [100 * (r["acc_avg"] - q["acc_3q"]) for r, q in zip(group, at)]
    pct = [_stat([q[k] for q in at], 2, True) for k in ("acc_half", "acc_3q")]
    return tuple(v if v == "n/a" else v + " %" for v in pct) + (_stat(change, 2),)


def runs_table(rows) -> List[str]:
    out = []
    for g in groups(rows):
        half, three, change = plateau(g)
        sigma = "—" if g[0]["sigma"] is None else format(g[0]["sigma"], ".3g")
        accs = [_stat([r[k] for r in g], 2, True) + " %" for k in ("acc_avg", "acc_victim")]
        mb = [f"{g[0][k]:.3f}" for k in ("mb_sent_per_peer", "observed_mb")]
        consensus, seconds = _stat([r["consensus"] for r in g], 3), [r["run_seconds"] for r in g]
        cells = [sigma, str(len(g)), *accs, *mb, consensus, f"{half} / {three}", change]
        out.append(_head(g) + cells + [f"{statistics.fmean(seconds):.0f}"])
    return table_rows(out)


def leakage_table(rows) -> List[str]:
    out, oracle, blind = [], "oracle: D on the span of all factors", f"blind model/{HEADLINE}"
    for g in groups(rows):
        strongest = _strongest(g) if _reconstructions(g[0]) else None
        models = ["victim"] + ([strongest] if strongest else [])
        models += [oracle] if strongest and oracle in _reconstructions(g[0]) else []
        band = _band(g[0])
        tail = [_flat(g, "auc/class prior"), f"{_flat(g, f'auc/{blind}')} / "]
        tail[1] += _flat(g, f"tpr0.1/{blind}", 4)
        bands = [band["auc"], *band["tpr"]]
        tail.append(" / ".join(f"[{a:.{d}f}, {b:.{d}f}]" for (a, b), d in zip(bands, (3, 4, 4))))
        for name in models + ["observer's own", "average of all"]:
            title = name if name != strongest else f"strongest reconstruction: {name}"
            cells = [_flat(g, f"auc/{name}/{a}") for a in ("LOSS", "LiRA offline", "LiRA online")]
            cells += [_flat(g, f"tpr{x}/{name}/{HEADLINE}", 4) for x in ("0.1", "1")]
            out.append(_head(g) + [title, *cells, *tail, blind_check(g)])
    return table_rows(out)


def all_attacks_table(rows) -> List[str]:
    return table_rows(
        _head(g) + [_flat(g, f"auc/victim/{a}") for a in ATTACKS] for g in groups(rows)
    )


def reconstruction_table(rows) -> List[str]:
    out = []
    for g in groups(rows):
        own = f"{_flat(g, f'auc/victim/{HEADLINE}')} / {_flat(g, f'tpr1/victim/{HEADLINE}', 4)}"
        for name in _reconstructions(g[0]) + ["observer's own"]:
            q = [_last(r)["quality"][name] for r in g]
            cells = [name, _stat([x["l2"] for x in q], 4)]
            cells.append(_stat([x["agreement"] for x in q], 2, True) + " %")
            cells += [_flat(g, f"auc/{name}/{HEADLINE}"), _flat(g, f"tpr1/{name}/{HEADLINE}", 4)]
            out.append(_head(g) + cells + [own])
    return table_rows(out)


def rounds_table(rows) -> List[str]:
    out = []
    for g in groups(rows):
        r0 = g[0]
        for name in _models(g):
            cells = [
                f"{_stat([r['rounds'][str(s)]['flat'].get(f'auc/{name}/{HEADLINE}') for r in g])} "
                f"({r0['observed_mb'] * (s + 1) / r0['steps']:.3g} MB)"
                for s in r0["round_steps"]
            ]
            out.append(_head(g) + [name] + cells)
    return table_rows(out)


def per_class_table(rows) -> List[str]:
    out = []
    for g in groups(rows):
        mean = [statistics.fmean(c) for c in zip(*(_last(r)["per_class_victim"] for r in g))]
        out.append(_head(g) + [", ".join(f"{v:.3f}" for v in mean)])
    return table_rows(out)


def plot_roc(rows) -> bytes:
    """Log-log ROC of the headline attack on each group's first row: victim, reconstruction."""
    from experiments.pages._figures import png, pyplot

    plt, gs = pyplot(), groups(rows)
    fig, axes = plt.subplots(1, len(gs), figsize=(3.6 * len(gs), 3.6), squeeze=False)
    for ax, g in zip(axes.flat, gs):
        e = _last(g[0])["evaluation"]
        for name, style in zip(_models(g), ("-", "--")):
            fpr, tpr = ([max(v, 1e-4) for v in x] for x in e["models"][name][HEADLINE]["roc"])
            ax.plot(fpr, tpr, style, label="victim" if name == "victim" else "reconstruction")
        ax.plot([1e-4, 1], [1e-4, 1], ":", color="grey", label="chance")
        ax.set(xscale="log", yscale="log", xlim=(1e-4, 1), ylim=(1e-4, 1))
        dp = "no DP" if g[0]["target"] is None else "DP"
        ax.set_title(f"{label(g[0]['spec'])}, {dp}", fontsize=8)
        ax.set(xlabel="FPR", ylabel="TPR")
        ax.legend(fontsize=6)
    fig.tight_layout()
    return png(fig, dpi=100)


def ceiling(audit) -> float:
    """The largest bound this audit record can give (every guess right, at the best count)."""
    return audit_ceiling(audit["m"], audit["counts"], audit["delta"], audit["confidence"])


def _claim(r: Dict[str, Any]) -> float:
    """The ε a private row claims: its victims' largest."""
    return max(r["eps_victims"] or [r["eps_max"]])


def bounds(group, source: str) -> str:
    """The audited lower bounds through `source`, one per seed."""
    return " / ".join(f"{r['audit'][source]['epsilon']:.2f}" for r in group)


def audit_section(groups) -> str:
    """The one-run audit beside the claim per (algorithm, ε) with canaries (text: audit.md)."""
    lines = []
    for g in groups:
        if not all("audit" in r for r in g):
            continue
        claimed = " / ".join(f"{_claim(r):.2f}" for r in g)
        cells = [claimed if g[0]["target"] else "∞ (no DP)", bounds(g, "observer")]
        cells += [bounds(g, "victim"), str(g[0]["audit"]["m"]), right(g)]
        lines.append(_head(g) + cells)
    if not lines:
        return ""
    r = next(r for g in groups for r in g if "audit" in r)["audit"]
    fields = dict(per_victim=r["m"] // 2, m=r["m"], counts=len(r["counts"]), delta=r["delta"])
    fields.update(confidence=100 * r["confidence"], ceiling=ceiling(r))
    return fill(template(__file__, "audit.md"), **fields, lines=table_rows(lines))


def right(group) -> str:
    """Right guesses / guesses through the victim's model at the best count, one per seed."""
    return " / ".join("{correct}/{guesses}".format(**r["audit"]["victim"]) for r in group)


def audit_answers(groups) -> List[str]:
    """Is any claim refuted? How close does the audit come to it? (from the rows)"""
    rows = [r for g in groups for r in g if "audit" in r]
    private = [r for r in rows if r["target"] is not None]
    claims = [_claim(r) for r in private]
    return audit_words(private, claims, [r for r in rows if r["target"] is None], share=True)


def audit_words(private, claims, plain, share: bool) -> List[str]:
    """How many `private` rows' bounds refute their `claims`, and the audit without DP."""
    out = []
    if private:
        bounds = [max(r["audit"][s]["epsilon"] for s in ("observer", "victim")) for r in private]
        v = dict(refuted=sum(b > c for b, c in zip(bounds, claims)), runs=len(private))
        v.update(high=max(bounds), low_claim=min(claims), high_claim=max(claims), share="")
        if share:
            v["share"] = WORDS["share"].format(max(b / c for b, c in zip(bounds, claims)))
        out.append(WORDS["refuted"].format(**v))
    if plain:
        v = {k: max(r["audit"][s]["epsilon"] for r in plain) for k, s in BEST}
        v.update(ceiling=ceiling(plain[0]["audit"]), m=plain[0]["audit"]["m"])
        out.append(WORDS["without_dp"].format(**v))
    return out
