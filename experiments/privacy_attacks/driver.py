"""The CLI: `python -m experiments.privacy_attacks [--regime dp|overfit] [--quick] [--out DIR]
[--part nodp|dp|all]` runs the attacked runs of the regime's plan (rows already in the folder's
partial file, from an interrupted run of the same plan, are kept), then writes the page, its JSON
and the ROC plot: privacy_attacks.* for the default regime (privacy_dp_sweep.md's, where DP
learns), privacy_attacks_overfit.* for the overfitting regime (where the attacks find members);
`--network-only` recomputes only the default page's network-DP section (seconds) from the rows
already in the folder's privacy_attacks.json."""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from gossip_powersgd.utils import atomic_write, check_writable_dir, git_commit, one_line

from . import report
from .rows import budget_row
from .measure import (
    ALGORITHMS,
    dp_recipe,
    OVERFIT_SETTING,
    QUICK_SETTING,
    REFERENCE_LR,
    REFERENCES,
    SETTING,
    attacked_run,
    network_dp,
)

ROOT = Path(__file__).resolve().parents[2]
#: The default output folder: under runs/ (git-ignored); the committed page is written only by an
#: explicit `--out experiments/results`.
DEFAULT_OUT = ROOT / "runs" / "privacy-attacks"
SEEDS = (0, 1, 2)
QUICK_SEEDS = (0, 1)
_EXACT, _R1, _R4, _CHOCO = (spec for _, spec in ALGORITHMS)
#: The plan in the order it runs, in groups of (spec, target epsilon or None); a group runs seed
#: by seed, so an interrupted page has whole seeds of the first groups. All rows train in
#: privacy_dp_sweep.md's regime (measure.SETTING, measure.DP). (a) exact gossip and PowerGossip
#: r1 without DP and at epsilon 8; (b) PowerGossip r4 and Choco sign at epsilon 8; (c) exact
#: gossip at epsilon 3 and 1 (where the neighbour's TPR reaches chance); then r4 and Choco
#: without DP; PowerGossip r1 at epsilon 3 and 1; last, r4 and Choco at epsilon 3.
PLAN_GROUPS = (
    ((_EXACT, None), (_R1, None), (_EXACT, 8.0), (_R1, 8.0)),
    ((_R4, 8.0), (_CHOCO, 8.0)),
    ((_EXACT, 3.0), (_EXACT, 1.0)),
    ((_R4, None), (_CHOCO, None)),
    ((_R1, 3.0), (_R1, 1.0)),
    ((_R4, 3.0), (_CHOCO, 3.0)),
)
QUICK_PLAN_GROUPS = (((_EXACT, None), (_R1, None), (_EXACT, 8.0)),)
SCALE_NOTE = (
    "the plan, in its order of priority, 3 seeds of every row: (a) exact gossip and PowerGossip "
    "r1 without DP and at target ε = 8; (b) PowerGossip r4 and Choco sign at ε = 8; (c) exact "
    "gossip at ε = 3 and 1; then PowerGossip r4 and Choco sign without DP; PowerGossip r1 at "
    "ε = 3 and 1; last, PowerGossip r4 and Choco sign at ε = 3. 8 LiRA reference models per "
    "seed (not more: the rows came first). The DP rows train for their ε's budget from "
    "privacy_dp_budget.md (30 epochs at ε = 8 where the sweep chose its recipe at 15, 15 at "
    "ε = 3 and 1): the ε = 8 rows ran again at 30 epochs (`--part dp`, niced, beside two other "
    "jobs on the 2 shared cores), and the rows whose setting and recipe did not change were "
    "taken from the previous page (`--reuse`, each with the commit that made it)."
)
NOT_REACHED = (
    "The non-private rows train at lr 0.1, not at privacy_dp_sweep.md's 0.4 (its non-private "
    "reference, one seed): run at 0.4 (this page's command at commit bf0fd24), exact gossip "
    "without DP ended at 97.9 %, 90.0 % and 10.1 % (chance) on seeds 0, 1 and 2, so the "
    "regime's non-private accuracy is not robust at 0.4; the DP rows keep the sweep's chosen "
    "row unchanged.",
    "Useful accuracy below ε = 8: in this regime DP falls well short of the non-private "
    "accuracy at ε = 3 and reaches none at ε = 1 (the runs table), so the leakage at those ε "
    "is measured on models no one would deploy.",
    "PowerGossip r4 and Choco sign at target ε = 1 were not run (time on the shared machine).",
    "No attack finds members in this regime, even without DP, so where the neighbour's TPR "
    "reaches chance cannot be read here: privacy_attacks_overfit.md answers it where the "
    "models memorise (1000 samples per peer, an MLP).",
    "The LiRA reference models are trained without DP in the non-private recipe, also for "
    "the DP rows (a weaker attacker than one that mimics the victims' DP training); 8 "
    "reference models per seed (4 IN, 4 OUT per candidate), far fewer than the 64+ of Carlini "
    "et al.: online LiRA's AUC here is a lower bound on what LiRA can do.",
    "One public σ for every peer: the victims (half a shard each, sampling rate 256 / 4000) set "
    "it, so the DP rows' σ is higher than privacy_dp_sweep.md's at the same target ε (rate "
    "256 / 8000 there), and the other peers' ε is lower than the target.",
    "The remedies for PowerGossip under DP tried are a higher rank (here and in "
    "privacy_dp_sweep.md) and more power iterations (privacy_dp_sweep.md); noise in the "
    "exchanged subspace and DP on what is sent are not tried.",
)


#: The overfitting regime's plan (measure.OVERFIT_SETTING), in groups as PLAN_GROUPS: first the
#: four algorithms without DP (does a low-rank message leak less?), then exact gossip down the
#: epsilon ladder (where does the neighbour's TPR reach chance?), then PowerGossip r1 at two
#: epsilon and the rest of the ladder.
OVERFIT_PLAN_GROUPS = (
    ((_EXACT, None), (_R1, None)),
    ((_EXACT, 64.0), (_EXACT, 8.0)),
    ((_R4, None), (_CHOCO, None)),
    ((_EXACT, 16.0), (_EXACT, 3.0), (_R1, 64.0), (_R1, 8.0)),
    ((_EXACT, 1.0),),
)
OVERFIT_TITLE = "What a curious neighbour learns where the models overfit"
OVERFIT_SCALE_NOTE = (
    "this page is the companion of privacy_attacks.md, whose regime (8000 samples per peer, "
    "cnn1d) lets DP learn but where no attack separates members from held-out records, even "
    "without DP. Here the models memorise: 1000 samples per peer and an MLP, so that the "
    "attacks have something to find and the ε at which the neighbour's TPR falls to chance "
    "can be read off. Run at nice 15 on one core of the shared machine beside other "
    "engineers' jobs; the plan, in its order of priority, 3 seeds of every row: the four "
    "algorithms without DP; exact gossip at target ε = 64, 16, 8, 3 and 1; PowerGossip r1 at "
    "ε = 64 and 8."
)
OVERFIT_REGIME_TEXT = (
    "Non-private rows: batch {batch}, lr {lr}, {epochs} epochs (the cosine schedule ends at "
    "lr 0; the runs table's last-quarter change says whether a run ended on a plateau). "
    "Private rows: DP-SGD on every peer (Poisson batches of {dp_batch}, lr {dp_lr}, clip "
    "C = {clip}, {dp_epochs} epochs, δ = {delta}; this recipe is not swept: it is the better "
    "of two tried at target ε = 8 (batch 128 at lr 1.0 was the other), and a sweep could "
    "raise the private rows' accuracy), "
)
OVERFIT_NOT_REACHED = (
    "In this regime DP that brings the neighbour's TPR to chance also costs most of the "
    "accuracy (the runs table): the useful-accuracy private rows are on privacy_attacks.md, "
    "where no attack finds members even without DP. A regime where both hold at once (a "
    "model that memorises and still learns under DP) was not found on this machine's budget.",
    "The LiRA reference models train without DP (also for the DP rows) and number 8 per seed "
    "(4 IN, 4 OUT per candidate), far fewer than the 64+ of Carlini et al.; online LiRA's "
    "per-candidate IN/OUT means rest on 4 models each.",
    "With 1000 non-members pooled over the two victims, TPR at 0.1 % FPR lets one non-member "
    "above the threshold: its null band is wide (the band column).",
    "PowerGossip r4 and Choco sign were run without DP only; the remedies for PowerGossip "
    "under DP (noise in the exchanged subspace, DP on what is sent) are not on this page.",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.privacy_attacks",
        description="Measure what an honest-but-curious neighbour "
        "learns, and write the results page.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny problem (synthetic data, ring:4)"
    )
    parser.add_argument(
        "--regime",
        choices=("dp", "overfit"),
        default="dp",
        help="dp (default): privacy_dp_sweep.md's regime, where DP learns (page "
        "privacy_attacks.md); overfit: 1000 samples per peer and an MLP, where the attacks find "
        "members (page privacy_attacks_overfit.md)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default runs/privacy-attacks, or runs/privacy-attacks-quick "
        "with --quick; the committed page: --out experiments/results)",
    )
    parser.add_argument(
        "--part",
        choices=("nodp", "dp", "all"),
        default="all",
        help="run only the non-private or only the private rows (the page is "
        "written from every row the folder's partial file holds)",
    )
    parser.add_argument(
        "--reuse",
        type=Path,
        default=None,
        metavar="JSON",
        help="take the rows of a finished page's JSON of the same setting whose recipe this "
        "code would run unchanged (non-private rows; DP rows at their epsilon's epochs, batch and "
        "lr), each keeping the commit that made it, instead of running them again: for a re-run "
        "that changes only part of the recipe",
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="run nothing: write the page from the rows the folder's partial files hold, or, "
        "when it has none, from the rows of its finished page's JSON",
    )
    parser.add_argument(
        "--network-only",
        action="store_true",
        help="recompute only the network-DP section from privacy_attacks.json",
    )
    return parser


def _log(text: str) -> None:
    print(f"[privacy-attacks {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _key(spec, target, seed) -> str:
    return f"{spec}|{target}|{seed}"


def compact_splits(rows: List[Dict[str, Any]]) -> tuple:
    """(rows, splits): each row's split (the audit record: every peer's member and held-out
    indices, ~0.4 MB at 8000 records per peer) stored once in ``splits`` under a digest of its
    contents, the row keeping the digest; rows of one seed share one split."""
    splits: Dict[str, Any] = {}
    out = []
    for row in rows:
        if isinstance(row.get("split"), dict):
            text = json.dumps(row["split"], sort_keys=True)
            key = hashlib.sha256(text.encode()).hexdigest()[:16]
            splits[key] = row["split"]
            row = dict(row, split=key)
        out.append(row)
    return out, splits


def expand_splits(rows: List[Dict[str, Any]], splits: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The inverse of `compact_splits`: each row with its split record again."""
    return [
        dict(row, split=splits[row["split"]]) if isinstance(row.get("split"), str) else row
        for row in rows
    ]


def measure_all(plan_groups, seeds, setting, references, part, saved, save) -> None:
    """Every (spec, target, seed) of the plan not yet in `saved["rows"]`, group by group and
    within a group seed by seed (the plan's order is its priority); `save()` after each."""
    started = time.perf_counter()
    refs: Dict[int, Any] = {}
    order = [(s, t, seed) for group in plan_groups for seed in seeds for s, t in group]
    for spec, target, seed in order:
        if (part == "nodp" and target is not None) or (part == "dp" and target is None):
            continue
        key = _key(spec, target, seed)
        if key in saved["rows"] and "failure" not in saved["rows"][key]:
            continue
        _log(f"{spec} target ε {target} seed {seed}")
        try:
            row = attacked_run(spec, target, seed, setting, refs, references)
        except Exception as exc:  # one failed run is a row of the page, not a lost page
            row = dict(spec=spec, target=target, seed=seed, failure=one_line(exc, 200))
            _log(f"  FAILED: {row['failure']}")
        else:
            flat = row["rounds"][str(row["last"])]["flat"]
            _log(
                f"  acc {row['acc_avg']:.3f} victim LiRA AUC "
                f"{flat['auc/victim/LiRA offline']:.3f} {row['run_seconds']:.0f} s"
            )
        row["commit"] = git_commit()
        row["load"] = os.getloadavg()[0]
        saved["rows"][key] = row
        saved["seconds"] = saved.get("seconds", 0.0) + time.perf_counter() - started
        started = time.perf_counter()
        save()


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    out = args.out or (ROOT / "runs" / "privacy-attacks-quick" if args.quick else DEFAULT_OUT)
    try:
        check_writable_dir(out, "choose a writable --out")
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    command = " ".join(["python -m experiments.privacy_attacks", *map(shlex.quote, argv)])
    if args.network_only:
        if args.regime != "dp":
            raise SystemExit(
                "error: --network-only recomputes privacy_attacks.md's network-DP section; "
                "drop --regime overfit (that page has no such section)"
            )
        return network_only(out, command)
    overfit = args.regime == "overfit"
    stem = "privacy_attacks_overfit" if overfit else "privacy_attacks"
    setting = QUICK_SETTING if args.quick else OVERFIT_SETTING if overfit else SETTING
    plan_groups = (
        QUICK_PLAN_GROUPS if args.quick else OVERFIT_PLAN_GROUPS if overfit else PLAN_GROUPS
    )
    plan_rows = [row for group in plan_groups for row in group]
    seeds = QUICK_SEEDS if args.quick else SEEDS
    references = 4 if args.quick else REFERENCES
    # One partial file per --part, so that a non-private and a private process can run at once.
    partial = out / (f"{stem}.partial.json" if args.part != "dp" else f"{stem}.partial-dp.json")
    saved = json.loads(partial.read_text()) if partial.exists() else {"rows": {}, "seconds": 0.0}
    finished = out / f"{stem}.json"
    carried: Dict[str, Any] = {}
    if args.render_only and not list(out.glob(f"{stem}.partial*.json")) and finished.exists():
        page_json = json.loads(finished.read_text())
        saved = finished_rows(page_json)
        carried = {k: page_json["plan"][k] for k in ("reused",) if k in page_json["plan"]}
    reused = reuse_rows(args.reuse, setting, saved) if args.reuse else carried.get("reused")
    if not args.render_only:
        measure_all(
            plan_groups,
            seeds,
            setting,
            references,
            args.part,
            saved,
            lambda: atomic_write(partial, json.dumps(saved) + "\n"),
        )
    partials = sorted(out.glob(f"{stem}.partial*.json"))
    for other in partials:
        if other != partial:
            more = json.loads(other.read_text())
            saved["rows"].update(more["rows"])
            saved["seconds"] = saved.get("seconds", 0.0) + more.get("seconds", 0.0)
    rows = [
        saved["rows"][_key(s, t, seed)]
        for s, t in plan_rows
        for seed in seeds
        if _key(s, t, seed) in saved["rows"]
    ]
    missing = [
        _key(s, t, seed)
        for s, t in plan_rows
        for seed in seeds
        if _key(s, t, seed) not in saved["rows"]
    ]
    network = None if overfit else network_dp()
    if network is not None:
        report.plot_network(network, out / report.HEATMAP_PNG)
    report.plot_roc(rows, out / report.roc_png(stem))
    ok = [r for r in rows if "failure" not in r]
    plan = {
        "setting": setting,
        "seeds": len(seeds),
        "references": references,
        "reference_lr": setting.get("reference_lr", REFERENCE_LR),
        "members": ok[0]["members"] if ok else 0,
        "per_peer": len(ok[0]["split"]["members"]["0"]) if ok else 0,
        "nonmembers": ok[0]["nonmembers"] if ok else 0,
        "scale_note": "--quick: a smoke test, not a result."
        if args.quick
        else OVERFIT_SCALE_NOTE
        if overfit
        else SCALE_NOTE,
        "not_reached": list(() if args.quick else OVERFIT_NOT_REACHED if overfit else NOT_REACHED)
        + [f"run missing: {m}" for m in missing]
        + [
            f"run failed: {r['spec']} ε {r['target']} seed {r['seed']}: {r['failure']}"
            for r in rows
            if "failure" in r
        ],
    }
    seconds = saved.get("seconds", 0.0)
    plan["seconds"] = seconds
    if reused is not None:
        plan["reused"] = reused
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    generated = (
        f"Generated by `{command}` (the runs, resumable, in {seconds:.0f} s in all) on "
        f"{date} (commit {git_commit()})."
    )
    if plan.get("reused"):
        r = plan["reused"]
        generated += (
            f" {r['rows']} rows ({r['which']}) are not run again: they are the rows of "
            f"{r['source']} made at commit {', '.join(r['commits'])}, in the same setting and "
            "recipe (their seconds are not counted here)."
        )
    if overfit:
        dp = setting.get("dp", {})
        plan["title"] = OVERFIT_TITLE
        plan["regime_text"] = OVERFIT_REGIME_TEXT.format(
            batch=setting["batch_size"],
            lr=setting["lr"],
            epochs=setting["epochs"],
            dp_batch=dp.get("batch_size"),
            dp_lr=dp.get("lr"),
            clip=dp.get("dp_max_grad_norm"),
            dp_epochs=dp.get("epochs"),
            delta=dp.get("dp_delta"),
        )
    atomic_write(out / f"{stem}.md", report.page(rows, network, plan, generated, stem))
    compact, splits = compact_splits(rows)
    atomic_write(
        out / f"{stem}.json",
        json.dumps(
            {
                "generated": generated,
                "plan": plan,
                "splits": splits,
                "rows": compact,
                "network_dp": network,
            }
        )
        + "\n",
    )
    if not missing:
        for other in partials:
            other.unlink()
    _log(f"wrote {out / (stem + '.md')}")
    return 0 if all("failure" not in r for r in rows) else 1


def _recipe(setting: Dict[str, Any], target: Optional[float]) -> tuple:
    """(epochs, batch, lr) that `attacked_run` trains a row of `target` with in `setting`."""
    if target is None:
        return setting["epochs"], setting["batch_size"], setting["lr"]
    dp = dp_recipe(setting, target)
    return dp["epochs"], dp["batch_size"], dp["lr"]


def reuse_rows(source: Path, setting: Dict[str, Any], saved: Dict[str, Any]) -> Dict:
    """Copy into `saved["rows"]` (where not already there) the rows of the finished page
    `source` that this code would run unchanged: same setting, and each row's epochs, batch and
    lr equal to its epsilon's recipe. Refuses a page of another setting. Returns what the page
    says about them."""
    try:
        page = json.loads(source.read_text())
        theirs = page["plan"]["setting"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(
            f"error: --reuse {source}: not a finished privacy_attacks page's JSON "
            f"({one_line(exc, 120)}); give the .json a previous run wrote"
        ) from None
    if theirs != json.loads(json.dumps(setting)):
        raise SystemExit(
            f"error: --reuse {source}: that page trained another setting (its plan's "
            "setting differs from this regime's); run its rows again instead"
        )
    rows = finished_rows(page)["rows"]
    kept = {
        k: r
        for k, r in rows.items()
        if "failure" not in r
        and (r.get("epochs"), r.get("batch"), r.get("lr")) == _recipe(setting, r["target"])
    }
    for key, row in kept.items():
        saved["rows"].setdefault(key, row)
    # the DP rows of another budget: kept, summarised, for the page's budget check
    others = [
        budget_row(r)
        for r in rows.values()
        if "failure" not in r
        and r["target"] is not None
        and (r.get("epochs"), r.get("batch"), r.get("lr")) != _recipe(setting, r["target"])
    ]
    targets = sorted(
        {r["target"] for r in kept.values()}, key=lambda t: -math.inf if t is None else -t
    )
    return dict(
        source=source.name,
        rows=len(kept),
        which=", ".join("no DP" if t is None else f"ε = {t:g}" for t in targets),
        commits=sorted({str(r.get("commit")) for r in kept.values()}),
        budget_rows=others,
    )


def finished_rows(page: Dict[str, Any]) -> Dict[str, Any]:
    """A finished page's JSON as a partial file's {"rows", "seconds"}: its rows keyed as the plan
    keys them, each with its split again, and the seconds its runs took."""
    rows = expand_splits(page["rows"], page.get("splits", {}))
    seconds = page["plan"]["seconds"]
    return {"rows": {_key(r["spec"], r["target"], r["seed"]): r for r in rows}, "seconds": seconds}


def network_only(out: Path, command: str) -> int:
    """Recompute the network-DP section and its heat maps; the rows stay as the JSON has them."""
    source = out / "privacy_attacks.json"
    if not source.exists():
        raise SystemExit(
            f"error: --network-only needs the rows of a previous run in {source}; "
            "run without --network-only first"
        )
    saved = json.loads(source.read_text())
    plan = saved.get("plan") or {  # a JSON written before plans were stored
        "setting": SETTING,
        "seeds": len(SEEDS),
        "references": REFERENCES,
        "members": 0,
        "nonmembers": 0,
        "per_peer": 0,
        "scale_note": "",
        "not_reached": [],
    }
    started = time.perf_counter()
    network = network_dp()
    report.plot_network(network, out / report.HEATMAP_PNG)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    network["generated"] = (
        f"Section made by `{command}` on {date} in "
        f"{time.perf_counter() - started:.0f} s (commit {git_commit()})."
    )
    rows = expand_splits(saved["rows"], saved.get("splits", {}))
    atomic_write(out / "privacy_attacks.md", report.page(rows, network, plan, saved["generated"]))
    atomic_write(
        out / "privacy_attacks.json", json.dumps(dict(saved, plan=plan, network_dp=network)) + "\n"
    )
    return 0
