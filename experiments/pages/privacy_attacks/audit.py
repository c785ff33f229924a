"""The attack pages' one-run audit section (Steinke, Nasr and Jagielski 2023), from the rows.

Every attacked run carries `regimes.CANARIES_PER_VICTIM` public canaries per victim
(`privacy.canaries.canary_hooks`), each in the victim's data with probability 1/2 from a keystream
secret to the victim; `privacy.attack_run.canary_audit` scores them through the observer's
reconstruction of the victim and through the victim's own model, pools the two victims' canaries
and bounds ε from below at 95 % confidence over counts fixed before any score is seen
(`privacy.audit.audit_counts`). LiRA's references trained by gossip:
`privacy.gossip_references`.
"""

from __future__ import annotations

from typing import List

from gossip_powersgd.privacy.audit import audit_ceiling

from experiments.pages._markdown import fill, template


def ceiling(audit) -> float:
    """The largest bound this audit record can give (every guess right, at the best count)."""
    return audit_ceiling(audit["m"], audit["counts"], audit["delta"], audit["confidence"])


def _bounds(group, source: str) -> str:
    return " / ".join(f"{r['audit'][source]['epsilon']:.2f}" for r in group)


def audit_section(groups) -> str:
    """The one-run audit beside the claim, per (algorithm, ε) of the rows that carry canaries (its
    fixed text: audit.md beside this file)."""
    from .tables import _dp, label

    lines = []
    for g in groups:
        if not all("audit" in r for r in g):
            continue
        claimed = [max(r["eps_victims"] or [r["eps_max"]]) for r in g]
        best = [(r["audit"]["victim"]["correct"], r["audit"]["victim"]["guesses"]) for r in g]
        lines.append(
            f"| {label(g[0]['spec'])} | {_dp(g)} | "
            + (" / ".join(f"{e:.2f}" for e in claimed) if g[0]["target"] else "∞ (no DP)")
            + f" | {_bounds(g, 'observer')} | {_bounds(g, 'victim')} | {g[0]['audit']['m']} | "
            + " / ".join(f"{c}/{n}" for c, n in best)
            + " |"
        )
    if not lines:
        return ""
    r = next(r for g in groups for r in g if "audit" in r)["audit"]
    return fill(
        template(__file__, "audit.md"),
        per_victim=r["m"] // 2,
        m=r["m"],
        counts=len(r["counts"]),
        confidence=100 * r["confidence"],
        delta=r["delta"],
        ceiling=ceiling(r),
        lines=lines,
    )


def audit_answers(groups) -> List[str]:
    """Is any claim refuted? How close does the audit come to it? (from the rows)"""
    rows = [r for g in groups for r in g if "audit" in r]
    private = [r for r in rows if r["target"] is not None]
    plain = [r for r in rows if r["target"] is None]
    out = []
    if private:
        claims = [max(r["eps_victims"] or [r["eps_max"]]) for r in private]
        bounds = [max(r["audit"][s]["epsilon"] for s in ("observer", "victim")) for r in private]
        refuted = sum(b > c for b, c in zip(bounds, claims))
        out.append(
            f"- Does the one-run audit refute a claimed ε? In {refuted} of {len(private)} private "
            f"runs its lower bound exceeds the claim; the highest bound is {max(bounds):.2f} "
            f"(claims {min(claims):.2f}–{max(claims):.2f}), the bound's share of the claim at "
            f"most {max(b / c for b, c in zip(bounds, claims)):.2f}."
        )
    if plain:
        best = max(r["audit"]["victim"]["epsilon"] for r in plain)
        seen = max(r["audit"]["observer"]["epsilon"] for r in plain)
        out.append(
            f"- Without DP the same audit proves ε ≥ {best:.2f} from the victims' own models and "
            f"≥ {seen:.2f} from the observer's reconstructions; every guess right would show "
            f"{ceiling(plain[0]['audit']):.2f} with these {plain[0]['audit']['m']} canaries."
        )
    return out
