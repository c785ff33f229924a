"""`python -m experiments.privacy_attacks.dp_sweep [--quick]`: the small sweep that chose the DP
regime of the privacy pages (data per peer, batch, learning rate, clip norm), and the consensus
distance over time of every algorithm under DP in that regime, with PowerGossip's remedies.

Writes privacy_dp_sweep.{md,json} under --out (default runs/dp-sweep). Part 1 (exact gossip,
mnist1d cnn1d iid ring:8, 8000 training samples per peer): the non-private reference, then DP
at target epsilon 8 for a few (batch, lr, C) at a fixed number of epochs; the chosen regime is
the DP row with the best averaged-model accuracy, run once more with its clipping but no noise
(sigma = 0: the gap to it is the cost of the noise alone, not of fewer steps or clipping). Part 2: PowerGossip r1, r1 with 4 power iterations, rank 4 and Choco
sign in the chosen regime at epsilon 8, and each without DP in the non-private reference's
regime, with the consensus distance at every evaluation.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from gossip_powersgd.utils import atomic_write, git_commit

ROOT = Path(__file__).resolve().parents[2]
#: The default output folder (git-ignored); the committed page only with an explicit
#: `--out experiments/results`.
DEFAULT_OUT = ROOT / "runs" / "dp-sweep"

#: 8 peers x 8000 training samples (mnist1d generates any number; 20 % of them are its test set):
#: DP-SGD's noise on a batch mean is sigma C / batch, and the sigma that a target epsilon needs
#: grows with the sampling rate batch / samples, so more data per peer buys batches large
#: enough to drown the noise at a small sampling rate.
DATA = "mnist1d:num_samples=80000"
#: Training samples per peer in DATA (the page's wording only).
PER_PEER = 8000
BASE = dict(
    dataset=DATA,
    model="cnn1d",
    optimizer="sgd",
    momentum=0.9,
    weight_decay=0.0,
    warmup_epochs=1,
    schedule="cosine",
    seed=0,
    backend="local",
    quiet=True,
    log_every=0,
    checkpoint_every=0,
    out_dir=None,
    threads=1,
    topology="ring:8",
    partition="iid",
    comm_timeout=600.0,
)
DELTA = 1e-5
#: Every DP row's target epsilon (at DELTA; the accountant picks sigma).
TARGET = 8.0
#: Epochs of every row: with batch 256 that is 15 x ceil(8000 / 256) = 480 optimizer steps
#: (batch 512: 240, batch 128: 945). DP-SGD's cost grows with epochs x data (one per-example gradient each):
#: ~4.5 min a batch-256 run on the 2 shared cores at load 7, the non-private reference ~1.5 min.
EPOCHS = 15
#: The non-private reference: (label, batch, lr, clip, epochs, target epsilon), the regime of
#: every non-private row of part 2 too (lr 0.4: batch 32's 0.1 scaled with the batch; the DP
#: rows' lr 2.0 diverges without clipping).
NONPRIVATE = ("non-private", 128, 0.4, None, EPOCHS, None)
#: (label, batch, lr, clip C or None for no clipping, epochs, target epsilon or None for no
#: noise). After them, part 1 runs the chosen (best) DP row again with its clipping but no noise
#: (sigma = 0, epsilon infinite, CLIPPED): the gap between the two is the noise's cost alone.
SWEEP = (
    NONPRIVATE,
    ("DP", 256, 1.0, 1.0, EPOCHS, TARGET),
    ("DP", 256, 2.0, 1.0, EPOCHS, TARGET),
    ("DP", 256, 4.0, 0.5, EPOCHS, TARGET),
    ("DP", 512, 2.0, 1.0, EPOCHS, TARGET),
)
#: The DP regime privacy_dp_sweep.md chose (its best DP row: batch 256, lr 2.0, C 1.0, EPOCHS
#: epochs, TARGET), the regime of the privacy pages' DP rows (privacy_attacks imports it). The
#: sweep itself picks its best row from what it measures; a new page that chooses another row must
#: change this constant with it.
CHOSEN = SWEEP[2]
#: Epochs of the privacy pages' DP rows (privacy.md, privacy_attacks.md) at each target epsilon:
#: privacy_dp_budget.md's verdicts (`dp_budget`; a test holds the two equal). At a fixed epsilon
#: a longer run adds more noise per step, so accuracy first rises with the budget and then falls,
#: at a budget that depends on epsilon. The sweep chooses its recipe at EPOCHS, where a row
#: costs less; the pages then train that recipe for the budget of the row's epsilon, with sigma
#: solved again for its steps.
DP_EPOCHS = {8.0: 30, 3.0: 15, 1.0: 15}


def dp_epochs(target: float) -> int:
    """The privacy pages' budget at target epsilon `target` (DP_EPOCHS)."""
    try:
        return DP_EPOCHS[float(target)]
    except KeyError:
        raise ValueError(
            f"no DP budget for target epsilon {target:g}: privacy_dp_budget.md measured "
            f"{', '.join(f'{t:g}' for t in sorted(DP_EPOCHS))}; add a cell for it there first"
        ) from None


def budget_text() -> str:
    """DP_EPOCHS in words, for the pages: '30 epochs at ε = 8, 15 at ε = 3 and 1'."""
    by: Dict[int, List[float]] = {}
    for target, epochs in sorted(DP_EPOCHS.items(), reverse=True):
        by.setdefault(epochs, []).append(target)
    parts = [
        f"{epochs}{' epochs' if i == 0 else ''} at ε = " + " and ".join(f"{t:g}" for t in targets)
        for i, (epochs, targets) in enumerate(by.items())
    ]
    return ", ".join(parts)


#: The label of part 1's last row, the chosen regime clipped without noise.
CLIPPED = "chosen, clipped, no noise"
#: The rows of --quick: the non-private reference and the first DP row.
QUICK_SWEEP = (SWEEP[0], SWEEP[1])
#: Part 2: (label, spec), each run in the chosen regime at TARGET and without DP in the
#: NONPRIVATE regime; PowerGossip's remedies under DP are more power iterations and a higher
#: rank. Exact gossip's rows are part 1's.
ALGORITHMS = (
    ("PowerGossip r1", "powergossip:rank=1"),
    ("PowerGossip r1, 4 power iterations", "powergossip:rank=1,iters=4"),
    ("PowerGossip r4", "powergossip:rank=4"),
    ("Choco sign", "choco:compressor=sign,gamma=1.0"),
)
QUICK = dict(
    BASE,
    dataset="synthetic_logreg:d=20,classes=4,n=2000",
    model="logreg",
    topology="ring:4",
    warmup_epochs=0,
)


def run(overrides: Dict[str, Any], quick: bool = False) -> Dict[str, Any]:
    """One run (threads); accuracy, every peer's epsilon, and the evaluations over time."""
    from gossip_powersgd import run as train

    load = os.getloadavg()[0]
    started = time.perf_counter()
    result = train(dict(QUICK if quick else BASE, **overrides))
    summary = dict(result.summary, history=result.history)
    epsilons = [math.inf if e == "inf" else float(e) for e in summary.get("epsilon", [math.inf])]
    evals = [
        dict(
            epoch=r.get("epoch"),
            step=r.get("step"),
            acc_avg=r.get("test_acc_avg_model"),
            consensus=r.get("consensus_distance"),
            loss=r.get("train_loss"),
        )
        for r in summary["history"]
        if r.get("kind") == "eval"
    ]
    return dict(
        acc_avg=summary["final_test_acc_avg_model"],
        acc_local_mean=summary["final_test_acc_local_mean"],
        consensus=summary.get("final_consensus_distance"),
        eps_max=max(epsilons),
        eps_min=min(epsilons),
        sigma=summary.get("noise_multiplier"),
        steps=summary["steps"],
        evals=evals,
        seconds=time.perf_counter() - started,
        load=[load, os.getloadavg()[0]],
    )


def _private(batch, lr, clip, epochs, target):
    """The overrides of one row: no clipping without `clip`; clipping without noise (sigma = 0)
    with `clip` and no `target`; DP-SGD at target epsilon `target` with both."""
    out = dict(batch_size=batch, lr=lr, epochs=epochs, eval_every=max(1, epochs // 5))
    if clip is not None:
        out.update(dp_max_grad_norm=clip, dp_delta=DELTA, release_peer_statistics=True)
        if target is None:
            out.update(dp_noise_multiplier=0.0)
        else:
            out.update(dp_target_epsilon=target)
    return out


def _log(text: str) -> None:
    print(f"[dp-sweep {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _attempt(row: Dict[str, Any], overrides: Dict[str, Any], quick: bool) -> Dict[str, Any]:
    _log(str(row))
    try:
        row.update(run(overrides, quick))
    except Exception as exc:  # a failed run is a row saying so
        row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
        _log("  FAILED " + row["error"])
        return row
    _log(
        f"  acc {row['acc_avg']:.4f} eps {row['eps_max']:.3g} consensus {row['consensus']:.3g} "
        f"{row['seconds']:.0f} s"
    )
    return row


def _key(row: Dict[str, Any]) -> tuple:
    return tuple(
        row.get(k) for k in ("label", "algorithm", "batch", "lr", "clip", "epochs", "target")
    )


def _noisy(row: Dict[str, Any]) -> bool:
    return row.get("target") is not None


def _row(label, algorithm, batch, lr, clip, epochs, target) -> Dict[str, Any]:
    return dict(
        label=label,
        algorithm=algorithm,
        batch=batch,
        lr=lr,
        clip=clip,
        epochs=epochs,
        target=target,
    )


def sweep(
    quick: bool, saved: Optional[Dict[str, Any]] = None, save=None, render_only: bool = False
) -> Dict[str, Any]:
    """Every row of the plan; rows already in `saved` (a previous, interrupted run of the same
    commit's plan) are kept, and `save(result)` is called after each new row. `render_only`:
    run nothing, keep the saved rows (the plan's others are listed as not run)."""
    done = {
        _key(r): r
        for part in ("sweep", "algorithms")
        for r in (saved or {}).get(part, [])
        if "error" not in r or render_only
    }
    result: Dict[str, Any] = dict(sweep=[], chosen=None, algorithms=[])

    def attempt(part, label, algorithm, batch, lr, clip, epochs, target):
        epochs = 1 if quick else epochs
        row = _row(label, algorithm, batch, lr, clip, epochs, target)
        if render_only and _key(row) not in done:
            result.setdefault("not_run", []).append(row)
            return
        overrides = dict(_private(batch, lr, clip, epochs, target), algorithm=algorithm)
        result[part].append(done.get(_key(row)) or _attempt(row, overrides, quick))
        if save is not None:
            save(result)

    for label, b, lr, c, e, target in QUICK_SWEEP if quick else SWEEP:
        attempt("sweep", label, "exact", b, lr, c, e, target)
    private = [r for r in result["sweep"] if _noisy(r) and "error" not in r]
    best = max(private, key=lambda r: r["acc_avg"]) if private else None
    if best is None:
        return result
    result["chosen"] = {k: best[k] for k in ("batch", "lr", "clip", "epochs", "target")}
    attempt(
        "sweep", CLIPPED, "exact", best["batch"], best["lr"], best["clip"], best["epochs"], None
    )
    _, b, lr, c, e, _ = NONPRIVATE
    for label, spec in ALGORITHMS[:1] if quick else ALGORITHMS:
        attempt(
            "algorithms",
            label,
            spec,
            best["batch"],
            best["lr"],
            best["clip"],
            best["epochs"],
            TARGET,
        )
        attempt("algorithms", label, spec, b, lr, c, e, None)
    return result


def _sigma(v) -> str:
    return "—" if v is None else f"{v:.3g}"


def _pct(v) -> str:
    return "n/a" if v is None else f"{100 * v:.2f} %"


def _fig(v) -> str:
    return "n/a" if v is None else f"{v:.3g}"


def _regime(row: Dict[str, Any]) -> str:
    if row["clip"] is None:
        return "no DP"
    return f"ε = {row['target']:g}" if _noisy(row) else "clipped, σ = 0"


def _pair(result: Dict[str, Any], label: str) -> tuple:
    """The DP row and the non-private row of one part-2 algorithm (None where missing/failed)."""
    rows = [r for r in result["algorithms"] if r["label"] == label and "error" not in r]
    return (
        next((r for r in rows if _noisy(r)), None),
        next((r for r in rows if r["clip"] is None), None),
    )


def findings(result: Dict[str, Any]) -> List[str]:
    """Sentences computed from the rows."""
    out = []
    ok = [r for r in result["sweep"] if "error" not in r]
    plain = [r for r in ok if r["clip"] is None]
    clipped = [r for r in ok if r["clip"] is not None and not _noisy(r)]
    private = [r for r in ok if _noisy(r)]
    best = max(private, key=lambda r: r["acc_avg"]) if private else None
    if plain and best:
        top = max(plain, key=lambda r: r["acc_avg"])
        gap = 100 * (top["acc_avg"] - best["acc_avg"])
        out.append(
            f"- Exact gossip: non-private {_pct(top['acc_avg'])} (batch {top['batch']}, "
            f"{top['steps']} steps), best DP row (ε = {best['eps_max']:.3g}, batch "
            f"{best['batch']}, lr {best['lr']}, C {best['clip']}, {best['steps']} steps) "
            f"{_pct(best['acc_avg'])}: {gap:.1f} pp below, "
            + ("within" if gap <= 10 else "**not within**")
            + " the 10 pp target."
        )
    for c in clipped:
        same = (c["batch"], c["lr"], c["clip"], c["steps"])
        for r in private:
            if (r["batch"], r["lr"], r["clip"], r["steps"]) != same:
                continue
            cost = 100 * (c["acc_avg"] - r["acc_avg"])
            out.append(
                f"- Batch {r['batch']}, lr {r['lr']}, C {r['clip']}, {r['steps']} steps with "
                f"clipping but no noise: {_pct(c['acc_avg'])}, against {_pct(r['acc_avg'])} "
                f"with the noise of ε = {r['eps_max']:.3g}: "
                + (
                    f"the noise costs {cost:.1f} pp."
                    if cost >= 0
                    else f"the noisy run is {-cost:.1f} pp above it (one run each): the noise "
                    "costs nothing a single run can measure, and the gap to the non-private "
                    "row is the clipping's and the DP batch and learning rate's."
                )
            )
    for label, _ in ALGORITHMS:
        dp, plain_row = _pair(result, label)
        if dp is None:
            continue
        against = (
            f"; without DP {_pct(plain_row['acc_avg'])}, consensus distance "
            f"{_fig(plain_row['consensus'])}"
            if plain_row
            else ""
        )
        base = f" (exact gossip under DP: {_fig(best['consensus'])})" if best else ""
        out.append(
            f"- {label} under DP: averaged-model accuracy {_pct(dp['acc_avg'])}, final "
            f"consensus distance {_fig(dp['consensus'])}{base}{against}."
        )
    r1, it4, r4 = (_pair(result, label)[0] for label, _ in ALGORITHMS[:3])
    if r1 and it4 and r4:
        out.append(
            f"- PowerGossip's remedies under DP, from rank 1 with 1 power iteration "
            f"({_pct(r1['acc_avg'])}, consensus distance {_fig(r1['consensus'])}): "
            f"4 power iterations {_pct(it4['acc_avg'])} ({_fig(it4['consensus'])}), "
            f"rank 4 {_pct(r4['acc_avg'])} ({_fig(r4['consensus'])})."
        )
    return out


def _load(rows: List[Dict[str, Any]]) -> str:
    loads = [x for r in rows for x in r.get("load", [])]
    return f"{min(loads):.1f}–{max(loads):.1f}" if loads else "n/a"


def page(result: Dict[str, Any], command: str, seconds: float, quick: bool) -> str:
    setting = QUICK if quick else BASE
    made = (
        f"Rows made by `python -m experiments.privacy_attacks.dp_sweep` ({seconds:.0f} s of runs), "
        f"page rendered by `{command}` (commit {git_commit()})"
        if "--render-only" in command
        else f"Generated by `{command}` in {seconds:.0f} s (commit {git_commit()})"
    )
    rows = [r for part in ("sweep", "algorithms") for r in result[part] if "error" not in r]
    per_peer = "" if quick else f" ({PER_PEER} training samples per peer)"
    text = (
        f"# The DP regime of the privacy pages: a small sweep\n\n{made}; backend local (8 peer "
        f"threads, one torch thread each), {os.cpu_count()} CPU cores shared with other jobs "
        f"(1-minute load average {_load(rows)} at the rows' starts and ends: the seconds are "
        f"wall time on a loaded machine). Setting: `{setting['dataset']}`{per_peer}, "
        f"`{setting['model']}`, {setting['topology']}, {setting['partition']}, SGD momentum "
        f"0.9, cosine schedule, {setting['warmup_epochs']} warm-up epoch, no weight decay, one "
        f"seed. DP: Poisson batches, per-example clip C, target ε = {TARGET:g} at "
        f"δ = {DELTA:g} (the RDP accountant picks σ), noise secret per peer. ε is each peer's "
        "own (iid: all equal). One run per row: the noise comes from each peer's secret key, "
        "so a rerun of a DP row draws other noise and lands on another accuracy. "
        "Averaged-model accuracy is the test accuracy of the average of "
        "the local models; consensus distance is the mean squared distance of the local "
        "models to their average.\n\n"
        "## 1. Exact gossip: batch, lr, clip norm\n\n"
        "| run | batch | lr | C | epochs | steps | σ | ε | averaged-model acc | consensus "
        "distance (end) | seconds |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for r in result["sweep"]:
        if "error" in r:
            text += f"| {r['label']} | {r['batch']} | {r['lr']} | {r['clip']} | FAILED: {r['error']} |\n"
            continue
        text += (
            f"| {r['label']} | {r['batch']} | {r['lr']} | {r['clip'] or '—'} | {r['epochs']} "
            f"| {r['steps']} | {_sigma(r['sigma'])} | "
            f"{r['eps_max']:.3g} | {_pct(r['acc_avg'])} | {_fig(r['consensus'])} | "
            f"{r['seconds']:.0f} |\n"
        )
    chosen = result["chosen"]
    text += f"\nChosen regime (best DP row): {chosen}.\n\n"
    text += (
        "## 2. Every algorithm in the chosen regime: consensus distance over time\n\n"
        f"Each algorithm under DP in the chosen regime (ε = {TARGET:g}), and without DP in the "
        "non-private reference's regime (batch, lr and epochs of part 1's first row). "
        "Consensus distance at each evaluation (every "
        f"{max(1, (chosen or {}).get('epochs', 5) // 5)} epochs).\n\n"
        "| algorithm | regime | batch | lr | steps | ε | averaged-model acc | consensus "
        "distance at each evaluation |\n|---|---|---|---|---|---|---|---|\n"
    )
    exact = [
        dict(r, label="exact gossip (part 1)")
        for r in result["sweep"]
        if "error" not in r
        and (r["clip"] is None and r["label"] == NONPRIVATE[0] or _noisy(r))
        and (not _noisy(r) or chosen and all(r[k] == chosen[k] for k in chosen))
    ]
    for r in exact + result["algorithms"]:
        if "error" in r:
            text += f"| {r['label']} | {_regime(r)} | {r['batch']} | {r['lr']} | FAILED: {r['error']} |\n"
            continue
        curve = ", ".join(_fig(e["consensus"]) for e in r["evals"] if e["consensus"] is not None)
        text += (
            f"| {r['label']} | {_regime(r)} | {r['batch']} | {r['lr']} | {r['steps']} | "
            f"{r['eps_max']:.3g} | {_pct(r['acc_avg'])} | {curve} |\n"
        )
    text += "\n## What the rows show\n\n" + "\n".join(findings(result)) + "\n"
    if result.get("not_run"):
        text += (
            "\n## Not run\n\nThese rows of the plan did not finish in the time the shared "
            "machine allowed (the page was rendered with --render-only from the rows that "
            "did):\n\n"
            + "\n".join(
                f"- {r['label']} ({r['algorithm']}), batch {r['batch']}, "
                f"lr {r['lr']}, C {r['clip']}, {_regime(r)}"
                for r in result["not_run"]
            )
            + "\n"
        )
    return text


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.privacy_attacks.dp_sweep")
    parser.add_argument("--quick", action="store_true", help="tiny problem, seconds")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="run nothing: write the page from the rows of the partial file",
    )
    args = parser.parse_args(argv)
    out = args.out or (ROOT / "runs" / "dp-sweep-quick" if args.quick else DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m experiments.privacy_attacks.dp_sweep" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:])
    )
    started = time.perf_counter()
    partial = out / "privacy_dp_sweep.partial.json"
    final = out / "privacy_dp_sweep.json"
    source = partial if partial.exists() else final if args.render_only and final.exists() else None
    saved = json.loads(source.read_text()) if source is not None else None
    result = sweep(
        args.quick,
        saved,
        lambda r: atomic_write(partial, json.dumps(r, indent=1)),
        render_only=args.render_only,
    )
    seconds = (
        time.perf_counter()
        - started
        + sum(
            r.get("seconds", 0)
            for part in ("sweep", "algorithms")
            for r in (saved or {}).get(part, [])
        )
    )
    atomic_write(out / "privacy_dp_sweep.md", page(result, command, seconds, args.quick))
    atomic_write(out / "privacy_dp_sweep.json", json.dumps(result, indent=1) + "\n")
    if not result.get("not_run") and partial.exists():
        partial.unlink()
    _log(f"wrote {out / 'privacy_dp_sweep.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
