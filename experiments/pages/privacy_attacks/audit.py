"""The attack pages' one-run audit section (Steinke, Nasr and Jagielski 2023) from the rows:
each attacked run's canaries (`privacy.canaries`), scored through the observer's reconstruction
and the victim's own model (`privacy.attack_run.canary_audit`), bound epsilon from below."""

from __future__ import annotations

from typing import List

from gossip_powersgd.privacy.audit import audit_ceiling

from experiments.pages._markdown import fill, table_rows, template

from .tables import WORDS, _head

#: The best bound without DP, through the victims' own models and the observer's reconstructions.
BEST = (("best", "victim"), ("seen", "observer"))


def ceiling(audit) -> float:
    """The largest bound this audit record can give (every guess right, at the best count)."""
    return audit_ceiling(audit["m"], audit["counts"], audit["delta"], audit["confidence"])


def bounds(group, source: str) -> str:
    """The audited lower bounds through `source`, one per seed."""
    return " / ".join(f"{r['audit'][source]['epsilon']:.2f}" for r in group)


def audit_section(groups) -> str:
    """The one-run audit beside the claim, per (algorithm, ε) of the rows that carry canaries (its
    fixed text: audit.md beside this file)."""
    lines = []
    for g in groups:
        if not all("audit" in r for r in g):
            continue
        claimed = " / ".join(f"{max(r['eps_victims'] or [r['eps_max']]):.2f}" for r in g)
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
    return " / ".join(
        f"{r['audit']['victim']['correct']}/{r['audit']['victim']['guesses']}" for r in group
    )


def audit_answers(groups) -> List[str]:
    """Is any claim refuted? How close does the audit come to it? (from the rows)"""
    rows = [r for g in groups for r in g if "audit" in r]
    private = [r for r in rows if r["target"] is not None]
    claims = [max(r["eps_victims"] or [r["eps_max"]]) for r in private]
    return audit_words(private, claims, [r for r in rows if r["target"] is None], share=True)


def audit_words(private, claims, plain, share: bool) -> List[str]:
    """The audit's answers (words.md beside this file): how many `private` rows' bounds refute
    their `claims` (with `share`: the largest bound's share of its claim), and what the audit
    proves of the `plain` (non-private) rows."""
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
