"""`python -m experiments privacy_regime`: the sweep that chose privacy_attacks.md's regime (LOSS
works without DP, DP stops it at a useful accuracy): `CANDIDATES` without DP, each (records, model)
in every DP recipe; `choose`: the rule, fixed before the runs; `tuning_epsilon`: what it costs."""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Dict, List, Mapping, Optional

from experiments.engine import Outputs, Page, Rows, Run, made_by
from experiments.pages import register
from experiments.pages._markdown import fill, snippets, table_rows, template
from experiments.pages._privacy import BASE, DELTA, TARGET, membership_split

#: (training records per peer, model, epochs without DP); a (records, model)'s DP rows are shared.
CANDIDATES = ((2000, "cnn1d", 60), (2000, "cnn1d", 120), (4000, "cnn1d", 30), (4000, "cnn1d", 60))
CANDIDATES += ((2000, "mlp:256,256", 60), (4000, "mlp:256,256", 30))
CANDIDATES += ((2000, "cnn1d:channels=64", 60), (4000, "cnn1d:channels=64", 30))
PEERS = 8  # ring:8, as `_privacy.BASE`
#: The non-private recipe, and what every DP recipe shares.
NONPRIVATE = dict(batch_size=32, lr=0.05)
DP = dict(dp_max_grad_norm=1.0, dp_delta=DELTA)
#: The DP recipes (Poisson batch, lr, epochs): the sweep's first (privacy_dp_sweep.md's lr / batch
#: ratio at batch 128, 30 epochs), then privacy_dp_sweep.md's choice (batch 256, lr 2.0) at 30
#: epochs and half its lr at 15 (the best of unrecorded probes on cnn1d and the MLP).
RECIPES = tuple(
    dict(batch_size=b, lr=lr, epochs=e)
    for b, lr, e in ((128, 1.0, 30), (256, 2.0, 30), (256, 1.0, 15))
)
MIN_NONMEMBERS = 2000  # the fewest pooled non-members a qualifying candidate has
OBSERVER, FRACTION = 0, 0.5
#: `_privacy.BASE` (ring:8, iid, SGD momentum 0.9, cosine), exact gossip, every ε released.
COMMON = dict(BASE, algorithm="exact", comm_timeout=900.0, release_peer_statistics=True)
#: --quick: one tiny candidate (seconds), a smoke test, not a result.
QUICK_CANDIDATES = ((150, "mlp:32", 2),)
QUICK_RECIPES = RECIPES[:1]
QUICK_DATA = "synthetic_logreg:d=20,classes=4,n={n}"
WORDS = snippets(__file__, "privacy_regime_parts.md")


def dataset(records: int, quick: bool) -> str:
    """8 peers' records and mnist1d's test set (20 % of what it generates)."""
    data = QUICK_DATA if quick else "mnist1d:num_samples={n}"
    return data.format(n=int(records * PEERS / 0.8))


def candidate_key(records: int, model: str, epochs: int) -> str:
    return f"{records}/peer {model} {epochs} epochs"


def recipe_label(recipe: Mapping[str, Any]) -> str:
    return f"batch {recipe['batch_size']}, lr {recipe['lr']:g}, {recipe['epochs']} epochs"


def _train(records: int, model: str, epochs: int, recipe, quick: bool) -> Dict[str, Any]:
    train = dict(COMMON, dataset=dataset(records, quick), model=model, seed=0)
    train.update(NONPRIVATE, epochs=epochs)
    if recipe is not None:
        train.update(DP, dp_target_epsilon=TARGET, **recipe)
        train.update(dict(epochs=2, batch_size=32) if quick else {})
    train["eval_every"] = train["epochs"]  # the accuracy at the end only
    return train


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    """Every candidate without DP, then every (records, model) in every DP recipe."""
    runs, grid = [], QUICK_CANDIDATES if quick else CANDIDATES
    for records, model, epochs in grid:
        name = candidate_key(records, model, epochs)
        config = dict(candidate=name, records=records, model=model, target=None)
        train = _train(records, model, epochs, None, quick)
        runs.append(Run(f"{name}/no DP", dict(config, train=train), 0, records * epochs))
    for records, model in dict.fromkeys((r, m) for r, m, _ in grid):
        config = dict(candidate=None, records=records, model=model, target=TARGET)
        for recipe in QUICK_RECIPES if quick else RECIPES:
            train = _train(records, model, 0, recipe, quick)
            # the first recipe's key: as when it was alone
            key = f"{records}/peer {model}/eps={TARGET:g}"
            key += "" if recipe == RECIPES[0] else f"/{recipe_label(recipe)}"
            runs.append(Run(key, dict(config, train=train), 0, records * train["epochs"]))
    return runs


def row(run: Run) -> Dict[str, Any]:
    """Train with the membership split, attack each victim's own model with LOSS."""
    import torch

    from gossip_powersgd.privacy.attack_run import observe, own_model_loss_attack
    from gossip_powersgd.privacy.dp_report import peer_epsilons
    from gossip_powersgd.training.models import build_model

    torch.set_num_threads(1)
    c, train = run.config, run.config["train"]
    where = dict(dataset=train["dataset"], partition="iid", topology=train["topology"])
    split = membership_split(dict(where, observer=OBSERVER, fraction=FRACTION), run.seed)
    victims = split.victims
    start, started = os.getloadavg()[0], time.perf_counter()
    observed = observe(dict(train), split, OBSERVER, (1.0,))
    base, summary = split.data(), observed.result.summary
    make = functools.partial(build_model, train["model"], base.input_shape, base.num_classes, 0)
    loss = own_model_loss_attack(observed, split, make)
    eps = peer_epsilons(summary)
    out = {k: c[k] for k in ("candidate", "records", "model", "target")}
    out.update(acc_victims=sum(loss["accuracy"]) / len(loss["accuracy"]))
    out.update(acc_avg=summary["final_test_acc_avg_model"], auc=loss["auc"], tpr0_1=loss["tpr"])
    out.update(band_auc=loss["band"]["auc"], band_tpr0_1=loss["band"]["tpr"][0])
    out.update(members=loss["members"], nonmembers=loss["nonmembers"])
    out["eps_victims"] = [eps[v] for v in victims] if len(eps) > 1 else None
    out["epochs"] = train["epochs"]
    out.update(sigma=summary.get("noise_multiplier"), steps=summary["steps"])
    return dict(out, seconds=time.perf_counter() - started, load=max(start, os.getloadavg()[0]))


def with_recipes(records) -> List[Dict[str, Any]]:
    """The stored rows (`engine.Record`s), each with its DP batch and lr from its config."""
    out = []
    for record in records:
        train, private = record.config["train"], record.row["target"] is not None
        recipe = dict(batch_size=train["batch_size"], lr=train["lr"]) if private else {}
        out.append(dict(record.row, **recipe))
    return out


def recipe_of(row: Mapping[str, Any]) -> Dict[str, Any]:
    return dict(batch_size=row["batch_size"], lr=row["lr"], epochs=row["epochs"])


def pairs(rows) -> Dict[str, Dict[str, Any]]:
    """{candidate: {"plain": its non-private row, "dp": its (records, model)'s best DP row}}."""
    dp: Dict[Any, List[Dict[str, Any]]] = {}
    for r in rows:
        if r["target"] is not None:
            dp.setdefault((r["records"], r["model"]), []).append(r)
    best = {shape: max(mine, key=lambda d: d["acc_victims"]) for shape, mine in dp.items()}
    plain = [r for r in rows if r["target"] is None]
    return {r["candidate"]: {"plain": r, "dp": best.get((r["records"], r["model"]))} for r in plain}


def qualifies(plain: Optional[Dict[str, Any]]) -> bool:
    """Enough pooled non-members, and the non-private LOSS AUC above its band."""
    enough = plain is not None and plain["nonmembers"] >= MIN_NONMEMBERS
    return enough and plain["auc"] > plain["band_auc"][1]


def _qualified(p) -> List[tuple]:
    """(best DP accuracy, name) of every qualifying candidate of `pairs` `p` with a DP row."""
    return [(x["dp"]["acc_victims"], n) for n, x in p.items() if x["dp"] and qualifies(x["plain"])]


def choose(rows) -> Optional[str]:
    """The qualifying candidate whose best DP recipe has the highest victims' accuracy, or None."""
    ok = _qualified(pairs(rows))
    return max(ok)[1] if ok else None


def chosen_setting(rows) -> Optional[Dict[str, Any]]:
    """The chosen candidate's records per peer, model, epochs, and DP recipe (`RECIPES`')."""
    name = choose(rows)
    if name is None:
        return None
    plain, dp = pairs(rows)[name]["plain"], pairs(rows)[name]["dp"]
    return dict({k: plain[k] for k in ("records", "model", "epochs")}, dp=recipe_of(dp))


def tuning_epsilon(rows, records: int) -> float:
    """Every private run on `records` per peer (the same victims' records) composed by PLD,
    replace-one, as each run's own ε: (sigma, a victim's rate: batch over half the members, steps)."""
    from gossip_powersgd.privacy.accounting import pld_epsilon

    private = [r for r in rows if r["target"] is not None and r["records"] == records]
    history = [(r["sigma"], r["batch_size"] / (r["members"] / 2), r["steps"]) for r in private]
    return pld_epsilon(history, DELTA, replace_one=True)


def _eps_cell(dp: Optional[Mapping[str, Any]]) -> str:
    eps = dp and dp["eps_victims"] and max(dp["eps_victims"])
    return f"{eps:.3g} (σ {dp['sigma']:.3g})" if dp and eps else "–"


def _row_cells(name: str, p: Dict[str, Any]) -> List[str]:
    plain, dp = p["plain"], p["dp"]
    band = plain["band_auc"]
    cells = [name, f"{100 * plain['acc_victims']:.1f} %", f"{plain['auc']:.3f}"]
    cells += [f"{band[0]:.3f}–{band[1]:.3f}"]
    cells.append(f"{plain['tpr0_1']:.4f} (band ≤ {plain['band_tpr0_1'][1]:.4f})")
    cells.append(f"{plain['nonmembers']}")
    cells.append(f"{100 * dp['acc_victims']:.1f} %" if dp else "not run")
    cells += [recipe_label(recipe_of(dp)) if dp else "–", f"{dp['auc']:.3f}" if dp else "–"]
    return cells + [_eps_cell(dp), "yes" if qualifies(plain) else "no"]


def recipe_table(data, grid) -> List[str]:
    """Every DP run: (records, model) x recipe, in plan order."""
    cells = [
        [f"{records}/peer {model}", recipe_label(recipe_of(r)), f"{100 * r['acc_victims']:.1f} %"]
        + [f"{r['auc']:.3f}", _eps_cell(r), f"{r['steps']}"]
        for records, model in dict.fromkeys((r, m) for r, m, _ in grid)
        for r in data
        if r["target"] is not None and (r["records"], r["model"]) == (records, model)
    ]
    return table_rows(cells)


def cost_words(p, data) -> List[str]:
    """What DP costs in accuracy across the candidates, and what choosing the recipe costs."""
    both = [(x["plain"], x["dp"]) for x in p.values() if x["dp"]]
    if not both:
        return []
    plain, dp = max(both, key=lambda b: b[1]["acc_victims"])
    runs = len([r for r in data if r["target"] is not None and r["records"] == dp["records"]])
    v = dict(acc=100 * dp["acc_victims"], records=dp["records"], model=dp["model"], runs=runs)
    v.update(recipe=recipe_label(recipe_of(dp)), plural="s" * (runs != 1), delta=DELTA)
    v.update(drop=100 * (plain["acc_victims"] - dp["acc_victims"]), target=TARGET)
    return WORDS["cost"].format(**v, eps=tuning_epsilon(data, dp["records"])).split("\n")


#: The regime privacy_attacks.md is measured in (`privacy_attacks.regimes.MAIN` is built from it):
#: the sweep's choice when it had one DP recipe. The page says whether it is still the choice.
ATTACK_PAGES_REGIME = dict(records=4000, model="cnn1d", epochs=60, dp=dict(RECIPES[2]))


def chosen_words(p, name: Optional[str], setting) -> List[str]:
    """The chosen candidate and recipe, whether privacy_attacks.md is measured in it, and ties."""
    if name is None:
        return [WORDS["none"]]
    plain, dp = p[name]["plain"], p[name]["dp"]
    tied = [other for a, other in _qualified(p) if other != name and a == dp["acc_victims"]]
    where = WORDS["trains" if setting == ATTACK_PAGES_REGIME else "still"]
    earlier = candidate_key(*(ATTACK_PAGES_REGIME[k] for k in ("records", "model", "epochs")))
    where = where.format(earlier=f"{earlier}, DP recipe {recipe_label(ATTACK_PAGES_REGIME['dp'])}")
    where += WORDS["tied"].format(tied=", ".join(tied)) if tied else ""
    v = dict(name=name, recipe=recipe_label(setting["dp"]), auc=plain["auc"], target=TARGET)
    v.update(band=plain["band_auc"][1], dp_acc=100 * dp["acc_victims"])
    return [WORDS["chosen"].format(**v, acc=100 * plain["acc_victims"], where=where)]


def render(rows: Rows) -> Outputs:
    """The page (its fixed text: privacy_regime.md beside this file)."""
    data = [r for r in with_recipes(rows.records) if "records" in r]
    grid = QUICK_CANDIDATES if rows.quick else CANDIDATES
    name, p = choose(data), pairs(data)
    names = [candidate_key(*g) for g in grid]
    missing = [n for n in names if n not in p]
    recipes = "; ".join(recipe_label(r) for r in (QUICK_RECIPES if rows.quick else RECIPES))
    fields = dict(made_by=made_by(rows), load=max((r["load"] for r in data), default=0))
    fields.update(batch=NONPRIVATE["batch_size"], lr=NONPRIVATE["lr"], target=TARGET)
    fields.update(recipes=recipes, clip=DP["dp_max_grad_norm"])
    fields.update(delta=DELTA, min_nonmembers=MIN_NONMEMBERS, cost=cost_words(p, data))
    fields["candidates"] = table_rows(_row_cells(n, p[n]) for n in names if n in p)
    fields["chosen"] = chosen_words(p, name, chosen_setting(data))
    fields["missing"] = ["", "Not run: " + "; ".join(missing) + "."] if missing else []
    fields["recipes_table"] = recipe_table(data, grid)
    return {"privacy_regime.md": fill(template(__file__, "privacy_regime.md"), **fields)}


PAGE = register(
    Page("privacy_regime", "the sweep that chose privacy_attacks.md's regime", plan, row, render)
)
