"""privacy_mechanisms.md from its rows: the mechanisms in the attack pages' regime, with the
calibration, accuracy and attack tables of the logreg page (`page`) and the one-run audit beside
each claim (its fixed text: audited.md beside this file)."""

from __future__ import annotations

from typing import Any, Dict, List

from gossip_powersgd.privacy.audit import audit_ceiling

from experiments.pages._markdown import fill, template
from experiments.pages._markdown import table as md_table

from . import page
from .page import NAMES, PRIVATE

AUDIT = (
    "mechanism | algorithm | claimed ε vs neighbour (RDP / PLD) | audited ε ≥, observer's "
    "reconstruction | audited ε ≥, victim's own model | audited ε ≥, blind model (baseline) | "
    "right / guesses (victim's model, best count)"
)


def _per_seed(group, source: str) -> str:
    return " / ".join(f"{r['audit'][source]['epsilon']:.2f}" for r in group)


def _ceiling(audit) -> float:
    return audit_ceiling(audit["m"], audit["counts"], audit["delta"], audit["confidence"])


def audit_lines(section, c) -> List[str]:
    """The audit per (mechanism, algorithm): the claim, and the lower bound through the
    observer's reconstruction, the victim's own model and the blind model, one value per seed."""
    rows, noises, out = section["rows"], section["noises"], []
    for name in ("none",) + PRIVATE:
        for algorithm in c["algorithms"]:
            group = [r for r in rows if r["mechanism"] == name and r["algorithm"] == algorithm]
            if not group:
                continue
            n = noises.get(name)
            claim = f"{n['neighbour']:.2f} / {n['neighbour_pld']:.2f}" if n else "∞ (no DP)"
            best = " / ".join(
                f"{r['audit']['victim']['correct']}/{r['audit']['victim']['guesses']}"
                for r in group
            )
            out.append(
                [NAMES[name], algorithm, claim]
                + [_per_seed(group, s) for s in ("observer", "victim", "blind model")]
                + [best]
            )
    return md_table(AUDIT, out, end=None)


def audit_answers(section) -> List[str]:
    """Is a claim refuted, how close the audit comes, what it proves without DP, and whether the
    blind baseline stays at chance."""
    rows, noises = section["rows"], section["noises"]
    private = [r for r in rows if r["mechanism"] != "none"]
    plain = [r for r in rows if r["mechanism"] == "none"]
    bounds = [max(r["audit"][s]["epsilon"] for s in ("observer", "victim")) for r in private]
    claims = [noises[r["mechanism"]]["neighbour"] for r in private]
    refuted = sum(b > c for b, c in zip(bounds, claims))
    blind = max(r["audit"]["blind model"]["epsilon"] for r in rows)
    audit = rows[0]["audit"]
    return [
        f"- Does the one-run audit refute a claimed ε? In {refuted} of {len(private)} private runs "
        f"its lower bound exceeds the claim; the highest bound is {max(bounds):.2f} (claims "
        f"{min(claims):.2f}–{max(claims):.2f}).",
        f"- Without DP the same audit proves ε ≥ "
        f"{max(r['audit']['victim']['epsilon'] for r in plain):.2f} from the victims' own models "
        f"and ≥ {max(r['audit']['observer']['epsilon'] for r in plain):.2f} from the observer's "
        f"reconstructions; every guess right would show {_ceiling(audit):.2f} with these "
        f"{audit['m']} canaries.",
        f"- The blind baseline (the same audit through a model that never saw a victim): at most "
        f"{blind:.2f} over every run" + (" (chance: 0 expected)." if blind == 0 else "."),
    ]


def _setting_fields(regime, calibration) -> Dict[str, Any]:
    s, dp, public = regime["setting"], regime["setting"]["dp"], calibration["public"]
    local = calibration["local"]
    fields = dict(topology=s["topology"], model=s["model"], peers=public["peers"])
    fields["data"] = s["dataset"].split(":")[0]
    fields.update(records=public["train_size"] // public["peers"], members=public["members"])
    fields.update(batch=s["batch_size"], lr=s["lr"], epochs=s["epochs"], momentum=s["momentum"])
    fields.update(dp_batch=dp["batch_size"], dp_lr=dp["lr"], dp_epochs=dp["epochs"])
    fields.update(clip=dp["dp_max_grad_norm"], delta=dp["dp_delta"], q=local["q"])
    fields.update(steps=local["steps"], references=regime["references"])
    return dict(fields, canaries=regime["canaries"], seeds=", ".join(map(str, regime["seeds"])))


def render_page(sections, generated, command, c, regime) -> str:
    """The page: `sections` (one: the ring's setting, noises, rows), who made the rows, the
    command, `c` (target, algorithms, loads, the calibration row) and the regime it ran in."""
    section = sections[0]
    tables: Dict[str, Dict[tuple, List[float]]] = {}
    results = page.results_lines(sections, c, tables)[0]
    table = tables[section["setting"]["topology"]]
    return fill(
        template(__file__, "audited.md"),
        generated=generated,
        command=command,
        how_run=page._how_run(dict(c, load=[_span(c["load"])], nice=[all(c["nice"])])),
        target=c["target"],
        ratio=c["ratio"],
        observer=c["observer"],
        per_step=c["per_step"],
        calibration=page.calibration_lines(sections),
        results=results,
        attacks=page.attack_lines(sections, c),
        audit=audit_lines(section, c),
        audit_answers=audit_answers(section),
        answers=page.answer_lines(section, table, c),
        **_setting_fields(regime, c["calibration"]),
    )


def _span(loads) -> tuple:
    """The machine's load at the first run's start and the last run's end."""
    return (loads[0][0], loads[-1][1])
