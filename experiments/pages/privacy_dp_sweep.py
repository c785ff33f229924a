"""`python -m experiments privacy_dp_sweep`: the sweep that chose the privacy pages' DP regime:
part 1, exact gossip at a few (batch, lr, C), the best DP row run once more clipped without noise;
part 2, PowerGossip and Choco sign in the chosen regime and without DP."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Mapping, Optional

from experiments.engine import Outputs, Page, Rows, Run
from experiments.pages import register
from experiments.pages._markdown import fill, snippets
from experiments.pages._privacy import BASE, DELTA, NONPRIVATE, PER_PEER, QUICK, SWEEP, TARGET
from experiments.pages._privacy import page_fields, with_load
from experiments.suite.tables import _pct as pct

#: The label of part 1's last row, the chosen regime clipped without noise.
CLIPPED = "chosen, clipped, no noise"
#: Part 2: (label, spec), each in the chosen regime at TARGET and without DP in the NONPRIVATE
#: regime; PowerGossip's remedies under DP are more power iterations and a higher rank.
ALGORITHMS = (
    ("PowerGossip r1", "powergossip:rank=1"),
    ("PowerGossip r1, 4 power iterations", "powergossip:rank=1,iters=4"),
    ("PowerGossip r4", "powergossip:rank=4"),
    ("Choco sign", "choco:compressor=sign,gamma=1.0"),
)
#: --quick: the reference and the first DP row, PowerGossip r1 only, 1 epoch each.
QUICK_PLAN = (SWEEP[:2], ALGORITHMS[:1])
TEXT = snippets(__file__, "privacy_dp_sweep.md")


def _run(part, label, algorithm, batch, lr, clip, epochs, target, quick) -> Run:
    """A row's run: no clip, no DP; clip and no target: sigma 0; both: DP-SGD at `target`."""
    epochs = 1 if quick else epochs
    row = dict(label=label, algorithm=algorithm, batch=batch, lr=lr, clip=clip, epochs=epochs)
    row["target"] = target
    train = dict(QUICK if quick else BASE, algorithm=algorithm, batch_size=batch, lr=lr)
    train.update(epochs=epochs, eval_every=max(1, epochs // 5))
    if clip is not None:
        train.update(dp_max_grad_norm=clip, dp_delta=DELTA, release_peer_statistics=True)
        noise = {"dp_noise_multiplier": 0.0} if target is None else {"dp_target_epsilon": target}
        train.update(noise)
    noise = "no DP" if clip is None else f"eps={target:g}" if target else "sigma=0"
    key = f"{part}/{label}/batch {batch}, lr {lr:g}, {noise}"
    return Run(key, dict(row=row, train=train), cost=epochs * 1000 / batch)


def _noisy(row: Dict[str, Any]) -> bool:
    return row.get("target") is not None


def _best(rows) -> Optional[Dict[str, Any]]:
    """The finished DP row of highest accuracy (the chosen regime), or None."""
    private = [r for r in rows if _noisy(r) and "error" not in r]
    return max(private, key=lambda r: r["acc_avg"]) if private else None


def _chosen(rows) -> Optional[Dict[str, Any]]:
    best = _best(rows)
    return best and {k: best[k] for k in ("batch", "lr", "clip", "epochs", "target")}


def plan(quick: bool, rows: Mapping[str, Dict[str, Any]]) -> List[Run]:
    sweep, algorithms = QUICK_PLAN if quick else (SWEEP, ALGORITHMS)
    runs = [_run("sweep", label, "exact", *rest, quick) for label, *rest in sweep]
    if not all(run.key in rows for run in runs):
        return runs  # part 2 waits for the chosen regime
    best = _chosen([rows[run.key] for run in runs])
    if best is None:
        return runs
    chosen = (best["batch"], best["lr"], best["clip"], best["epochs"])
    runs.append(_run("sweep", CLIPPED, "exact", *chosen, None, quick))
    for label, spec in algorithms:
        runs.append(_run("algorithms", label, spec, *chosen, TARGET, quick))
        runs.append(_run("algorithms", label, spec, *NONPRIVATE[1:5], None, quick))
    return runs


def row(run: Run) -> Dict[str, Any]:
    """One run (threads): accuracy, epsilons, evaluations; a failed run: a row saying so."""
    from gossip_powersgd import run as train
    from gossip_powersgd.privacy.dp_report import dp_measurements

    out, start, started = dict(run.config["row"]), os.getloadavg()[0], time.perf_counter()
    try:
        result = train(dict(run.config["train"]))
    except Exception as exc:  # a failed run is a row saying so
        return dict(out, error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}")
    summary, dp = result.summary, dp_measurements(result)
    keys = ("epoch", "step", "acc_avg", "consensus", "loss")
    names = ("epoch", "step", "test_acc_avg_model", "consensus_distance", "train_loss")
    out["acc_avg"] = summary["final_test_acc_avg_model"]
    out["acc_local_mean"] = summary["final_test_acc_local_mean"]
    out.update({k: dp[k] for k in ("consensus", "eps_max", "eps_min", "sigma")})
    out["steps"] = summary["steps"]
    out["evals"] = [{k: e.get(n) for k, n in zip(keys, names)} for e in result.evals]
    return with_load(dict(out, seconds=time.perf_counter() - started), start)


def _fig(v) -> str:
    return "n/a" if v is None else f"{v:.3g}"


def _regime(row: Dict[str, Any]) -> str:
    if row["clip"] is None:
        return "no DP"
    return f"ε = {row['target']:g}" if _noisy(row) else "clipped, σ = 0"


def _pair(rows, label: str) -> tuple:
    """The DP row and the non-private row of one part-2 algorithm (None where missing/failed)."""
    mine = [r for r in rows if r["label"] == label and "error" not in r]
    dp = next((r for r in mine if _noisy(r)), None)
    return dp, next((r for r in mine if r["clip"] is None), None)


def findings(sweep, algorithms) -> List[str]:
    """Sentences computed from the rows (their words: privacy_dp_sweep.md)."""
    out = []
    ok = [r for r in sweep if "error" not in r]
    best = _best(sweep)
    private, plain = [r for r in ok if _noisy(r)], [r for r in ok if r["clip"] is None]
    if plain and best:
        top = max(plain, key=lambda r: r["acc_avg"])
        gap = 100 * (top["acc_avg"] - best["acc_avg"])
        words = dict(top=pct(top["acc_avg"]), batch=top["batch"], steps=top["steps"])
        words.update(eps=best["eps_max"], dp_batch=best["batch"], lr=best["lr"], clip=best["clip"])
        words.update(dp_steps=best["steps"], acc=pct(best["acc_avg"]), gap=gap)
        within = "within" if gap <= 10 else "**not within**"
        out.append(TEXT["exact"].format(**words, within=within))
    for c in (r for r in ok if r["clip"] is not None and not _noisy(r)):
        same = ("batch", "lr", "clip", "steps")
        for r in (r for r in private if all(r[k] == c[k] for k in same)):
            cost = 100 * (c["acc_avg"] - r["acc_avg"])
            how = TEXT["costs" if cost >= 0 else "above"].format(cost=abs(cost))
            words = {k: r[k] for k in ("batch", "lr", "clip", "steps")}
            words.update(clipped=pct(c["acc_avg"]), noisy=pct(r["acc_avg"]), eps=r["eps_max"])
            out.append(TEXT["noise"].format(**words, cost=how))
    for label, _ in ALGORITHMS:
        dp, plain_row = _pair(algorithms, label)
        if dp is not None:
            against = plain_row and TEXT["against"].format(
                acc=pct(plain_row["acc_avg"]), consensus=_fig(plain_row["consensus"])
            )
            base = TEXT["base"].format(consensus=_fig(best["consensus"])) if best else ""
            words = dict(label=label, acc=pct(dp["acc_avg"]), consensus=_fig(dp["consensus"]))
            out.append(TEXT["algorithm"].format(**words, base=base, against=against or ""))
    r1, it4, r4 = (_pair(algorithms, label)[0] for label, _ in ALGORITHMS[:3])
    if r1 and it4 and r4:
        words = dict(r1=pct(r1["acc_avg"]), it4=pct(it4["acc_avg"]), r4=pct(r4["acc_avg"]))
        words.update(c1=_fig(r1["consensus"]), c4=_fig(it4["consensus"]))
        out.append(TEXT["remedies"].format(**words, cr4=_fig(r4["consensus"])))
    return out


def _line(r: Dict[str, Any], table: str) -> str:
    """The row's line of `table` ("sweep" or "curve", privacy_dp_sweep.md), or why it failed."""
    words = dict(r, acc=pct(r.get("acc_avg")), regime=_regime(r), clip=r["clip"] or "—")
    if "error" in r:
        return TEXT[table + "_failed"].format_map(dict(words, clip=r["clip"])) + "\n"
    words.update(sigma="—" if r["sigma"] is None else _fig(r["sigma"]), end=_fig(r["consensus"]))
    curve = (_fig(e["consensus"]) for e in r["evals"] if e["consensus"] is not None)
    return TEXT[table].format_map(dict(words, curve=", ".join(curve))) + "\n"


def render(rows: Rows) -> Outputs:
    """The page (its fixed text: privacy_dp_sweep.md beside this file)."""
    setting = QUICK if rows.quick else BASE
    sweep = [r.row for r in rows.records if r.key.startswith("sweep/")]
    algorithms = [r.row for r in rows.records if r.key.startswith("algorithms/")]
    chosen = _chosen(sweep)
    exact = [
        dict(r, label="exact gossip (part 1)")
        for r in sweep
        if "error" not in r
        and (r["clip"] is None and r["label"] == NONPRIVATE[0] or _noisy(r))
        and (not _noisy(r) or chosen and all(r[k] == chosen[k] for k in chosen))
    ]
    missing = [
        run.config["row"] for run in plan(rows.quick, rows.by_key) if run.key not in rows.by_key
    ]
    not_run = [TEXT["missing"].format_map(dict(r, regime=_regime(r))) for r in missing]
    words = page_fields(rows)  # made_by, cores, loads, delta
    words.update({k: setting[k] for k in ("dataset", "model", "topology", "partition")})
    words["per_peer"] = "" if rows.quick else f" ({PER_PEER} training samples per peer)"
    words.update(warmup=setting["warmup_epochs"], target=TARGET, chosen=chosen)
    words["every"] = max(1, (chosen or {}).get("epochs", 5) // 5)
    words["sweep"] = "".join(_line(r, "sweep") for r in sweep)
    words["curves"] = "".join(_line(r, "curve") for r in exact + algorithms)
    words["findings"] = "\n".join(findings(sweep, algorithms))
    words["not_run"] = TEXT["not_run"] + "\n\n" + "\n".join(not_run) + "\n" if missing else ""
    return {"privacy_dp_sweep.md": fill(TEXT["page"], **words)}


TITLE = "the sweep that chose the privacy pages' DP regime (batch, lr, clip) at ε = 8"
PAGE = register(Page("privacy_dp_sweep", TITLE, plan, row, render))
